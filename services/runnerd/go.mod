module github.com/tether-run/tether/services/runnerd

go 1.26

require github.com/tether-run/tether/pkg v0.0.0

replace github.com/tether-run/tether/pkg => ../../pkg
