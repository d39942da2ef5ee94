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
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

func TestE9_SteeringThroughAnotherReplicaReachesTheActiveTurnOnce(t *testing.T) {
	t.Parallel()
	// The turn is held after its first delta ("[stall:mid-stream]") until
	// it was steered through the second replica, however slow the machine.
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("steer", "steer", stalledTurn)
	h.waitForDelta(ctx, h.client, "steer")

	// Ask a replica that does not drive the run: it forwards to the one that does.
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	other := h.clientFor("executor-2")
	state, err := other.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "steer"})
	require.NoError(t, err)
	require.Equal(t, "available", state.GetDisposition())
	require.NotEmpty(t, state.GetActiveTurnId())

	resp, err := other.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "steer", Message: "also mention bananas", CorrelationId: "comment-1"})
	require.NoError(t, err)
	require.Equal(t, state.GetActiveTurnId(), resp.GetTurnId())
	releaseStall(t, dir, "mid-stream")

	run := h.waitState(ctx, h.client, "steer", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "also mention bananas", "the turn answered both inputs")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/steer"), "the provider was steered once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"))

	// After the run ended: nothing to steer, resolve or ask about, and no
	// point in retrying — FailedPrecondition with the run-ended code, not
	// a retryable Unavailable, on every replica.
	h.waitEnded(ctx, "steer")
	for _, c := range []executorv1.ExecutorServiceClient{h.client, other} {
		_, err = c.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "steer", Message: "too late"})
		requireRunEnded(t, err)
		res, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
		_, err = c.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "steer", RequestId: "0", TurnId: resp.GetTurnId(), Resolution: res})
		requireRunEnded(t, err)
		_, err = c.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "steer"})
		requireRunEnded(t, err)
	}
}

// waitEnded waits until no replica drives the run any more (its driver
// let go of its live session after the terminal event).
func (h *harness) waitEnded(ctx context.Context, runID string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		_, err := h.client.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: runID})
		return failure.CodeOf(err) == failure.NativeRunAlreadyTerminal
	}, time.Minute, 20*time.Millisecond)
}

func requireRunEnded(t *testing.T, err error) {
	t.Helper()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.EqualValues(t, failure.NativeRunAlreadyTerminal, failure.CodeOf(err))
	require.Contains(t, status.Convert(err).Message(), "already ended (succeeded)")
}

// awaitRuntimeRequest watches run runID until its first
// runtime_request.created and returns that event's payload.
func (h *harness) awaitRuntimeRequest(ctx context.Context, runID string) map[string]any {
	h.t.Helper()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := h.client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: runID})
	require.NoError(h.t, err)
	for {
		m, err := stream.Recv()
		require.NoError(h.t, err)
		if m.GetEvent().GetEventType() == "runtime_request.created" {
			return m.GetEvent().GetPayload().AsMap()
		}
	}
}

func TestE8_ARuntimeRequestIsResolvedOnceThroughTheExecutor(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// "[shell]" makes the fake ask for a command approval in this turn.
	h.submit("approve", "approve", "[shell] make a directory")
	created := h.awaitRuntimeRequest(ctx, "approve")
	requestID, turnID := created["requestId"].(string), created["turnId"].(string)
	require.NotEmpty(t, turnID)

	accept, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
	decline, _ := structpb.NewStruct(map[string]any{"decision": "decline"})
	// A malformed answer is the caller's error (InvalidArgument), and it
	// settles nothing: the request still takes a valid one.
	maybe, _ := structpb.NewStruct(map[string]any{"decision": "maybe"})
	_, err := h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "approve", RequestId: requestID, TurnId: turnID, Resolution: maybe})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.EqualValues(t, failure.RuntimeRequestResolutionInvalid, failure.CodeOf(err))

	req := &executorv1.ResolveRuntimeRequestRequest{RunId: "approve", RequestId: requestID, TurnId: turnID, Resolution: accept}
	first, err := h.client.ResolveRuntimeRequest(ctx, req)
	require.NoError(t, err)
	require.NotEmpty(t, first.GetCommandId())

	run := h.waitState(ctx, h.client, "approve", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.NotEmpty(t, run.GetResult().GetFinalMessage())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "approval-response:accept"), "answered once")
	// The request is settled: a late answer is refused before any dispatch.
	_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "approve", RequestId: requestID, TurnId: turnID, Resolution: decline})
	require.Error(t, err)
	require.Zero(t, countLines(t, h.st.CallLog(), "approval-response:decline"))
}

