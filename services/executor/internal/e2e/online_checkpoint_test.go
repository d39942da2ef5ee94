package e2e

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// Online checkpoints (SPEC P6, issue #32): with a backup verifier and
// -checkpoint-after, an idle warm session is checkpointed without stopping
// its runnerd or its provider. Before, every checkpoint was a suspension:
// the next turn paid a runnerd and provider restart and a thread resume.

// p6CheckpointAfter is the stack's -checkpoint-after in these tests.
const p6CheckpointAfter = 500 * time.Millisecond

// requireDeepVerified has the backup verifier re-verify checkpoint cp
// (every byte re-hashed).
func (h *harness) requireDeepVerified(ctx context.Context, cp *executorv1.SessionCheckpoint) {
	h.t.Helper()
	vr, err := h.backupClient().VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cp.GetCheckpointId()}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	require.NoError(h.t, err)
	require.True(h.t, vr.GetValid(), vr.GetReason())
}

// requireSameProcesses checks that run ran on runnerd and provider
// processes of want.
func requireSameProcesses(t *testing.T, want, run *executorv1.Run) {
	t.Helper()
	require.Equal(t, want.GetRunnerProcess().GetPid(), run.GetRunnerProcess().GetPid(), "%s: the same runnerd", run.GetRunId())
	require.Equal(t, want.GetRunnerProcess().GetStartTicks(), run.GetRunnerProcess().GetStartTicks(), "%s: the same runnerd", run.GetRunId())
	require.Equal(t, want.GetProviderProcess().GetPid(), run.GetProviderProcess().GetPid(), "%s: the same provider", run.GetRunId())
	require.Equal(t, want.GetProviderProcess().GetStartTicks(), run.GetProviderProcess().GetStartTicks(), "%s: the same provider", run.GetRunId())
}

// TestP6_AWarmSessionKeepsOneRunnerdAndOneProviderAcrossIdlePeriodsEachCheckpointedOnline:
// three turns, each after an idle period longer than -checkpoint-after:
// each idle period yields a checkpoint the verifier re-verifies (deep),
// and all three turns run on the same runnerd and provider processes, one
// thread, never resumed. Before, each checkpoint suspended the session: the
// next turn started a new runnerd and provider and resumed the thread.
func TestP6_AWarmSessionKeepsOneRunnerdAndOneProviderAcrossIdlePeriodsEachCheckpointedOnline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{CheckpointAfter: p6CheckpointAfter})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("p6-1", "p6", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "p6-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.NotZero(t, first.GetRunnerProcess().GetPid())
	require.NotZero(t, first.GetProviderProcess().GetPid())
	prev := ""
	for i, id := range []string{"p6-2", "p6-3"} {
		sess, cp := h.waitCheckpoint(ctx, "p6", prev)
		prev = cp.GetCheckpointId()
		require.Equal(t, "warm native session checkpoint after a settled run", cp.GetReason())
		require.Equal(t, first.GetRunnerInstanceId(), cp.GetRunnerInstanceId())
		h.requireDeepVerified(ctx, cp)
		root := filepath.Join(h.st.RunnerStateRoot(), sess.GetSessionScope())
		rs, ok := readRunnerState(t, root)
		require.True(t, ok)
		require.Equal(t, "ready", rs.Lifecycle, "the live runner was not suspended")
		require.NoDirExists(t, filepath.Join(root, "runner", "checkpoint-stage"), "the stage is removed")
		require.True(t, procid.Exists(int(first.GetRunnerProcess().GetPid())), "runnerd still runs")
		require.True(t, procid.Exists(int(first.GetProviderProcess().GetPid())), "the provider still runs")

		h.submit(id, "p6", "Which word?")
		run := h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.Contains(t, run.GetResult().GetFinalMessage(), []string{"2 earlier messages", "4 earlier messages"}[i], "the same thread")
		requireSameProcesses(t, first, run)
	}
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "one provider process")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	require.Equal(t, 0, countLines(t, h.st.CallLog(), "thread/resume"), "the thread was never resumed")
	require.Equal(t, 3, countLines(t, h.st.CallLog(), "turn/start"))
	h.requireAuditClean()
}

