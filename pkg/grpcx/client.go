package grpcx

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Dial creates a client connection (grpc.NewClient; it connects lazily) with
// keepalive pings every 30s, the OpenTelemetry stats handler (every call
// carries the caller's trace context; see pkg/telemetry) and no service
// config lookups in DNS (SPEC D5). Transport security:
//   - tlsCAFile set: TLS verified against that CA bundle;
//   - otherwise a loopback target (localhost, 127.0.0.0/8, ::1, unix socket):
//     plaintext;
//   - otherwise TLS verified against the system roots.
//
// opts come after the defaults, so e.g. grpc.WithTransportCredentials with
// ClientTLSConfig (for mTLS client certificates) overrides them.
func Dial(target string, tlsCAFile string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	switch {
	case tlsCAFile != "":
		tc, err := ClientTLSConfig(tlsCAFile, "", "")
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	case isLoopbackTarget(target):
		creds = insecure.NewCredentials()
	default:
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                KeepaliveClientTime,
			Timeout:             KeepaliveClientTimeout,
			PermitWithoutStream: true,
		}),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithFilter(Traced))),
		// No service config from the resolver: the dns resolver would ask
		// for the TXT record _grpc_config.<host> before the first
		// connection, and where nothing answers it (Docker's embedded DNS
		// off-network, air-gapped and many corporate resolvers) every new
		// connection waited ~10 s for that query to time out (SPEC D5).
		// tether configures its channels in code.
		grpc.WithDisableServiceConfig(),
	}
	cc, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("grpcx: dial %s: %w", target, err)
	}
	return cc, nil
}

// ClientTLSConfig builds a client TLS config trusting caFile (system roots
// when empty) and presenting certFile/keyFile when both are set (mTLS).
func ClientTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := loadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("grpcx: client certificate and key must be set together")
	}
	if certFile != "" {
		cert, err := LoadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("grpcx: loading client key pair: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// isLoopbackTarget understands "host:port", "dns:///host:port",
// "passthrough:///host:port" and unix socket targets.
func isLoopbackTarget(target string) bool {
	if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return true
	}
	if u, err := url.Parse(target); err == nil && u.Scheme != "" && u.Opaque == "" && (u.Host != "" || strings.HasPrefix(u.Path, "/")) {
		switch u.Scheme {
		case "dns", "passthrough", "ipv4", "ipv6":
			return IsLoopbackAddr(strings.TrimPrefix(u.Path, "/"))
		}
		return false
	}
	return IsLoopbackAddr(target)
}

// PeerConnectTimeout bounds one connection attempt of PeerConnectParams:
// TCP, TLS and the HTTP/2 preface.
const PeerConnectTimeout = 5 * time.Second

// PeerConnectParams is the dial option for connections to other tether
// processes whose loss must be noticed quickly — the executor's to the
// gateways (SPEC D4, F3): a connection attempt to a host that vanished
// (its address silent, no refusal) gives up after PeerConnectTimeout
// instead of grpc-go's 20 s, so a call fails over and the driver asks the
// placement again; and reconnection backs off to at most 5 s, so a host that
// comes back is reached within seconds, not grpc-go's 2 minutes.
func PeerConnectParams() grpc.DialOption {
	b := backoff.DefaultConfig
	b.MaxDelay = 5 * time.Second
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: b, MinConnectTimeout: PeerConnectTimeout})
}