// submitWithModel submits a run of the warm session "config" pinning model.
func (h *harness) submitWithModel(ctx context.Context, id, model, prompt string) {
	h.t.Helper()
	in := h.submitInput("config", prompt)
	in.Provider.Model = model
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in})
	require.NoError(h.t, err)
}

// configChange runs three runs of one warm session, the third with another
// model, and checks what holds with or without a backup: one replacement
// provider that resumed the same thread with the whole conversation, and
// one session.closed event with the E10 reason. It returns that event's
// payload and the scope's state root.
func configChange(t *testing.T, h *harness) (map[string]any, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	submit := func(id, model, prompt string) { h.submitWithModel(ctx, id, model, prompt) }
	submit("cfg-1", "model-a", "first turn")
	submit("cfg-2", "model-a", "second turn, same configuration")
	submit("cfg-3", "model-b", "third turn, another model")
	var last []*executorv1.WatchRunResponse
	for _, id := range []string{"cfg-1", "cfg-2", "cfg-3"} {
		last = h.watch(ctx, id, 0, nil)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get(id).GetState(), "%v", h.get(id).GetFailure())
	}
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"), "exactly one replacement provider")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"), "the replacement resumed the same thread")
	require.Contains(t, h.get("cfg-3").GetResult().GetFinalMessage(), "4 earlier messages", "the conversation survived")
	var closed []map[string]any
	for _, m := range last {
		if m.GetEvent().GetEventType() == "session.closed" {
			closed = append(closed, m.GetEvent().GetPayload().AsMap())
		}
	}
	require.Len(t, closed, 1)
	require.Equal(t, "warm native session configuration changed", closed[0]["reason"])
	require.NotEqual(t, h.get("cfg-2").GetRunnerProcess().GetPid(), h.get("cfg-3").GetRunnerProcess().GetPid())
	in := h.submitInput("config", "")
	return closed[0], filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("cfg-3", in))
}

func TestE10_AConfigurationChangeReplacesTheWarmProviderOnceAndKeepsTheConversationThroughTheBackup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	closed, root := configChange(t, h)
	// The old session was suspended and checkpointed; its local state was
	// archived, and the replacement runner was restored from the stamped
	// backup.
	cpID, _ := closed["checkpointId"].(string)
	require.NotEmpty(t, cpID, "the close went through a checkpoint")
	require.Equal(t, "cfg-2", closed["previousRunId"])
	deep, err := h.backupClient().VerifyBackup(context.Background(), &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cpID}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	require.NoError(t, err)
	require.True(t, deep.GetValid(), deep.GetReason())
	require.Equal(t, closed["providerThreadId"], deep.GetCheckpoint().GetManifest().GetProviderSessionIdentity().GetProviderSessionId())
	breaks, err := os.ReadDir(filepath.Join(root, "continuity-breaks"))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "the replaced session's local state was archived, not resumed")
	gwLog, err := os.ReadFile(h.st.LogPath("runnergw"))
	require.NoError(t, err)
	require.Contains(t, string(gwLog), "runner state restored from a stamped checkpoint")
}

func TestE10_WithoutABackupVerifierAConfigurationChangeReplacesTheProviderOnItsLocalState(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{GatewayArgs: []string{"-backup-addr", ""}}, "runnergw", "executor")
	closed, root := configChange(t, h)
	require.Empty(t, closed["checkpointId"])
	_, err := os.Stat(filepath.Join(root, "continuity-breaks"))
	require.True(t, os.IsNotExist(err), "nothing was archived")
}

