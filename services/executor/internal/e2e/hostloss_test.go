package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// Host loss (SPEC F7–F9, R13, issue #30): a gateway's host dies (kill -9
// of the gateway and every runnerd and provider under its state root) and
// later comes back under the same -gateway-id on the same -state-root.

// hostLossFleet starts a fleet of two gateways on two simulated hosts
// ("runnergw" zone=a, "runnergw-2" zone=b) and one executor with a short
// gateway TTL, plus the executor's extra flags.
func hostLossFleet(t *testing.T, opts stack.Options, executorArgs ...string) *harness {
	t.Helper()
	opts.ExecutorArgs = append([]string{"-gateway-ttl", "3s", "-retry-delay", "1s"}, executorArgs...)
	return newFleet(t, opts, []string{"executor"}, map[string][]string{
		"runnergw": {"-capacity", "8", "-labels", "zone=a"}, "runnergw-2": {"-capacity", "8", "-labels", "zone=b"},
	})
}

var zoneA = map[string]string{"zone": "a"}

// loseHost kills the named gateway's host and waits until the executors
// list it lost.
func (h *harness) loseHost(ctx context.Context, name string) {
	h.t.Helper()
	h.killHost(name)
	require.Eventually(h.t, func() bool {
		return h.gateways(ctx)[stack.GatewayIDOf(name)].GetState() == executorv1.GatewayState_GATEWAY_STATE_LOST
	}, time.Minute, 100*time.Millisecond, "the gateway is lost")
}

// waitQueuedReason polls GetRun until the run is queued with reason code.
func (h *harness) waitQueuedReason(ctx context.Context, runID string, code string) *executorv1.Run {
	h.t.Helper()
	for {
		run := h.get(runID)
		if run.GetState() == executorv1.RunState_RUN_STATE_QUEUED && run.GetQueuedReason().GetCode() == code {
			return run
		}
		require.NotEqual(h.t, executorv1.RunState_RUN_STATE_FAILED, run.GetState(), "%s failed: %v", runID, run.GetFailure())
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s: want queued with %s, have %s %v", runID, code, run.GetState(), run.GetQueuedReason())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// requireAuditClean runs tetherctl audit over the stack's durable history:
// every turn command executed at most once, contiguous events, one
// terminal per run (SPEC A, R13).
func (h *harness) requireAuditClean() {
	h.t.Helper()
	rep, code := auditStack(h.t, h.dsn)
	require.Zero(h.t, code, "%+v", rep.Violations)
	require.Empty(h.t, rep.Violations)
}

// TestF7_QueuedRunsOfASessionOnALostHostWaitVisiblyAndContinueTheThreadWhenItReturns:
// a warm session whose thread is only on its host's disk (no verified
// checkpoint) and whose host dies. Before, its next run failed closed
// (runner_harness_state_mismatch) and so did every queued one. Now each
// waits, queued with waiting_for_gateway naming the gateway and since when
// (GetRun, ListRuns), spending no attempt; when the host comes back under
// its id and root, they run there in order and continue the same thread;
// the audit is clean.
func TestF7_QueuedRunsOfASessionOnALostHostWaitVisiblyAndContinueTheThreadWhenItReturns(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "wait-1", "wait", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "wait-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "wait").GetGatewayId())

	h.loseHost(ctx, "runnergw")
	for i := 2; i <= 4; i++ {
		h.submitWith(ctx, fmt.Sprintf("wait-%d", i), "wait", fmt.Sprintf("Turn %d: which word?", i), zoneA, 0)
	}
	waiting := h.waitQueuedReason(ctx, "wait-2", failure.WaitingForGateway)
	msg := waiting.GetQueuedReason().GetMessage()
	require.Contains(t, msg, "gateway "+stack.GatewayIDOf("runnergw")+", lost since ", msg)
	require.Contains(t, msg, "(-gateway-lost-wait 30m0s)", "the default bound")
	require.Zero(t, waiting.GetAttempt(), "waiting spends no attempt")
	// ListRuns shows the wait too (a listing taken while a claim holds the
	// head run for its moment shows it running: list again).
	require.Eventually(t, func() bool {
		listed, err := h.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
		require.NoError(t, err)
		shown := false
		for _, r := range listed.GetRuns() {
			if r.GetRunId() == "wait-2" {
				shown = r.GetQueuedReason().GetCode() == failure.WaitingForGateway
			}
			require.NotEqual(t, executorv1.RunState_RUN_STATE_FAILED, r.GetState(), r.GetRunId())
		}
		return shown
	}, time.Minute, 20*time.Millisecond, "ListRuns shows the wait")
	// The executor claims the head run again and again meanwhile, and
	// hands it back each time: none fails.
	require.Eventually(t, func() bool {
		return strings.Count(readFile(t, h.st.LogPath("executor")), `"reason":"waiting_for_gateway"`) >= 3
	}, time.Minute, 100*time.Millisecond)
	for i := 2; i <= 4; i++ {
		// The head run shows running for the moment each claim holds it
		// before handing it back; it is never failed and spends no attempt.
		id := fmt.Sprintf("wait-%d", i)
		require.Eventually(t, func() bool {
			run := h.get(id)
			require.NotEqual(t, executorv1.RunState_RUN_STATE_FAILED, run.GetState(), id)
			return run.GetState() == executorv1.RunState_RUN_STATE_QUEUED && run.GetAttempt() == 0
		}, time.Minute, 20*time.Millisecond, id)
	}

	// The host comes back with its id and root: the session continues
	// there, the same thread and runner identity.
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	for i := 2; i <= 4; i++ {
		run := h.waitState(ctx, h.client, fmt.Sprintf("wait-%d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt(), run.GetRunId())
		require.Contains(t, run.GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*(i-1)), run.GetRunId())
		require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId(), run.GetRunId())
		require.Nil(t, run.GetQueuedReason())
	}
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "wait").GetGatewayId())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "one provider thread")
	require.Equal(t, 4, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	h.requireAuditClean()
}

