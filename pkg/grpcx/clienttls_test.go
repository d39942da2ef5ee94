package grpcx

import (
	"flag"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/devpki"
	"github.com/tether-run/tether/pkg/envflag"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/identity"
)

func TestF6_ClientTransportIsTLSOffLoopbackUnlessPlaintextIsExplicit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      ClientTLS
		target string
		want   transport
	}{
		{"loopback, nothing configured", ClientTLS{}, "127.0.0.1:7401", transportPlaintext},
		{"loopback with only the service's own certificate", ClientTLS{CertFile: "c", KeyFile: "k"}, "localhost:7401", transportPlaintext},
		{"loopback with a CA", ClientTLS{CAFile: "ca"}, "127.0.0.1:7401", transportTLS},
		{"loopback with a server name", ClientTLS{ServerName: "runnergw"}, "127.0.0.1:7401", transportTLS},
		{"off loopback, nothing configured: system roots", ClientTLS{}, "10.0.0.7:7401", transportTLS},
		{"off loopback, explicit plaintext", ClientTLS{InsecurePlaintext: true}, "10.0.0.7:7401", transportPlaintext},
		{"off loopback, a CA wins over plaintext", ClientTLS{CAFile: "ca", InsecurePlaintext: true}, "gw.example:7401", transportTLS},
	} {
		require.Equal(t, tc.want, tc.c.transportFor(tc.target), tc.name)
	}
}

// getRunWith calls GetRun at target dialed with c.
func getRunWith(t *testing.T, c ClientTLS, target string) error {
	t.Helper()
	conn, err := c.Dial(target)
	require.NoError(t, err)
	defer conn.Close()
	_, err = executorv1.NewExecutorServiceClient(conn).GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "r"})
	return err
}

func TestF6_ClientTLSPresentsItsCertificateAndVerifiesTheServerName(t *testing.T) {
	dir := devPKI(t)
	ca := filepath.Join(dir, devpki.CAFile)
	target, _ := startAs(t, dir, identity.Executor)
	call := func(c ClientTLS) error { return getRunWith(t, c, target) }
	me := ClientTLS{CAFile: ca, CertFile: devpki.CertFile(dir, identity.Executor), KeyFile: devpki.KeyFile(dir, identity.Executor)}
	require.NoError(t, call(me))
	named := me
	named.ServerName = identity.Executor // a pod IP advertised, the role name verified
	require.NoError(t, call(named))
	named.ServerName = identity.Gateway
	require.Equal(t, codes.Unavailable, status.Code(call(named)), "the certificate does not carry that name")
	anonymous := ClientTLS{CAFile: ca}
	require.Equal(t, codes.Unavailable, status.Code(call(anonymous)), "no client certificate, no mTLS handshake")
	_, err := ClientTLS{CAFile: ca, CertFile: "only-a-cert.pem"}.Dial(target)
	require.ErrorContains(t, err, "needs its key")

	// The identity defaults to the service's own certificate.
	fs := flag.NewFlagSet("executor", flag.ContinueOnError)
	cfg := RegisterFlags(fs, "executor", "127.0.0.1:0", "")
	gw := RegisterClientTLSFlags(fs, "gateway", "the runner gateways")
	require.NoError(t, envflag.Parse(fs, []string{"-tls-cert", me.CertFile, "-tls-key", me.KeyFile, "-gateway-ca", ca,
		"-gateway-server-name", identity.Executor}))
	require.NoError(t, call(gw.WithDefaults(cfg, "")))
}

// nonLoopbackIP is an address of this host off loopback, or "".
func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

func TestF6_APlaintextPeerOffLoopbackIsReachedOnlyWithTheExplicitFlag(t *testing.T) {
	ip := nonLoopbackIP(t)
	if ip == "" {
		t.Skip("this host has no address off loopback")
	}
	h := startServer(t, func(c *Config) { c.GRPCAddr = "0.0.0.0:0"; c.AllowPlaintext = true })
	_, port, _ := net.SplitHostPort(h.srv.Addr().String())
	target := net.JoinHostPort(ip, port)
	call := func(c ClientTLS) error { return getRunWith(t, c, target) }
	require.Equal(t, codes.Unavailable, status.Code(call(ClientTLS{})), "off loopback the default is TLS")
	require.NoError(t, call(ClientTLS{InsecurePlaintext: true}))
}
