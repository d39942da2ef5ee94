package grpcx

import (
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc/stats"
)

// registerGatewayMethod is the gateways' announcement and heartbeat, sent
// every third of the executors' -gateway-ttl by every gateway.
const registerGatewayMethod = "/tether.executor.v1.GatewayRegistry/RegisterGateway"

// Traced decides which calls get spans, on servers and clients alike: not
// health checks (every probe of every container) and not the gateways'
// heartbeats, which were 97 % of a compose stack's spans and belong to no
// run (SPEC D6). Their latency and errors stay in the gRPC metrics.
func Traced(info *stats.RPCTagInfo) bool {
	return filters.None(filters.HealthCheck(), filters.FullMethodName(registerGatewayMethod))(info)
}