// TestF7_PastTheWaitBoundARunFailsWithAStableReasonAndTheReturnedHostResumesTheSession:
// the policy at the bound (-gateway-lost-wait). A run that waited longer
// fails with gateway_lost_wait_exceeded (nothing started, the scope stays
// on its gateway); the host coming back later resumes the session: its
// next run continues the thread.
func TestF7_PastTheWaitBoundARunFailsWithAStableReasonAndTheReturnedHostResumesTheSession(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{}, "-gateway-lost-wait", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "bound-1", "bound", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "bound-1", executorv1.RunState_RUN_STATE_SUCCEEDED)

	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "bound-2", "bound", "Which word?", zoneA, 0)
	failed := h.waitState(ctx, h.client, "bound-2", executorv1.RunState_RUN_STATE_FAILED)
	require.Equal(t, failure.GatewayLostWaitExceeded, failed.GetFailure().GetCode(), failed.GetFailure().GetMessage())
	require.Contains(t, failed.GetFailure().GetMessage(), "-gateway-lost-wait 2s")
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "bound").GetGatewayId(), "the scope stays where its thread is")

	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	h.submitWith(ctx, "bound-3", "bound", "Which word now?", zoneA, 0)
	run := h.waitState(ctx, h.client, "bound-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages", "the thread continued")
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	h.requireAuditClean()
}

// checkpoint asks for the session's verified checkpoint (a suspension the
// backup verifier stamps) and returns its id.
func (h *harness) checkpoint(ctx context.Context, session string) string {
	h.t.Helper()
	resp, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme",
		NormalizedSessionId: session, Reason: "checkpoint", Suspend: true})
	require.NoError(h.t, err)
	require.Len(h.t, resp.GetCheckpoints(), 1)
	return resp.GetCheckpoints()[0].GetCheckpointId()
}

