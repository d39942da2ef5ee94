module github.com/tether-run/tether/services/runnergw

go 1.26.0

require github.com/tether-run/tether/pkg v0.0.0

require github.com/coder/websocket v1.8.15 // indirect

replace github.com/tether-run/tether/pkg => ../../pkg