// TestP6_AFailoverFromAnOnlineCheckpointResumesTheSameThreadElsewhere: a
// session checkpointed online (its runnerd and provider still running)
// loses its host (gateway, runnerd and provider killed -9): its next run
// moves to the other gateway, restores the online checkpoint there (the
// stamp verified, the same runner identity) and continues the same
// provider thread, its turn started once.
func TestP6_AFailoverFromAnOnlineCheckpointResumesTheSameThreadElsewhere(t *testing.T) {
	t.Parallel()
	h := hostLossFleet(t, stack.Options{CheckpointAfter: p6CheckpointAfter})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.submitWith(ctx, "p6f-1", "p6f", "Remember the word tether.", zoneA, 0)
	first := h.waitState(ctx, h.client, "p6f-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw"), h.session(ctx, "p6f").GetGatewayId())
	_, cp := h.waitCheckpoint(ctx, "p6f", "")
	h.requireDeepVerified(ctx, cp)
	require.True(t, procid.Exists(int(first.GetRunnerProcess().GetPid())), "checkpointed online: runnerd still runs")
	require.True(t, procid.Exists(int(first.GetProviderProcess().GetPid())), "checkpointed online: the provider still runs")

	h.loseHost(ctx, "runnergw")
	h.submitWith(ctx, "p6f-2", "p6f", "Which word did I ask you to remember?", nil, 0)
	moved := h.waitState(ctx, h.client, "p6f-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayIDOf("runnergw-2"), h.session(ctx, "p6f").GetGatewayId())
	require.Contains(t, moved.GetResult().GetFinalMessage(), "2 earlier messages", "the checkpointed thread continued elsewhere")
	require.Equal(t, first.GetRunnerInstanceId(), moved.GetRunnerInstanceId(), "the checkpoint's runner identity")
	require.EqualValues(t, 1, moved.GetAttempt())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "no fresh thread")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"), "the restored thread resumed")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	h.requireOneTerminal(ctx, "p6f-2")

	// The session stays warm on its new gateway: checkpointed online again.
	_, cp2 := h.waitCheckpoint(ctx, "p6f", cp.GetCheckpointId())
	h.requireDeepVerified(ctx, cp2)
	h.submitWith(ctx, "p6f-3", "p6f", "And now?", nil, 0)
	next := h.waitState(ctx, h.client, "p6f-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, next.GetResult().GetFinalMessage(), "4 earlier messages")
	requireSameProcesses(t, moved, next)
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// checkpointHoldEnv is the gateway's test hook for online checkpoints
// (runnergw gateway.CheckpointHoldEnv).
const checkpointHoldEnv = "TETHER_RUNNERGW_TEST_CHECKPOINT_HOLD_DIR"

// checkpointHold drives the gateway's checkpoint hold in dir.
type checkpointHold struct {
	t   *testing.T
	dir string
}

func newCheckpointHold(t *testing.T) (checkpointHold, []string) {
	dir := t.TempDir()
	return checkpointHold{t: t, dir: dir}, []string{checkpointHoldEnv + "=" + dir}
}

// hold makes the next online checkpoint stop at phase.
func (c checkpointHold) hold(phase string) {
	require.NoError(c.t, os.WriteFile(filepath.Join(c.dir, "hold-"+phase), nil, 0o600))
}

// waitAt waits until a checkpoint stopped at phase.
func (c checkpointHold) waitAt(phase string) {
	require.Eventually(c.t, func() bool {
		_, err := os.Stat(filepath.Join(c.dir, "at-"+phase))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "an online checkpoint reached %s", phase)
}

// release lets the checkpoint stopped at phase go on, and holds none
// after it.
func (c checkpointHold) release(phase string) {
	require.NoError(c.t, os.Remove(filepath.Join(c.dir, "hold-"+phase)))
	require.NoError(c.t, os.WriteFile(filepath.Join(c.dir, "release-"+phase), nil, 0o600))
}

// TestP6_ATurnSubmittedDuringAnOnlineCheckpointWaitsForItAndCompletesOnce:
// a run submitted while the gateway holds an online checkpoint (runnerd's
// copy staged, not yet uploaded) does not start its turn until the
// checkpoint is stored; then it runs once on the same runnerd and provider,
// and the checkpoint — taken before the turn — is recorded and verifies.
func TestP6_ATurnSubmittedDuringAnOnlineCheckpointWaitsForItAndCompletesOnce(t *testing.T) {
	t.Parallel()
	cph, env := newCheckpointHold(t)
	h := newHarness(t, stack.Options{CheckpointAfter: p6CheckpointAfter, Env: env})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cph.hold("staged")
	h.submit("p6w-1", "p6w", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "p6w-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	cph.waitAt("staged")

	h.submit("p6w-2", "p6w", "Which word?")
	require.Never(t, func() bool { return countLines(t, h.st.CallLog(), "turn/start") > 1 }, 500*time.Millisecond, 20*time.Millisecond,
		"no turn starts while the checkpoint is being taken")
	cph.release("staged")
	run := h.waitState(ctx, h.client, "p6w-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages")
	requireSameProcesses(t, first, run)
	h.requireOneTerminal(ctx, "p6w-2")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"))

	// The checkpoint taken before the turn was stored and recorded (and,
	// a newer run having started, superseded at once).
	_, cp := h.waitCheckpoint(ctx, "p6w", "")
	require.Equal(t, "p6w-1", h.checkpointLastRun(ctx, cp.GetCheckpointId()))
	h.requireDeepVerified(ctx, cp)
	h.requireAuditClean()
}

// checkpointLastRun is the run whose idle period checkpoint id ended.
func (h *harness) checkpointLastRun(ctx context.Context, id string) string {
	h.t.Helper()
	var last string
	require.NoError(h.t, h.store().Pool().QueryRow(ctx, `SELECT last_run_id FROM executor.session_checkpoints WHERE checkpoint_id = $1`, id).Scan(&last))
	return last
}

// TestP6_KillingRunnerdOrTheGatewayMidCheckpointLosesNothing: runnerd
// killed -9 while the gateway holds its staged copy (the copy is complete:
// it is stored, and the next turn continues the thread on a relaunched
// runnerd, started once), then the gateway killed -9 after the verifier
// stored the next checkpoint but before anyone recorded it (nothing is
// recorded; the next turn continues the thread, started once, and the
// idle period after it is checkpointed online again). No turn is lost or
// run twice; the audit is clean.
func TestP6_KillingRunnerdOrTheGatewayMidCheckpointLosesNothing(t *testing.T) {
	t.Parallel()
	cph, env := newCheckpointHold(t)
	h := newHarness(t, stack.Options{CheckpointAfter: p6CheckpointAfter, Env: env})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cph.hold("staged")
	h.submit("p6k-1", "p6k", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "p6k-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	cph.waitAt("staged")
	killRunnerd(t, h, "p6k-1")
	cph.release("staged")
	_, cp := h.waitCheckpoint(ctx, "p6k", "")
	h.requireDeepVerified(ctx, cp)

	h.submit("p6k-2", "p6k", "Which word?")
	second := h.waitState(ctx, h.client, "p6k-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages", "the same thread")
	require.Equal(t, first.GetRunnerInstanceId(), second.GetRunnerInstanceId())
	h.requireOneTerminal(ctx, "p6k-2")

	cph.hold("uploaded")
	cph.waitAt("uploaded")
	gw := h.st.Proc("runnergw")
	require.NoError(t, syscall.Kill(gw.Pid(), syscall.SIGKILL))
	<-gw.Done()
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	cph.release("uploaded")
	require.Equal(t, cp.GetCheckpointId(), h.session(ctx, "p6k").GetCheckpoint().GetCheckpointId(), "nothing recorded")

	h.submit("p6k-3", "p6k", "And now?")
	third := h.waitState(ctx, h.client, "p6k-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, third.GetResult().GetFinalMessage(), "4 earlier messages", "the same thread")
	require.Equal(t, first.GetRunnerInstanceId(), third.GetRunnerInstanceId())
	h.requireOneTerminal(ctx, "p6k-3")
	require.Equal(t, 3, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))

	_, cp3 := h.waitCheckpoint(ctx, "p6k", cp.GetCheckpointId())
	require.Equal(t, "p6k-3", h.checkpointLastRun(ctx, cp3.GetCheckpointId()))
	h.requireDeepVerified(ctx, cp3)
	h.requireNoFailedRun(ctx)
	h.requireAuditClean()
}

// TestP6_TheIdleTimeoutStillSuspendsASessionCheckpointedOnline: suspension
// is the idle timeout's decision only. A session checkpointed online after
// -checkpoint-after is suspended at its idle timeout (3 s here): a second
// verified checkpoint with the idle timeout's reason, the runner state
// suspended, runnerd and the provider gone; the next run resumes the same
// thread in a new provider.
func TestP6_TheIdleTimeoutStillSuspendsASessionCheckpointedOnline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{CheckpointAfter: p6CheckpointAfter})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submitWith(ctx, "p6i-1", "p6i", "Remember the word tether.", nil, 3)
	first := h.waitState(ctx, h.client, "p6i-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	_, online := h.waitCheckpoint(ctx, "p6i", "")
	require.Equal(t, "warm native session checkpoint after a settled run", online.GetReason())
	require.True(t, procid.Exists(int(first.GetRunnerProcess().GetPid())), "checkpointed online: runnerd still runs")

	sess, suspended := h.waitCheckpoint(ctx, "p6i", online.GetCheckpointId())
	require.Equal(t, "warm native session idle timeout", suspended.GetReason())
	h.requireDeepVerified(ctx, suspended)
	rs, ok := readRunnerState(t, filepath.Join(h.st.RunnerStateRoot(), sess.GetSessionScope()))
	require.True(t, ok)
	require.Equal(t, "suspended", rs.Lifecycle)
	require.Eventually(t, func() bool {
		return !procid.Exists(int(first.GetRunnerProcess().GetPid())) && !procid.Exists(int(first.GetProviderProcess().GetPid()))
	}, 30*time.Second, 20*time.Millisecond, "runnerd and the provider stopped")

	h.submitWith(ctx, "p6i-2", "p6i", "Which word?", nil, 3)
	next := h.waitState(ctx, h.client, "p6i-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, next.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"))
	h.requireAuditClean()
}