// continuityBreaks counts the states of scope the named gateway set aside
// for a checkpoint (<state-root>/<scope>/continuity-breaks/) or for a
// session replacement (<state-root>/continuity-breaks/<scope>.*).
func (h *harness) continuityBreaks(gateway, scope string) int {
	h.t.Helper()
	root := h.st.RunnerStateRootOf(gateway)
	n := 0
	if entries, err := os.ReadDir(filepath.Join(root, scope, "continuity-breaks")); err == nil {
		n += len(entries)
	}
	replaced, _ := filepath.Glob(filepath.Join(root, "continuity-breaks", scope+".*"))
	return n + len(replaced)
}

// requireNoOrphanProvider checks that the provider process a replaced or
// resumed root had (pid) is either gone or the one serving the session now.
func requireNoOrphanProvider(t *testing.T, pid int32, current int32) {
	t.Helper()
	if pid == current {
		return
	}
	require.False(t, procid.Exists(int(pid)), "provider %d of the earlier root outlived it (now %d)", pid, current)
}

// TestR13_RunnerdKilledDuringTheFirstTurnAfterACheckpointNeverRunsTheJournaledTurnStartTwice:
// issue #30 point 1. runnerd is killed ~1 s into the first turn after a
// verified checkpoint (turn.start journaled, the provider mid-turn). Before,
// the relaunch judged the live root older than the checkpoint because it
// differed from the checkpoint mark, moved it aside, restored the
// checkpoint and ran the journaled turn.start again (tetherctl audit:
// turn_command_executed_twice), leaving the first provider alive. Now the
// root, which descends from the checkpoint and produced everything the
// executor holds, is resumed: the turn runs once, one provider.
func TestR13_RunnerdKilledDuringTheFirstTurnAfterACheckpointNeverRunsTheJournaledTurnStartTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submit("r13-1", "r13", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "r13-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "r13")

	h.submit("r13-2", "r13", "[stall:mid-stream] Which word did I ask you to remember?")
	h.waitForDelta(ctx, h.client, "r13-2")
	provider := h.get("r13-2").GetProviderProcess().GetPid()
	killRunnerd(t, h, "r13-2")
	releaseStall(t, dir, "mid-stream")
	run := h.waitState(ctx, h.client, "r13-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages", "the thread continued")
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
	h.requireOneTerminal(ctx, "r13-2")
	h.requireAuditClean() // before: turn_command_executed_twice (g0/turn.start executed 2 times)
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	requireNoOrphanProvider(t, provider, h.get("r13-2").GetProviderProcess().GetPid())
	require.Zero(t, h.continuityBreaks("runnergw", h.session(ctx, "r13").GetSessionScope()), "the live root was not moved aside")

	// The session goes on from the same root.
	h.submit("r13-3", "r13", "And now?")
	next := h.waitState(ctx, h.client, "r13-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, next.GetResult().GetFinalMessage(), "4 earlier messages")
	h.requireAuditClean()
}

// TestF8_ATurnInFlightWhenItsHostDiesWaitsAndIsReconciledFromRunnerdsJournalWhenItReturns:
// issue #30 point 2. A session without a verified checkpoint has a turn in
// flight when its host dies; a run is queued behind it. Before, the
// executor failed the run in flight for good (runner_harness_state_mismatch
// once the gateway was lost), and when the host came back the next run
// quarantined the root (prior run … is failed but its runner state is
// not_suspended): every later run failed. Now the run in flight waits
// (waiting_for_gateway, its turn generation kept), so does the one behind
// it; when the host comes back with its root the run is re-attached and
// runnerd reconciles its turn from its journal; both runs succeed on the
// same runner and provider thread, and the audit is clean.
func TestF8_ATurnInFlightWhenItsHostDiesWaitsAndIsReconciledFromRunnerdsJournalWhenItReturns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "fly-1", "fly", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "fly-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.submitWith(ctx, "fly-2", "fly", "[stall:mid-stream] Which word did I ask you to remember?", zoneA, 0)
	h.waitForDelta(ctx, h.client, "fly-2")
	h.submitWith(ctx, "fly-3", "fly", "And after that?", zoneA, 0)

	h.loseHost(ctx, "runnergw")
	waiting := h.waitQueuedReason(ctx, "fly-2", failure.WaitingForGateway)
	require.Contains(t, waiting.GetQueuedReason().GetMessage(), "its turn may be in flight there")
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, h.get("fly-3").GetState())

	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	releaseStall(t, dir, "mid-stream")
	for _, id := range []string{"fly-2", "fly-3"} {
		run := h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId(), id)
		h.requireOneTerminal(ctx, id)
	}
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "the same provider thread")
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "fly").GetGatewayId())
}

