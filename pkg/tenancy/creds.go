package tenancy

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// Bearer is a call credential sending a token as
// "authorization: Bearer <token>" (grpc.WithPerRPCCredentials). It does
// not insist on TLS: the dialer decides the transport (plaintext only to
// loopback unless told otherwise, see pkg/grpcx).
type Bearer string

var _ credentials.PerRPCCredentials = Bearer("")

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (Bearer) RequireTransportSecurity() bool { return false }
