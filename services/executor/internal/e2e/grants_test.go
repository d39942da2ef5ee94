package e2e

import (
	"context"
	"io"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestS1_AForgedAttachThroughTheStackIsRefusedAndTheRealRunSucceeds is
// issue 12's attack against the running stack: a caller with a network
// path to the gateway but no grant sends the fence-poisoning Attach of
// victim-1 (owner evil, attempt 2^64-1) and a forged run. Both are refused
// gateway_grant_invalid before anything is fenced or launched, and the
// real SubmitRun victim-1 then succeeds at attempt 1 on the only runner
// and provider process.
func TestS1_AForgedAttachThroughTheStackIsRefusedAndTheRealRunSucceeds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := grpcx.Dial(h.st.Addr("runnergw"), "")
	require.NoError(t, err)
	defer conn.Close()
	attacker := gatewayv1.NewRunnerGatewayClient(conn)
	in := h.submitInput("victim", "the genuine prompt")
	for _, open := range []*gatewayv1.Open{
		// The grpcurl request, as is (no input).
		{RunId: "victim-1", Fence: &gatewayv1.FencingToken{Owner: "evil", Attempt: math.MaxUint64}},
		{RunId: "victim-1", Fence: &gatewayv1.FencingToken{Owner: "evil", Attempt: math.MaxUint64}, Input: in},
		{RunId: "victim-1", Fence: &gatewayv1.FencingToken{Owner: "evil", Attempt: 1}, Input: in},
	} {
		s, err := attacker.Attach(ctx)
		require.NoError(t, err)
		if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil {
			require.ErrorIs(t, err, io.EOF, "refused before the Open was read")
		}
		_, err = s.Recv()
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		require.EqualValues(t, failure.GatewayGrantInvalid, failure.CodeOf(err), "%v", err)
	}
	_, err = attacker.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	require.EqualValues(t, failure.GatewayGrantInvalid, failure.CodeOf(err), "%v", err)
	_, err = os.Stat(h.st.CallLog())
	require.True(t, os.IsNotExist(err), "no provider was started")

	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "victim-1", Input: in})
	require.NoError(t, err)
	h.watch(ctx, "victim-1", 0, nil)
	run := h.get("victim-1")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.EqualValues(t, 1, run.GetAttempt())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "one provider process")
	runners, err := h.gatewayClient().ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	require.Len(t, runners.GetRunners(), 1, "one runner")
}

// TestS2_AStackOnMutualTLSAdmitsEachServiceOnlyItsPeers runs the real
// binaries over mTLS with a development PKI (what `tetherctl certs init`
// writes): a client submits and completes a run through the executor (the
// executor reaches the gateway with its certificate and a grant), while
// the client's certificate is refused by the gateway even with a valid
// grant, and by the backup verifier, which admits the executor.
func TestS2_AStackOnMutualTLSAdmitsEachServiceOnlyItsPeers(t *testing.T) {
	t.Parallel()
	// The turn is held after its first delta ("[stall:mid-stream]") until
	// a second executor started and forwarded its call, however slow the
	// machine (slow deltas that must outlast that start ended first at
	// load 50: the forwarded call found the run over).
	dir := t.TempDir()
	h := newHarness(t, stack.Options{MTLS: true, FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(service, role string) *grpc.ClientConn {
		conn, err := h.st.DialAs(h.st.Addr(service), role)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	client := executorv1.NewExecutorServiceClient(dial("executor", stack.Operator))
	_, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "mtls-1", Input: h.submitInput("mtls", stalledTurn)})
	require.NoError(t, err)
	h.waitForDelta(ctx, client, "mtls-1")
	// Another replica forwards a live-session call to the driving one,
	// over mTLS with its own certificate.
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err = h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	state, err := executorv1.NewExecutorServiceClient(dial("executor-2", stack.Operator)).GetSteeringState(ctx,
		&executorv1.GetSteeringStateRequest{RunId: "mtls-1"})
	require.NoError(t, err)
	require.Equal(t, "available", state.GetDisposition(), "forwarded to the driving replica")
	releaseStall(t, dir, "mid-stream")
	waitSucceeded(ctx, t, client, "mtls-1")

	for _, role := range []string{identity.Client, identity.BackupVerifier} {
		gw, err := h.st.GatewayClient(dial("runnergw", role))
		require.NoError(t, err)
		_, err = gw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", role, err)
		require.EqualValues(t, failure.PeerNotAuthorized, failure.CodeOf(err))
	}
	gw, err := h.st.GatewayClient(dial("runnergw", identity.Executor))
	require.NoError(t, err)
	runners, err := gw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	require.Len(t, runners.GetRunners(), 1)

	stamp := &backupv1.VerifyStampRequest{Stamp: &backupv1.Stamp{LeaseId: "lease-x"}, LeaseId: "lease-x"}
	_, err = backupv1.NewBackupVerifierClient(dial("backup-verifier", identity.Client)).VerifyStamp(ctx, stamp)
	require.EqualValues(t, failure.PeerNotAuthorized, failure.CodeOf(err), "%v", err)
	_, err = backupv1.NewBackupVerifierClient(dial("backup-verifier", identity.Executor)).VerifyStamp(ctx, stamp)
	require.NotEqualValues(t, failure.PeerNotAuthorized, failure.CodeOf(err), "the executor is admitted: %v", err)
}

// waitSucceeded watches a run to its end and requires it succeeded.
func waitSucceeded(ctx context.Context, t *testing.T, c executorv1.ExecutorServiceClient, runID string) {
	t.Helper()
	stream, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: runID})
	require.NoError(t, err)
	for {
		if _, err := stream.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	resp, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: runID})
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, resp.GetRun().GetState(), "%v", resp.GetRun().GetFailure())
}