// TestF9_FailingBackOntoAnAbandonedRootOfAnotherRunnerRestoresTheCurrentCheckpoint:
// issue #30 point 3. A session leaves gw-a's dead host for gw-b with a
// fresh runner (an operator's replace-session), is checkpointed there; gw-a
// comes back with its disk (the old root, another runner id), then gw-b's
// host dies and the session fails back to gw-a with its current
// checkpoint. Before, gw-a judged the old root by the durable-state rules
// (a prior run whose runner is not suspended): the run failed and the root
// was quarantined, and the session wedged. Now the abandoned root is set
// aside into continuity-breaks/ and the checkpoint restored: the run
// continues gw-b's thread under gw-b's runner identity.
func TestF9_FailingBackOntoAnAbandonedRootOfAnotherRunnerRestoresTheCurrentCheckpoint(t *testing.T) {
	t.Parallel()
	failBackOntoAnAbandonedRoot(t, 1)
}

// TestF9_FailingBackAfterManyTurnsElsewhereStillSetsTheAbandonedRootAside:
// as above, with more turns on gw-b than the Open carries prior runs (16):
// the abandoned root's runner served none of them, and before, gw-a then
// judged the root a foreign identity (quarantined, the run failed, the
// session wedged). The Open's restore names every runner that served the
// scope, so the root is set aside however long ago its runner served.
func TestF9_FailingBackAfterManyTurnsElsewhereStillSetsTheAbandonedRootAside(t *testing.T) {
	t.Parallel()
	failBackOntoAnAbandonedRoot(t, 18)
}

// failBackOntoAnAbandonedRoot moves session "fb" off gw-a's dead host
// (replace-session), runs turnsElsewhere turns on gw-b, checkpoints it,
// brings gw-a back with its old root, kills gw-b's host and checks that
// the next run fails back onto gw-a continuing gw-b's thread.
func failBackOntoAnAbandonedRoot(t *testing.T, turnsElsewhere int) {
	t.Helper()
	h := hostLossFleet(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "fb-1", "fb", "Remember the word tether.", zoneA, 0)
	h.waitState(ctx, h.client, "fb-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.loseHost(ctx, "runnergw")
	h.tetherctl(ctx, "replace-session", "-company", "acme", "-session", "fb", "-by", "alice", "-reason", "host a is down")
	var moved *executorv1.Run
	for i := range turnsElsewhere {
		id := fmt.Sprintf("fb-b%d", i)
		h.submitWith(ctx, id, "fb", "Remember the word rope.", nil, 0)
		moved = h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
	}
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "fb").GetGatewayId())
	h.checkpoint(ctx, "fb")

	_, err := h.st.Start(ctx, "runnergw") // back, with the abandoned root
	require.NoError(t, err)
	h.loseHost(ctx, "runnergw-2")
	h.submitWith(ctx, "fb-3", "fb", "Which word?", nil, 0)
	back := h.waitState(ctx, h.client, "fb-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "fb").GetGatewayId(), "failed back")
	require.Equal(t, moved.GetRunnerInstanceId(), back.GetRunnerInstanceId(), "the checkpoint's runner, not the abandoned root's")
	require.Contains(t, back.GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*turnsElsewhere), "gw-b's thread continued")
	require.Equal(t, 1, h.continuityBreaks("runnergw", h.session(ctx, "fb").GetSessionScope()), "the abandoned root was set aside")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "thread/start"), "the replacement's thread, no third")
	h.submitWith(ctx, "fb-4", "fb", "Again?", nil, 0)
	next := h.waitState(ctx, h.client, "fb-4", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, next.GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*turnsElsewhere+2))
	h.requireAuditClean()
}

