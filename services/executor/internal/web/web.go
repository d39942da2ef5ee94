// Package web serves the executor's public API to browsers and plain HTTP
// clients (SPEC U3): the Connect protocol (JSON or binary, unary and
// server streaming over HTTP/1.1 or HTTP/2), gRPC-web and gRPC, on the
// executor's HTTP port (-http-addr).
//
// Every call is transcoded into a call of the executor's own *grpc.Server
// (vanguard's transcoder calling grpc.Server.ServeHTTP), so it runs the
// same handlers behind the same interceptors as a call on the gRPC port:
// validation, authentication (the Authorization header's bearer token, or
// the TLS client certificate the HTTP port verified), the authorization
// rule of the method and company (SPEC T1, T2), forwarding to the replica
// that drives a run, and the mapping of errors to stable codes. Nothing
// here decides who may do what.
package web

import (
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/vanguard"
	"google.golang.org/grpc"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
)

// Services are the services served over HTTP: the public ones, each method
// under the same authorization rule as on the gRPC port. Health and
// reflection stay on the gRPC port.
var Services = []string{executorv1.ExecutorService_ServiceDesc.ServiceName, executorv1.GatewayRegistry_ServiceDesc.ServiceName,
	executorv1.Companies_ServiceDesc.ServiceName}

// Handler serves Services of gs at /<service>/<method> (Connect, gRPC-web
// and gRPC), and the operator console (Console) at /console/.
func Handler(gs *grpc.Server) (http.Handler, error) {
	info := gs.GetServiceInfo()
	services := make([]*vanguard.Service, 0, len(Services))
	for _, name := range Services {
		if _, ok := info[name]; !ok {
			return nil, fmt.Errorf("web: service %s is not registered on the gRPC server", name)
		}
		services = append(services, vanguard.NewService(name, gs))
	}
	t, err := vanguard.NewTranscoder(services,
		vanguard.WithDefaultServiceOptions(
			// The gRPC server decodes binary protobuf only (its codec
			// is forced): JSON is transcoded here.
			vanguard.WithTargetCodecs(vanguard.CodecProto),
			vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
			// The same bound on a request as on the gRPC port.
			vanguard.WithMaxMessageBufferBytes(grpcx.MaxRecvMsgBytes),
		),
		vanguard.WithUnknownHandler(Console()),
	)
	if err != nil {
		return nil, err
	}
	return connectUnaryByDefault(t), nil
}

// connectUnaryByDefault marks a POST of a JSON or binary message to one of
// Services' methods as a Connect unary call (Connect-Protocol-Version: 1)
// when the client did not say so itself: the transcoder would otherwise
// take it for a REST call (of which there are none) and answer 404, and
// curl's plain form (docs/api.md) would need the header.
func connectUnaryByDefault(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Connect-Protocol-Version") == "" && isUnaryContentType(r.Header.Get("Content-Type")) {
			for _, svc := range Services {
				if strings.HasPrefix(r.URL.Path, "/"+svc+"/") {
					r.Header.Set("Connect-Protocol-Version", "1")
					break
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func isUnaryContentType(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(ct)
	return ct == "application/json" || ct == "application/proto"
}
