package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// stopRunner closes the session's live runner (its state stays on disk)
// and waits until it is gone.
func (h *harness) stopRunner(ctx context.Context, session string) *executorv1.Session {
	h.t.Helper()
	_, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: session, Reason: "test"})
	require.NoError(h.t, err)
	var sess *executorv1.Session
	require.Eventually(h.t, func() bool {
		r, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: session})
		if err != nil {
			return false
		}
		sess = r.GetSessions()[0]
		return !sess.GetRunnerConnected()
	}, 20*time.Second, 50*time.Millisecond, "the runner went away")
	return sess
}

// TestF3_Stack_ALostRootWithoutACheckpointFailsClosedUntilAnOperatorReplacesTheSession:
// the single-gateway rule. A warm session's durable root is gone and it has
// no verified checkpoint: its next run fails closed with
// runner_harness_state_mismatch and starts nothing (before, it silently
// started a fresh provider session). tetherctl replace-session records who,
// when and why; the next run starts a fresh provider session, on record as
// a session.continuity_break that GetSession shows and tetherctl audit
// lists as legitimate (the audit stays clean).
func TestF3_Stack_ALostRootWithoutACheckpointFailsClosedUntilAnOperatorReplacesTheSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("lost-1", "lost", "Remember the word tether.")
	first := h.waitState(ctx, h.client, "lost-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	sess := h.stopRunner(ctx, "lost")
	require.Nil(t, sess.GetCheckpoint(), "no verified checkpoint")
	root := filepath.Join(h.st.RunnerStateRoot(), sess.GetSessionScope())
	require.DirExists(t, root)
	require.NoError(t, os.RemoveAll(root)) // the host's disk is gone

	h.submit("lost-2", "lost", "Which word?")
	refused := h.waitState(ctx, h.client, "lost-2", executorv1.RunState_RUN_STATE_FAILED)
	require.Equal(t, "runner_harness_state_mismatch", refused.GetFailure().GetCode(), refused.GetFailure().GetMessage())
	require.Contains(t, refused.GetFailure().GetMessage(), "ReplaceSession")
	require.NoDirExists(t, root, "fail closed: nothing was created")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "no provider was started")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))

	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "tetherctl"), "-addr", h.st.Addr("executor"),
		"replace-session", "-company", "acme", "-session", "lost", "-by", "alice", "-reason", "host disk lost, no checkpoint").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "the next run starts a fresh provider session")

	h.submit("lost-3", "lost", "Start again.")
	fresh := h.waitState(ctx, h.client, "lost-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.NotEqual(t, first.GetRunnerInstanceId(), fresh.GetRunnerInstanceId(), "a fresh runner")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "thread/start"), "a fresh provider thread")
	require.Equal(t, 0, countLines(t, h.st.CallLog(), "thread/resume"))

	breaks := h.controlEvents(ctx, "lost-3", "session.continuity_break")
	require.Len(t, breaks, 1)
	require.Equal(t, "alice", breaks[0]["requestedBy"])
	require.Equal(t, "host disk lost, no checkpoint", breaks[0]["why"])
	require.Equal(t, "warm native session replaced by operator", breaks[0]["reason"])
	require.NotEmpty(t, breaks[0]["caller"])

	resp, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "lost"})
	require.NoError(t, err)
	reps := resp.GetSessions()[0].GetReplacements()
	require.Len(t, reps, 1)
	require.Equal(t, "lost-3", reps[0].GetAppliedRunId())
	require.Equal(t, "alice", reps[0].GetRequestedBy())
	require.NotNil(t, reps[0].GetAppliedAt())

	// The run after it continues the new thread: the decision is spent.
	h.submit("lost-4", "lost", "Still there?")
	h.waitState(ctx, h.client, "lost-4", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "thread/start"))
	require.Empty(t, h.controlEvents(ctx, "lost-4", "session.continuity_break"))

	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	require.Len(t, rep.ContinuityBreaks, 1)
	require.Equal(t, "lost-3", rep.ContinuityBreaks[0].RunID)
	require.True(t, strings.Contains(rep.ContinuityBreaks[0].Detail, "alice"), rep.ContinuityBreaks[0].Detail)
}

// TestF3_Stack_AWarmSessionIsCheckpointedSoonAfterASettledRun: the
// checkpoint policy. With -checkpoint-after, a warm session idle that long
// after a settled run gets a verified checkpoint (stamped by the backup
// verifier, which re-verifies it), long before its idle timeout; runs
// that follow each other within it share one provider; the checkpoint is
// online (SPEC P6): the run after it continues the same thread on the same
// runner and provider. It logs what the policy costs (no timed
// assertion).
func TestF3_Stack_AWarmSessionIsCheckpointedSoonAfterASettledRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{CheckpointAfter: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Two runs queued back to back: one provider, no checkpoint between.
	h.submit("cp-1", "policy", "first")
	h.submit("cp-2", "policy", "second")
	h.waitState(ctx, h.client, "cp-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	start := time.Now()
	second := h.waitState(ctx, h.client, "cp-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	warm := time.Since(start)
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"))

	sess, cp := h.waitCheckpoint(ctx, "policy", "")
	settled := time.Since(second.GetEndedAt().AsTime())
	require.Equal(t, "warm native session checkpoint after a settled run", cp.GetReason())
	require.Equal(t, second.GetRunnerInstanceId(), cp.GetRunnerInstanceId())
	vr, err := h.backupClient().VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cp.GetCheckpointId()}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	require.NoError(t, err)
	require.True(t, vr.GetValid(), vr.GetReason())
	rs, ok := readRunnerState(t, filepath.Join(h.st.RunnerStateRoot(), sess.GetSessionScope()))
	require.True(t, ok)
	require.Equal(t, "ready", rs.Lifecycle, "checkpointed online, not suspended")

	start = time.Now()
	h.submit("cp-3", "policy", "third")
	third := h.waitState(ctx, h.client, "cp-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	resumed := time.Since(start)
	require.Contains(t, third.GetResult().GetFinalMessage(), "4 earlier messages", "the same thread")
	require.Equal(t, second.GetRunnerInstanceId(), third.GetRunnerInstanceId())
	requireSameProcesses(t, second, third)
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "the same provider process")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	require.Equal(t, 0, countLines(t, h.st.CallLog(), "thread/resume"))
	t.Logf("checkpoint policy cost: checkpoint recorded %s after the run ended (policy 500ms); a queued warm run took %s, the run after a checkpoint %s",
		settled.Round(time.Millisecond), warm.Round(time.Millisecond), resumed.Round(time.Millisecond))
}