// TestR13_RunnerdAndItsGatewayKilledDuringTheFirstTurnAfterACheckpointResumeTheRootAndRunTheTurnOnce:
// as the first R13 case, with the gateway killed too (the provider host
// survives): the restarted gateway finds no live runner, the Open carries
// the checkpoint the run started from, and the root — which descends from
// it and journaled more than the executor holds — is resumed, not set
// aside. The turn runs once; no provider of the root is left behind.
func TestR13_RunnerdAndItsGatewayKilledDuringTheFirstTurnAfterACheckpointResumeTheRootAndRunTheTurnOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submit("r13g-1", "r13g", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "r13g-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "r13g")

	h.submit("r13g-2", "r13g", "[stall:mid-stream] Which word did I ask you to remember?")
	h.waitForDelta(ctx, h.client, "r13g-2")
	provider := h.get("r13g-2").GetProviderProcess().GetPid()
	killRunnerd(t, h, "r13g-2")
	h.st.Proc("runnergw").Kill()
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	releaseStall(t, dir, "mid-stream")
	run := h.waitState(ctx, h.client, "r13g-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
	h.requireOneTerminal(ctx, "r13g-2")
	h.requireAuditClean()
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	requireNoOrphanProvider(t, provider, h.get("r13g-2").GetProviderProcess().GetPid())
	require.Zero(t, h.continuityBreaks("runnergw", h.session(ctx, "r13g").GetSessionScope()), "the live root was not moved aside")
}

// TestF7_OnALostHostACheckpointedSessionMovesAtOnceAndOneWithoutWaitsUntilAnOperatorReplacesIt:
// the policy for two sessions on the same dead host. The one whose
// verified checkpoint covers its newest turn moves at once to another
// gateway and continues its thread there; the one whose thread is only on
// the dead host's disk waits (waiting_for_gateway) instead of failing,
// until an operator's replace-session lets it move (a fresh provider
// session). No run fails.
func TestF7_OnALostHostACheckpointedSessionMovesAtOnceAndOneWithoutWaitsUntilAnOperatorReplacesIt(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "cpd-1", "cpd", "Remember the word tether.", zoneA, 0)
	h.submitWith(ctx, "raw-1", "raw", "Remember the word rope.", zoneA, 0)
	h.waitState(ctx, h.client, "cpd-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.waitState(ctx, h.client, "raw-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "cpd")

	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "cpd-2", "cpd", "Which word?", nil, 0)
	h.submitWith(ctx, "raw-2", "raw", "Which word?", nil, 0)
	moved := h.waitState(ctx, h.client, "cpd-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, moved.GetAttempt())
	require.Contains(t, moved.GetResult().GetFinalMessage(), "2 earlier messages", "the checkpointed thread continued elsewhere")
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "cpd").GetGatewayId())
	h.waitQueuedReason(ctx, "raw-2", failure.WaitingForGateway)
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "raw").GetGatewayId(), "it stays with its thread")

	h.tetherctl(ctx, "replace-session", "-company", "acme", "-session", "raw", "-by", "alice", "-reason", "host a is gone for good")
	fresh := h.waitState(ctx, h.client, "raw-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, fresh.GetAttempt(), "waiting spent no attempt")
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "raw").GetGatewayId())
	require.Equal(t, 3, countLines(t, h.st.CallLog(), "thread/start"), "the replaced session's fresh thread")
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// waitPastLostBound waits until the named gateway has been lost (its last
// heartbeat plus ttl) for longer than bound, and then until the executor
// has handed a waiting run back at least twice more, so a decision made
// past the bound is on record.
func (h *harness) waitPastLostBound(ctx context.Context, name string, ttl, bound time.Duration) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		hb := h.gateways(ctx)[stack.GatewayIDOf(name)].GetLastHeartbeatAt().AsTime()
		return time.Since(hb) > ttl+bound+time.Second
	}, time.Minute, 100*time.Millisecond)
	count := func() int {
		return strings.Count(readFile(h.t, h.st.LogPath("executor")), `"reason":"waiting_for_gateway"`)
	}
	n := count()
	require.Eventually(h.t, func() bool { return count() >= n+2 }, time.Minute, 50*time.Millisecond)
}

