module github.com/tether-run/tether/services/runnerd

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/stretchr/testify v1.12.1
	github.com/tether-run/tether/pkg v0.0.0
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)

require (
	buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go v1.36.12-20260825204119-511051f7f437.1 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/grpc v1.85.0 // indirect
)

replace github.com/tether-run/tether/pkg => ../../pkg
