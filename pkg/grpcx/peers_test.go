package grpcx

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/devpki"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/identity"
)

// devPKI writes a development PKI (what `tetherctl certs init` writes).
func devPKI(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	require.NoError(t, devpki.InitDev(dir, []string{"tether.example", "10.0.0.7"}, 0))
	return dir
}

// startAs serves the test services over mTLS off loopback as role,
// admitting allowed peers, and returns a target and a dialer for callers.
func startAs(t *testing.T, dir, role string, allowed ...string) (string, func(caller string) *Config) {
	t.Helper()
	h := startServer(t, func(c *Config) {
		c.GRPCAddr = "0.0.0.0:0"
		c.TLSCertFile, c.TLSKeyFile = devpki.CertFile(dir, role), devpki.KeyFile(dir, role)
		c.TLSClientCAFile = filepath.Join(dir, devpki.CAFile)
		c.AllowedPeers = allowed
	})
	_, port, _ := net.SplitHostPort(h.srv.Addr().String())
	return net.JoinHostPort("127.0.0.1", port), func(caller string) *Config {
		return &Config{Name: caller, TLSCertFile: devpki.CertFile(dir, caller), TLSKeyFile: devpki.KeyFile(dir, caller)}
	}
}

func TestS2_CertsInitWritesAPrivateCAServiceIdentitiesAndTheGrantKeyPair(t *testing.T) {
	dir := devPKI(t)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2+2*len(identity.Roles)+2+1) // CA, roles, grant pair, secrets key
	for _, e := range entries {
		fi, err := e.Info()
		require.NoError(t, err)
		require.True(t, fi.Mode().IsRegular(), e.Name())
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), e.Name())
	}
	caPool := x509.NewCertPool()
	b, err := os.ReadFile(filepath.Join(dir, devpki.CAFile))
	require.NoError(t, err)
	require.True(t, caPool.AppendCertsFromPEM(b))
	for _, role := range identity.Roles {
		b, err := os.ReadFile(devpki.CertFile(dir, role))
		require.NoError(t, err)
		blk, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(blk.Bytes)
		require.NoError(t, err)
		require.Equal(t, []string{role}, identity.RolesOf(cert))
		require.Equal(t, "spiffe://tether/"+role, cert.URIs[0].String())
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			_, err = cert.Verify(x509.VerifyOptions{Roots: caPool, DNSName: "tether.example", KeyUsages: []x509.ExtKeyUsage{usage}})
			require.NoError(t, err, role)
		}
		require.NoError(t, cert.VerifyHostname("10.0.0.7"))
		require.NoError(t, cert.VerifyHostname(role))
	}
	key, err := grant.LoadSigningKey(filepath.Join(dir, devpki.GrantKeyFile))
	require.NoError(t, err)
	pubs, err := grant.LoadPublicKeys(filepath.Join(dir, devpki.GrantPublicKey))
	require.NoError(t, err)
	require.Equal(t, key.Public(), pubs[0])
	require.ErrorContains(t, devpki.InitDev(dir, nil, 0), "already holds a CA", "an existing PKI is never overwritten")
}

// TestS2_OnlyExecutorsMayCallAGateway: a gateway (allowed peers: executor)
// serves the executor's identity only; a client's or another service's
// certificate from the same CA is PermissionDenied peer_not_authorized,
// health stays open to every admitted peer, and a caller without a
// certificate does not get through the handshake.
func TestS2_OnlyExecutorsMayCallAGateway(t *testing.T) {
	dir := devPKI(t)
	target, as := startAs(t, dir, identity.Gateway, identity.Executor)
	ca := filepath.Join(dir, devpki.CAFile)
	call := func(caller string) error {
		conn, err := as(caller).DialPeer(target, ca)
		require.NoError(t, err)
		defer conn.Close()
		_, err = executorv1.NewExecutorServiceClient(conn).GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "r"})
		if err == nil {
			_, err = healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
		}
		return err
	}
	require.NoError(t, call(identity.Executor))
	for _, caller := range []string{identity.Client, identity.Gateway, identity.BackupVerifier} {
		err := call(caller)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", caller, err)
		require.EqualValues(t, failure.PeerNotAuthorized, failure.CodeOf(err))
		require.Contains(t, err.Error(), "spiffe://tether/"+caller)

		conn, err := as(caller).DialPeer(target, ca)
		require.NoError(t, err)
		resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
		require.NoError(t, err, "health is open to %s", caller)
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
		conn.Close()
	}
	anonymous, err := Dial(target, ca)
	require.NoError(t, err)
	defer anonymous.Close()
	_, err = executorv1.NewExecutorServiceClient(anonymous).GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "r"})
	require.Equal(t, codes.Unavailable, status.Code(err), "no client certificate, no handshake: %v", err)
}

// TestS2_TheBackupVerifierAdmitsGatewaysAndExecutorsAndTheExecutorAnyClient.
func TestS2_TheBackupVerifierAdmitsGatewaysAndExecutorsAndTheExecutorAnyClient(t *testing.T) {
	dir := devPKI(t)
	ca := filepath.Join(dir, devpki.CAFile)
	backup, as := startAs(t, dir, identity.BackupVerifier, identity.Executor, identity.Gateway)
	for caller, want := range map[string]codes.Code{identity.Executor: codes.OK, identity.Gateway: codes.OK,
		identity.Client: codes.PermissionDenied, identity.BackupVerifier: codes.PermissionDenied} {
		conn, err := as(caller).DialPeer(backup, ca)
		require.NoError(t, err)
		_, err = backupv1.NewBackupVerifierClient(conn).VerifyStamp(ctxT(t), validRequest("lease-1"))
		require.Equal(t, want, status.Code(err), "%s: %v", caller, err)
		conn.Close()
	}
	executor, as := startAs(t, dir, identity.Executor) // no allowed peers: any identity of the CA
	for _, caller := range identity.Roles {
		conn, err := as(caller).DialPeer(executor, ca)
		require.NoError(t, err)
		_, err = executorv1.NewExecutorServiceClient(conn).GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "r"})
		require.NoError(t, err, caller)
		conn.Close()
	}
}

// TestS2_AServiceThatAdmitsOnlySomePeersNeedsClientCertificates: TLS
// without -tls-client-ca could not know its peers, so it does not start;
// plaintext loopback development has no identities and admits everyone.
func TestS2_AServiceThatAdmitsOnlySomePeersNeedsClientCertificates(t *testing.T) {
	dir := devPKI(t)
	_, err := New(Config{Name: "runnergw", GRPCAddr: "127.0.0.1:0", AllowedPeers: []string{identity.Executor},
		TLSCertFile: devpki.CertFile(dir, identity.Gateway), TLSKeyFile: devpki.KeyFile(dir, identity.Gateway)})
	require.ErrorContains(t, err, "-tls-client-ca")
	h := startServer(t, func(c *Config) { c.AllowedPeers = []string{identity.Executor} })
	_, err = executorv1.NewExecutorServiceClient(h.conn).GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "r"})
	require.NoError(t, err)
}