// TestF8_ATurnInFlightOnALostHostWaitsPastTheBoundAndIsReconciledWhenItReturns:
// the bound (-gateway-lost-wait 1s here) never fails a run that was in
// flight on the lost host: failing it would leave its turn unsettled on
// that root, which is what quarantined and wedged sessions before. It
// waits on; when the host returns the turn is reconciled from runnerd's
// journal and the session continues.
func TestF8_ATurnInFlightOnALostHostWaitsPastTheBoundAndIsReconciledWhenItReturns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}}, "-gateway-lost-wait", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "past-1", "past", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "past-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.submitWith(ctx, "past-2", "past", "[stall:mid-stream] Which word did I ask you to remember?", zoneA, 0)
	h.waitForDelta(ctx, h.client, "past-2")

	h.loseHost(ctx, "runnergw")
	h.waitQueuedReason(ctx, "past-2", failure.WaitingForGateway)
	h.waitPastLostBound(ctx, "runnergw", 3*time.Second, time.Second)
	waiting := h.waitQueuedReason(ctx, "past-2", failure.WaitingForGateway)
	require.Contains(t, waiting.GetQueuedReason().GetMessage(), "its turn may be in flight there")

	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	releaseStall(t, dir, "mid-stream")
	run := h.waitState(ctx, h.client, "past-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
	h.submitWith(ctx, "past-3", "past", "And now?", zoneA, 0)
	h.waitState(ctx, h.client, "past-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
}

// TestF8_AnExecutorKilledWhileARunWaitsForItsHostLeavesTheWaitToItsSuccessor:
// waiting is durable state, not a driver's loop: the executor is killed -9
// while a run in flight on a dead host waits; a restarted executor takes
// the wait over (the run holds no lease while it waits), and when the host
// returns the turn is reconciled and the run succeeds once.
func TestF8_AnExecutorKilledWhileARunWaitsForItsHostLeavesTheWaitToItsSuccessor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "ek-1", "ek", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "ek-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.submitWith(ctx, "ek-2", "ek", "[stall:mid-stream] Which word did I ask you to remember?", zoneA, 0)
	h.waitForDelta(ctx, h.client, "ek-2")
	h.loseHost(ctx, "runnergw")
	h.waitQueuedReason(ctx, "ek-2", failure.WaitingForGateway)

	h.st.Proc("executor").Kill()
	_, err := h.st.Start(ctx, "executor")
	require.NoError(t, err)
	h.client = h.clientFor("executor")
	_, err = h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	releaseStall(t, dir, "mid-stream")
	run := h.waitState(ctx, h.client, "ek-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
	h.requireOneTerminal(ctx, "ek-2")
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// TestF9_FailingBackOntoAnOlderRootOfTheSameRunnerRestoresTheNewerCheckpoint:
// the order rule for the checkpoint's own runner. A session checkpointed on
// gw-a moves to gw-b when gw-a's host dies, runs there and is checkpointed
// again; gw-a comes back with its root (the same runner identity, marked
// with the first checkpoint), then gw-b's host dies. The session fails back
// to gw-a with the newer checkpoint: gw-a's root is provably older (its
// mark names another checkpoint), so it is set aside and the checkpoint
// restored; the thread has every turn.
func TestF9_FailingBackOntoAnOlderRootOfTheSameRunnerRestoresTheNewerCheckpoint(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "same-1", "same", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "same-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "same")
	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "same-2", "same", "Which word?", nil, 0)
	moved := h.waitState(ctx, h.client, "same-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "same").GetGatewayId())
	require.Equal(t, first.GetRunnerInstanceId(), moved.GetRunnerInstanceId())
	h.checkpoint(ctx, "same")

	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	h.loseHost(ctx, "runnergw-2")
	h.submitWith(ctx, "same-3", "same", "And now?", nil, 0)
	back := h.waitState(ctx, h.client, "same-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "same").GetGatewayId(), "failed back")
	require.Contains(t, back.GetResult().GetFinalMessage(), "4 earlier messages", "every turn, gw-b's too")
	require.Equal(t, 1, h.continuityBreaks("runnergw", h.session(ctx, "same").GetSessionScope()), "the older root was set aside")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// TestF9_ACancelledRunAfterTheOnlyCheckpointStillLetsTheSessionMoveWhenItsHostDies:
// the session's only checkpoint is followed by a run that a runner served
// and that ended without success (cancelled mid-turn here). Before, that
// run made the checkpoint stop counting as restorable, so when the host
// died the session could neither move (no verified checkpoint covered its
// thread) nor run anywhere else: it waited, then failed, with its copy in
// hand. A failed or cancelled turn is not one the thread must keep: the
// next run moves at once to the other gateway, restores the checkpoint
// (without the cancelled turn) and succeeds at its first attempt; the audit
// is clean.
func TestF9_ACancelledRunAfterTheOnlyCheckpointStillLetsTheSessionMoveWhenItsHostDies(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submitWith(ctx, "oc-1", "oc", "Remember the word tether.", zoneA, 0)
	h.waitState(ctx, h.client, "oc-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "oc")

	h.submitWith(ctx, "oc-2", "oc", stalledTurn, zoneA, 0)
	h.waitForDelta(ctx, h.client, "oc-2")
	_, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "oc-2",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "changed my mind", WaitTimeout: durationpb.New(30 * time.Second)})
	require.NoError(t, err)
	cancelled := h.waitState(ctx, h.client, "oc-2", executorv1.RunState_RUN_STATE_CANCELLED)
	require.NotEmpty(t, cancelled.GetRunnerInstanceId(), "a runner served it")

	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "oc-3", "oc", "Which word?", nil, 0)
	moved := h.waitState(ctx, h.client, "oc-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, moved.GetAttempt(), "it moved at once")
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "oc").GetGatewayId())
	require.Equal(t, cancelled.GetRunnerInstanceId(), moved.GetRunnerInstanceId(), "the checkpoint's runner, restored")
	require.Contains(t, moved.GetResult().GetFinalMessage(), "2 earlier messages", "the checkpoint's thread, without the cancelled turn")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "the same thread, resumed")
	h.requireAuditClean()
}