func TestE10_ABackupFailureDuringAConfigurationChangeFailsTheAttemptVisiblyAndTheRetryGoesThroughTheBackup(t *testing.T) {
	t.Parallel()
	// The gateway reaches the verifier through a proxy the test turns
	// off and on at once: the verifier is back well within the retry
	// delay, however loaded the machine (a restarted verifier took 6 s
	// at load 25, after both retries had failed).
	h := newHarnessWith(t, stack.Options{ExecutorArgs: []string{"-retry-delay", "2s"}}, "backup-verifier")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	verifier := newTCPProxy(t, h.st.Addr("backup-verifier"))
	h.st.SetExtraArgs("runnergw", "-backup-addr", verifier.addr())
	for _, p := range []string{"runnergw", "executor"} {
		_, err := h.st.Start(ctx, p)
		require.NoError(t, err)
	}
	h.client = h.clientFor("executor")
	submit := func(id, model, prompt string) { h.submitWithModel(ctx, id, model, prompt) }
	submit("bf-1", "model-a", "first turn")
	h.watch(ctx, "bf-1", 0, nil)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("bf-1").GetState())

	// The verifier is unreachable when the next run changes the model.
	verifier.setOff(true)
	submit("bf-2", "model-b", "second turn, another model")
	db := h.store()
	var failed map[string]any
	require.Eventually(t, func() bool {
		evs, err := db.EventsAfter(ctx, "bf-2", 0, 100)
		require.NoError(t, err)
		for _, e := range evs {
			if e.Event.GetEventType() == "session.close_failed" {
				failed = e.Event.GetPayload().AsMap()
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "the failed close is on record")
	require.Equal(t, "warm native session configuration changed", failed["reason"])
	require.Equal(t, "runner_harness_backup_unavailable", failed["code"])
	require.Equal(t, "bf-1", failed["previousRunId"])
	verifier.setOff(false)

	evs := h.watch(ctx, "bf-2", 0, nil)
	run := h.get("bf-2")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.GreaterOrEqual(t, run.GetAttempt(), uint64(2), "the failed close ended an attempt")
	retries := eventsOf(evs, "run.retry_scheduled")
	require.NotEmpty(t, retries)
	require.Equal(t, "native_session_interrupted", retries[0]["code"])
	require.Contains(t, retries[0]["message"], "warm_session_close_backup_failed")
	require.Contains(t, retries[0]["message"], "runner_harness_backup_unavailable")
	closed := eventsOf(evs, "session.closed")
	require.Len(t, closed, 1, "the session was closed once, through the backup")
	require.NotEmpty(t, closed[0]["checkpointId"])
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"), "exactly one replacement provider")
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages", "the conversation survived")
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("bf-2", h.submitInput("config", "")))
	breaks, err := os.ReadDir(filepath.Join(root, "continuity-breaks"))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "the replaced session's local state was archived once")
}

func TestE10_EqualSessionIDsInDifferentCompaniesGetTwoRootsAndTwoProcesses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, company := range []string{"acme", "globex"} {
		in := h.submitInput("shared-session", "hello from "+company)
		in.Binding.CompanyId = company
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "run-" + company, Input: in})
		require.NoError(t, err)
	}
	a, b := h.watch(ctx, "run-acme", 0, nil), h.watch(ctx, "run-globex", 0, nil)
	require.NotEmpty(t, a)
	require.NotEmpty(t, b)
	ra, rb := h.get("run-acme"), h.get("run-globex")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, ra.GetState())
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, rb.GetState())
	require.NotEqual(t, ra.GetRunnerInstanceId(), rb.GetRunnerInstanceId())
	require.NotEqual(t, ra.GetRunnerProcess().GetPid(), rb.GetRunnerProcess().GetPid())
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))
	// Neither conversation sees the other: both are first turns.
	require.Contains(t, ra.GetResult().GetFinalMessage(), "0 earlier messages")
	require.Contains(t, rb.GetResult().GetFinalMessage(), "0 earlier messages")
	roots, err := os.ReadDir(h.st.RunnerStateRoot())
	require.NoError(t, err)
	dirs := 0
	for _, r := range roots {
		if r.IsDir() {
			dirs++
		}
	}
	require.Equal(t, 2, dirs, "two state roots")
}

