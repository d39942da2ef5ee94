package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// The grant replay on a real stack: a grant presented a second
// time, and a grant the fleet's key signed while a run was live presented
// after the run ended (and again), are refused gateway_grant_invalid by the
// real gateway; no turn starts, and the session's next genuine run
// succeeds once with the audit clean.
func TestT4_Stack_AReplayedOrPostTerminalGrantStartsNoTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key, err := grant.LoadSigningKey(h.st.GrantKeyFile())
	require.NoError(t, err)
	signer := grant.NewSigner(key, 0, nil)
	conn, err := grpcx.Dial(h.st.Addr("runnergw"), "")
	require.NoError(t, err)
	defer conn.Close()
	raw := gatewayv1.NewRunnerGatewayClient(conn)
	attach := func(tok string, open *gatewayv1.Open) error {
		s, err := raw.Attach(metadata.AppendToOutgoingContext(ctx, grant.Header, tok))
		require.NoError(t, err)
		if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil && err != io.EOF {
			return err
		}
		_, err = s.Recv()
		_ = s.CloseSend()
		return err
	}
	refused := func(err error, why string) {
		t.Helper()
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		require.EqualValues(t, failure.GatewayGrantInvalid, failure.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), why)
	}

	h.submit("g-1", "victim", "hello")
	h.requireOneTerminal(ctx, "g-1")
	first := h.get("g-1")
	open := &gatewayv1.Open{RunId: "g-1", Input: first.GetInput(),
		Fence: &gatewayv1.FencingToken{Owner: first.GetLeaseOwner(), Attempt: first.GetAttempt()}}
	claims := grant.ClaimsForOpen(open)
	claims.Audience = stack.GatewayID
	kept, err := signer.Sign(claims) // minted while g-1 ran, never presented
	require.NoError(t, err)
	// A grant the executor used, replayed: refused.
	used, err := signer.Sign(grant.Claims{Method: grant.MethodListRunners, Audience: stack.GatewayID})
	require.NoError(t, err)
	_, err = raw.ListRunners(metadata.AppendToOutgoingContext(ctx, grant.Header, used), &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	_, err = raw.ListRunners(metadata.AppendToOutgoingContext(ctx, grant.Header, used), &gatewayv1.ListRunnersRequest{})
	refused(err, "already used")

	h.submit("g-2", "victim", "the next turn")
	h.requireOneTerminal(ctx, "g-2")
	turns := countLines(t, h.st.CallLog(), "turn/start")
	refused(attach(kept, open), "ended")
	refused(attach(kept, open), "already used")
	require.Equal(t, turns, countLines(t, h.st.CallLog(), "turn/start"), "no turn started")

	h.submit("g-3", "victim", "and the next")
	h.requireOneTerminal(ctx, "g-3")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("g-3").GetState())
	require.Equal(t, turns+1, countLines(t, h.st.CallLog(), "turn/start"))
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}