// TestF9_ATurnInFlightThatFailsBackOntoARootStillAtItsCheckpointContinuesAboveTheSeqsItProducedElsewhere:
// the root on gw-a is exactly at checkpoint K (suspended there); gw-a's
// host dies and a run moves to gw-b, restores K and streams part of its
// turn; gw-a comes back and gw-b's host dies mid-turn, so the retry fails
// back onto gw-a. Before, gw-a resumed its root because it was exactly K,
// and its runner reused the source seqs gw-b's copy of the same runner had
// already produced: native_event_replay_conflict on that run and on every
// later run of the session (found by make test's chaos suite). The root is
// now judged by order — the executor holds more from its runner than it
// produced — so K is restored and continues above them; the run succeeds
// at its second attempt and the session goes on, the audit clean.
func TestF9_ATurnInFlightThatFailsBackOntoARootStillAtItsCheckpointContinuesAboveTheSeqsItProducedElsewhere(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submitWith(ctx, "fx-1", "fx", "Remember the word tether.", zoneA, 0)
	h.waitState(ctx, h.client, "fx-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "fx") // gw-a's root is exactly K

	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "fx-2", "fx", stalledTurn, nil, 0)
	h.waitForDelta(ctx, h.client, "fx-2") // on gw-b, restored from K, above K's seqs
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "fx").GetGatewayId())
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	h.loseHost(ctx, "runnergw-2")

	back := h.waitState(ctx, h.client, "fx-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 2, back.GetAttempt())
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "fx").GetGatewayId(), "failed back")
	h.submitWith(ctx, "fx-3", "fx", "Which word?", nil, 0)
	next := h.waitState(ctx, h.client, "fx-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, next.GetResult().GetFinalMessage(), "4 earlier messages", "K's turn and fx-2's")
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// TestR13_AReplacedRootsSurvivingProviderIsStoppedBeforeTheFreshSessionStarts:
// runnerd of a warm session dies between turns while its provider host
// lives on (orphaned, holding the old thread), and an operator replaces the
// session (its host lost it, say). The next run moves the root aside for a
// fresh provider session; the old root's provider must not outlive it — a
// second provider of the same home beside the fresh one — so the gateway
// stops it first. The fresh session starts one thread, each turn runs once
// and the audit is clean (the continuity break is legitimate).
func TestR13_AReplacedRootsSurvivingProviderIsStoppedBeforeTheFreshSessionStarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submit("rp-1", "rp", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "rp-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	provider := first.GetProviderProcess().GetPid()
	require.NotZero(t, provider)
	killRunnerd(t, h, "rp-1")
	require.True(t, procid.Exists(int(provider)), "the provider host outlives its runnerd")

	h.tetherctl(ctx, "replace-session", "-company", "acme", "-session", "rp", "-by", "alice", "-reason", "start over")
	h.submit("rp-2", "rp", "Which word?")
	fresh := h.waitState(ctx, h.client, "rp-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	requireNoOrphanProvider(t, provider, fresh.GetProviderProcess().GetPid())
	require.NotEqual(t, provider, fresh.GetProviderProcess().GetPid(), "a fresh provider")
	require.Contains(t, fresh.GetResult().GetFinalMessage(), "0 earlier messages", "a fresh thread")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "thread/start"))
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	require.Equal(t, 1, h.continuityBreaks("runnergw", h.session(ctx, "rp").GetSessionScope()))
	h.requireAuditClean()
}

