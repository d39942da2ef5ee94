package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// plainRegistry is a GatewayRegistry client without any identity: what
// anyone on the host can dial on a loopback stack.
func (h *harness) plainRegistry() executorv1.GatewayRegistryClient {
	h.t.Helper()
	conn, err := grpcx.Dial(h.st.Addr("executor"), "")
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return executorv1.NewGatewayRegistryClient(conn)
}

// The hijack on a loopback stack: one RegisterGateway with id
// runnergw and another address, without the registration secret, is
// refused (gateway_registration_unauthenticated) and registers nothing; the
// session keeps running on the real gateway, once, audit clean.
func TestT5_AnUnauthenticatedRegistrationCannotRerouteASession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("before", "victim", "hello")
	h.requireOneTerminal(ctx, "before")

	rogue := &executorv1.RegisterGatewayRequest{GatewayId: stack.GatewayID, Address: "127.0.0.1:1", Capacity: 100}
	for name, c := range map[string]context.Context{
		"no proof":    ctx,
		"wrong proof": identity.WithRegistrationProof(ctx, []byte("not-the-stack's-registration-secret")),
	} {
		_, err := h.plainRegistry().RegisterGateway(c, rogue)
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", name, err)
		require.EqualValues(t, failure.GatewayRegistrationUnauthenticated, failure.CodeOf(err), name)
		// Heartbeats are the same call: refused alike.
		rogue.Sessions = 1
	}
	require.Empty(t, h.gateways(ctx), "the rogue registered")

	h.submit("after", "victim", "hello again")
	h.requireOneTerminal(ctx, "after")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("after").GetState(), "%v", h.get("after").GetFailure())
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}

// A gateway started with the stack's registration secret registers and
// heartbeats (zero configuration: the stack generated the secret); a
// registration proving the secret but naming the live gateway's id at
// another address is gateway_id_conflict and changes nothing.
func TestT5_TheGeneratedSecretRegistersAGatewayAndALiveRegistrationCannotBeTakenOver(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{ExecutorArgs: []string{"-gateway-ttl", "6s"}}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.st.SetExtraArgs("runnergw", h.st.RegistryArgs("executor")...)
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	fi, err := os.Stat(h.st.RegistrationSecretFile())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Equal(t, h.st.Addr("runnergw"), h.gateways(ctx)[stack.GatewayID].GetAddress())

	secret, err := keyfile.Read(h.st.RegistrationSecretFile())
	require.NoError(t, err)
	_, err = h.plainRegistry().RegisterGateway(identity.WithRegistrationProof(ctx, secret),
		&executorv1.RegisterGatewayRequest{GatewayId: stack.GatewayID, Address: "127.0.0.1:1", Capacity: 100})
	require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
	require.EqualValues(t, failure.GatewayIDConflict, failure.CodeOf(err))
	require.Equal(t, h.st.Addr("runnergw"), h.gateways(ctx)[stack.GatewayID].GetAddress())

	h.submit("placed", "fleet", "hello")
	h.requireOneTerminal(ctx, "placed")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("placed").GetState())
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}

// A gateway holding another registration secret than the executors' is
// refused at its first announcement and does not start.
func TestT5_AGatewayWithAnotherSecretDoesNotStart(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other := filepath.Join(t.TempDir(), "other-registration.key")
	require.NoError(t, h.st.AddGateway("runnergw-2", append(h.st.RegistryArgs("executor"), "-registration-secret-file", other)...))
	_, err := h.st.Start(ctx, "runnergw-2")
	require.Error(t, err)
	require.Contains(t, readFile(t, h.st.LogPath("runnergw-2")), failure.GatewayRegistrationUnauthenticated)
	require.Empty(t, h.gateways(ctx))
}