func TestE13_ARunRacingAnotherInTheSameScopeIsBusyAndStartsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw := h.gatewayClient()
	in := h.submitInput("busy", "x")
	open := func(run string) (gatewayv1.RunnerGateway_AttachClient, error) {
		s, err := gw.Attach(ctx)
		if err != nil {
			return nil, err
		}
		return s, s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
			RunId: run, Fence: &gatewayv1.FencingToken{Owner: "tester", Attempt: 1}, Input: in,
		}}})
	}
	first, err := open("busy-1")
	require.NoError(t, err)
	m, err := first.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetOpened())
	second, err := open("busy-2")
	require.NoError(t, err)
	_, err = second.Recv()
	require.EqualValues(t, "native_session_supervisor_busy", failure.CodeOf(err))
	require.Zero(t, countLines(t, h.st.CallLog(), "turn/start"), "nothing was started")
}

func TestE10_GetSessionAndCloseSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("sess-1", "inspect", "first")
	h.watch(ctx, "sess-1", 0, nil)
	resp, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "inspect"})
	require.NoError(t, err)
	require.Len(t, resp.GetSessions(), 1)
	s := resp.GetSessions()[0]
	require.Equal(t, "sess-1", s.GetLastRunId())
	require.Empty(t, s.GetActiveRunId())
	require.True(t, s.GetRunnerConnected())
	require.Equal(t, "ready", s.GetLifecycle())
	require.Positive(t, s.GetRunnerProcess().GetPid())
	require.Positive(t, s.GetProviderProcess().GetPid())

	closed, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "inspect", Reason: "operator"})
	require.NoError(t, err)
	require.Equal(t, []string{s.GetRunnerInstanceId()}, closed.GetClosedRunnerInstanceIds())
	require.Eventually(t, func() bool {
		r, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "inspect"})
		return err == nil && !r.GetSessions()[0].GetRunnerConnected()
	}, 20*time.Second, 100*time.Millisecond, "the runner went away")
	// Gone, and said so: neither GetSession nor ListRunners shows it ready
	// with the pids of processes that ended.
	after, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "inspect"})
	require.NoError(t, err)
	require.Equal(t, "exited", after.GetSessions()[0].GetLifecycle())
	runners, err := h.gatewayClient().ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	require.Len(t, runners.GetRunners(), 1)
	require.Equal(t, "exited", runners.GetRunners()[0].GetLifecycle())
	require.False(t, runners.GetRunners()[0].GetConnected())

	// The next run resumes the same provider thread in a new process.
	h.submit("sess-2", "inspect", "second")
	h.watch(ctx, "sess-2", 0, nil)
	require.Contains(t, h.get("sess-2").GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))

	_, err = h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "globex", NormalizedSessionId: "inspect"})
	require.EqualValues(t, "session_not_found", failure.CodeOf(err))
}

func TestE13_ADynamicToolCallIsAnsweredThroughTheRunsToolAuthority(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := h.submitInput("tools", "[dyn] look up alpha")
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}})
	in.DynamicTools = []*prpv1.DynamicTool{{Name: "mock_lookup", Description: "Look up a value by key.", InputSchema: schema}}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "tool-run", Input: in})
	require.NoError(t, err)

	var callID string
	wctx, stop := context.WithCancel(ctx)
	stream, err := h.client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: "tool-run"})
	require.NoError(t, err)
	for callID == "" {
		m, err := stream.Recv()
		require.NoError(t, err)
		if m.GetEvent().GetEventType() == "semantic_tool.input" {
			p := m.GetEvent().GetPayload().AsMap()
			require.Equal(t, "mock_lookup", p["tool"])
			callID, _ = p["callId"].(string)
		}
	}
	stop()
	resp, err := h.client.CompleteToolCall(ctx, &executorv1.CompleteToolCallRequest{RunId: "tool-run", CallId: callID, Success: true, Text: "lookup(alpha) = 42"})
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetCommandId())
	run := h.waitState(ctx, h.client, "tool-run", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "lookup(alpha) = 42")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "tool-response:lookup(alpha) = 42"))

	// The run ended: its tool authority is gone.
	_, err = h.client.CompleteToolCall(ctx, &executorv1.CompleteToolCallRequest{RunId: "tool-run", CallId: callID, Success: true, Text: "again"})
	require.EqualValues(t, "native_tool_authority_epoch_revoked", failure.CodeOf(err))
}