// TestR13_ATurnInFlightOnAHostThatDiesWithItsExecutorStartsOnceUnderANewGenerationWhereItMoves:
// a checkpointed session's run starts its turn on gw-a (turn.start
// executed and reported), then its executor and gw-a's host die together.
// The restarted executor takes the run over once gw-a is lost: the scope
// moves to gw-b, which restores the checkpoint the attempt started from —
// a journal without that turn.start. Before, the takeover kept the turn
// generation (a takeover resumes the same turn) and gw-b's runner started
// the same turn command a second time (make test-chaos SEED=1: chaos-0-077
// g0/turn.start executed twice, the audit's exactly-once violation). Now a
// run served on the gateway it moves off gets a new turn generation: the
// turn starts once under each command id, the run succeeds on gw-b, the
// audit is clean.
func TestR13_ATurnInFlightOnAHostThatDiesWithItsExecutorStartsOnceUnderANewGenerationWhereItMoves(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submitWith(ctx, "fg-1", "fg", "Remember the word tether.", zoneA, 0)
	h.waitState(ctx, h.client, "fg-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.checkpoint(ctx, "fg")
	h.submitWith(ctx, "fg-2", "fg", stalledTurn, nil, 0)
	h.waitForDelta(ctx, h.client, "fg-2") // its turn.start executed on gw-a, reported and stored
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "fg").GetGatewayId())

	h.st.Proc("executor").Kill()
	<-h.st.Proc("executor").Done()
	h.killHost("runnergw")
	for {
		var lost bool
		require.NoError(t, h.store().Pool().QueryRow(ctx, `SELECT heartbeat_at < now() - interval '3 seconds' FROM executor.gateways WHERE gateway_id = $1`,
			stack.GatewayIDOf("runnergw")).Scan(&lost))
		if lost {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("gw-a is not lost")
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, err := h.st.Start(ctx, "executor")
	require.NoError(t, err)
	client := h.clientFor("executor")
	moved := h.waitState(ctx, client, "fg-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "fg").GetGatewayId(), "moved with its checkpoint")
	require.Contains(t, moved.GetResult().GetFinalMessage(), "2 earlier messages", "the checkpoint's thread continued")
	h.requireAuditClean()
}
