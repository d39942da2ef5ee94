module github.com/tether-run/tether/services/runnerd

go 1.26

require (
	github.com/stretchr/testify v1.12.1
	github.com/tether-run/tether/pkg v0.0.0
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.6 // indirect

replace github.com/tether-run/tether/pkg => ../../pkg
