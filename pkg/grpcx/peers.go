package grpcx

import (
	"context"
	"errors"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/identity"
)

// PeerRoles returns the identity roles (pkg/identity) of the call's peer
// certificate, verified by the server's mTLS handshake; nil without mTLS.
func PeerRoles(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return identity.RolesOf(info.State.VerifiedChains[0][0])
}

// PeerIdentity names the call's caller for an audit record: the identity
// of its verified client certificate (mTLS), else "addr:" and its network
// address, else "unknown".
func PeerIdentity(ctx context.Context) string {
	if roles := PeerRoles(ctx); len(roles) > 0 {
		return identity.URI(roles[0]).String()
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return "addr:" + p.Addr.String()
	}
	return "unknown"
}

// infraMethod reports whether a method belongs to health or reflection,
// which every peer the TLS layer admitted may call (probes, grpcurl list).
func infraMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthgrpc.Health_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// peerCheck admits a call to the service's own API only from a peer whose
// certificate names one of the allowed roles. Without TLS (loopback
// development, or plaintext explicitly allowed) there are no identities and
// every caller is admitted.
type peerCheck struct {
	allowed []string
	secure  bool
}

func (p peerCheck) authorize(ctx context.Context, fullMethod string) error {
	if !p.secure || len(p.allowed) == 0 || infraMethod(fullMethod) {
		return nil
	}
	roles := PeerRoles(ctx)
	for _, r := range roles {
		if slices.Contains(p.allowed, r) {
			return nil
		}
	}
	who := "a peer without a tether identity"
	if len(roles) > 0 {
		who = "peer " + identity.URI(roles[0]).String()
	}
	return failure.New(codes.PermissionDenied, failure.PeerNotAuthorized, "%s may not call %s (allowed: %s)",
		who, fullMethod, strings.Join(p.allowed, ", "))
}

func (p peerCheck) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := p.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (p peerCheck) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := p.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// checkPeersConfig refuses a service that names its allowed peers but
// serves TLS without verifying client certificates: its identities would
// be unknowable.
func checkPeersConfig(cfg Config) error {
	if len(cfg.AllowedPeers) > 0 && cfg.TLSCertFile != "" && cfg.TLSClientCAFile == "" {
		return errors.New("grpcx: " + cfg.Name + " admits only " + strings.Join(cfg.AllowedPeers, ", ") +
			" peers: with -tls-cert, set -tls-client-ca so that client certificates (mTLS) are verified")
	}
	return nil
}

// DialPeer dials another tether service as this one: with caFile, TLS
// verified against it, presenting this service's own certificate
// (-tls-cert/-tls-key) as its client identity (mTLS); otherwise as Dial.
func (c *Config) DialPeer(target, caFile string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if caFile == "" {
		return Dial(target, "", opts...)
	}
	tc, err := ClientTLSConfig(caFile, c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, err
	}
	return Dial(target, caFile, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, opts...)...)
}
