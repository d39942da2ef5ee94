package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// submitIdle submits a warm run of session whose idle timeout is one second.
func (h *harness) submitIdle(ctx context.Context, runID, session, prompt string) {
	h.t.Helper()
	in, err := cli.InputSpec{Prompt: prompt, Company: "acme", Agent: "agent-1", Issue: "ISS-1", Session: session,
		Lifecycle: "warm", IdleTimeoutSeconds: 1}.Input()
	require.NoError(h.t, err)
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(h.t, err)
}

// waitCheckpoint waits for the session's scope to record a verified
// suspension other than prev.
func (h *harness) waitCheckpoint(ctx context.Context, session, prev string) (*executorv1.Session, *executorv1.SessionCheckpoint) {
	h.t.Helper()
	var sess *executorv1.Session
	require.Eventually(h.t, func() bool {
		resp, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: session})
		if err != nil || len(resp.GetSessions()) != 1 {
			return false
		}
		sess = resp.GetSessions()[0]
		cp := sess.GetCheckpoint()
		return cp != nil && cp.GetCheckpointId() != prev
	}, 30*time.Second, 100*time.Millisecond, "the idle session was suspended and its checkpoint recorded")
	return sess, sess.GetCheckpoint()
}

func (h *harness) backupClient() backupv1.BackupVerifierClient {
	conn, err := grpcx.Dial(h.st.Addr("backup-verifier"), "")
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return backupv1.NewBackupVerifierClient(conn)
}

type runnerStateFile struct {
	Identity struct {
		RunnerInstanceID   string `json:"runnerInstanceId"`
		EnvironmentLeaseID string `json:"environmentLeaseId"`
	} `json:"identity"`
	Lifecycle        string `json:"lifecycle"`
	ProviderThreadID string `json:"providerThreadId"`
}

func readRunnerState(t *testing.T, stateDir string) (*runnerStateFile, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "runner", "runner-state.json"))
	if os.IsNotExist(err) {
		return nil, false
	}
	require.NoError(t, err)
	var st runnerStateFile
	require.NoError(t, json.Unmarshal(b, &st))
	return &st, true
}

func TestR5_IdleCloseIsAVerifiedSuspensionAndANewRunnerRestoresTheStampedBackup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A warm session: two turns on one runner and one provider.
	h.submitIdle(ctx, "r5-1", "suspend-me", "first")
	h.submitIdle(ctx, "r5-2", "suspend-me", "second")
	h.waitState(ctx, h.client, "r5-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	second := h.waitState(ctx, h.client, "r5-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"))

	// Idle for its timeout: the executor suspends the session and records a
	// stamped checkpoint.
	sess, cp := h.waitCheckpoint(ctx, "suspend-me", "")
	require.Equal(t, "warm native session idle timeout", cp.GetReason())
	require.Equal(t, second.GetRunnerInstanceId(), cp.GetRunnerInstanceId())
	st := cp.GetStamp()
	gwScope := st.GetSessionScope()
	require.Len(t, gwScope, 64)
	require.Equal(t, sess.GetSessionScope(), cp.GetSessionScope())
	require.Equal(t, "local-"+gwScope[:16], cp.GetLeaseId(), "the stamp is bound to the runner's environment lease")
	require.Equal(t, cp.GetLeaseId(), st.GetLeaseId())
	require.Equal(t, cp.GetCheckpointId(), st.GetCheckpointId())
	require.Equal(t, cp.GetManifestDigest(), st.GetManifestDigest())

	// The runner stopped its provider, wrote lifecycle suspended and exited.
	stateDir := filepath.Join(h.st.RunnerStateRoot(), gwScope)
	rs, ok := readRunnerState(t, stateDir)
	require.True(t, ok)
	require.Equal(t, "suspended", rs.Lifecycle)
	require.Equal(t, cp.GetRunnerInstanceId(), rs.Identity.RunnerInstanceID)
	require.Equal(t, cp.GetLeaseId(), rs.Identity.EnvironmentLeaseID)
	require.NotEmpty(t, rs.ProviderThreadID)
	require.Eventually(t, func() bool {
		r, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "suspend-me"})
		return err == nil && !r.GetSessions()[0].GetRunnerConnected()
	}, 10*time.Second, 50*time.Millisecond, "the runner went away")

	// The verifier vouches for the backup, for this lease only.
	bc := h.backupClient()
	vr, err := bc.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: st, LeaseId: cp.GetLeaseId()})
	require.NoError(t, err)
	require.True(t, vr.GetValid(), vr.GetReason())
	vr, err = bc.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: st, LeaseId: "another-lease"})
	require.NoError(t, err)
	require.False(t, vr.GetValid())
	require.Equal(t, "backup_stamp_lease_mismatch", vr.GetReason())
	deep, err := bc.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cp.GetCheckpointId()}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	require.NoError(t, err)
	require.True(t, deep.GetValid(), deep.GetReason())
	m := deep.GetCheckpoint().GetManifest()
	require.Equal(t, rs.ProviderThreadID, m.GetProviderSessionIdentity().GetProviderSessionId())
	require.Equal(t, []string{"runner", "codex-home"}, []string{m.GetDirectories()[0].GetName(), m.GetDirectories()[1].GetName()})

	// What the runner emitted while suspending waits for the scope's next
	// run (SPEC R9): nothing follows r5-2's run.terminal.
	stored, err := h.store().EventsAfter(ctx, "r5-2", 0, 1000)
	require.NoError(t, err)
	require.Equal(t, "run.terminal", stored[len(stored)-1].Event.GetEventType())

	// The runner's state is lost.
	require.NoError(t, os.RemoveAll(stateDir))

	// The next run restores the stamped backup in a new runner process with
	// the same identity and continues the same provider thread.
	h.submitIdle(ctx, "r5-3", "suspend-me", "third")
	third := h.waitState(ctx, h.client, "r5-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, third.GetResult().GetFinalMessage(), "4 earlier messages", "the provider thread kept its history")
	require.Equal(t, second.GetRunnerInstanceId(), third.GetRunnerInstanceId(), "the restored runner has the manifest's identity")
	require.NotEqual(t, second.GetRunnerProcess().GetPid(), third.GetRunnerProcess().GetPid(), "a new runner process")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"), "one new provider process")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "no new provider thread")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"), "the thread was resumed")
	restored, ok := readRunnerState(t, stateDir)
	require.True(t, ok, "the runner state is back")
	require.Equal(t, rs.ProviderThreadID, restored.ProviderThreadID)
	// The suspension's events are on record under r5-3, by its attempt.
	var suspended bool
	for _, r := range h.eventRows(ctx, "r5-3") {
		require.EqualValues(t, third.GetAttempt(), r.Writer)
		suspended = suspended || r.Type == "runner.suspended"
	}
	require.True(t, suspended, "runner.suspended is on record under the next run")
}

func TestR5_ATamperedOrUnstampedBackupIsRefusedAndNothingIsRestored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submitIdle(ctx, "t5-1", "tamper", "first")
	first := h.waitState(ctx, h.client, "t5-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	_, cp := h.waitCheckpoint(ctx, "tamper", "")
	stateDir := filepath.Join(h.st.RunnerStateRoot(), cp.GetStamp().GetSessionScope())
	require.NoError(t, os.RemoveAll(stateDir))

	requireRefused := func(runID, reason string) {
		t.Helper()
		h.submitIdle(ctx, runID, "tamper", "again")
		run := h.waitState(ctx, h.client, runID, executorv1.RunState_RUN_STATE_FAILED)
		t.Logf("%s refused: %s", runID, run.GetFailure().GetMessage())
		require.Equal(t, "runner_harness_backup_unverified", run.GetFailure().GetCode(), run.GetFailure().GetMessage())
		require.Contains(t, run.GetFailure().GetMessage(), reason)
		_, err := os.Stat(stateDir)
		require.True(t, os.IsNotExist(err), "nothing was restored")
		entries, err := os.ReadDir(filepath.Dir(stateDir))
		require.NoError(t, err)
		for _, e := range entries {
			require.False(t, strings.HasPrefix(e.Name(), ".tether-checkpoint-"), "no staging left behind: %s", e.Name())
		}
		require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "no provider was started")
	}

	// A tampered backup: one byte of the stored archive changed. The
	// verifier re-hashes it for the stamp, which no longer verifies.
	var blob string
	require.NoError(t, filepath.Walk(h.st.BlobDir(), func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, cp.GetCheckpointId()+".tar") {
			blob = p
		}
		return err
	}))
	require.NotEmpty(t, blob)
	orig, err := os.ReadFile(blob)
	require.NoError(t, err)
	bad := append([]byte(nil), orig...)
	i := strings.Index(string(bad), "earlier") // inside the provider's history (or anywhere in the data)
	if i < 0 {
		i = len(bad) / 3
	}
	bad[i] ^= 0x20
	require.NoError(t, os.WriteFile(blob, bad, 0o600))
	requireRefused("t5-2", "backup_")

	// An unstamped backup: the archive is intact again, but the recorded
	// stamp's signature is not the verifier's.
	require.NoError(t, os.WriteFile(blob, orig, 0o600))
	forged := proto.Clone(cp.GetStamp()).(*backupv1.Stamp)
	forged.Signature = strings.Repeat("0", len(forged.GetSignature()))
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(forged)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, h.dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE executor.session_checkpoints SET stamp = $2 WHERE checkpoint_id = $1`, cp.GetCheckpointId(), raw)
	require.NoError(t, err)
	requireRefused("t5-3", "backup_stamp_signature_invalid")

	// With the genuine stamp back the same backup restores.
	raw, err = proto.MarshalOptions{Deterministic: true}.Marshal(cp.GetStamp())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE executor.session_checkpoints SET stamp = $2 WHERE checkpoint_id = $1`, cp.GetCheckpointId(), raw)
	require.NoError(t, err)
	h.submitIdle(ctx, "t5-4", "tamper", "after all")
	run := h.waitState(ctx, h.client, "t5-4", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, first.GetRunnerInstanceId(), run.GetRunnerInstanceId())
}

func TestR5_CloseSessionWithSuspendRecordsAStampedCheckpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("cs-1", "close-suspend", "first")
	first := h.waitState(ctx, h.client, "cs-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	var resp *executorv1.CloseSessionResponse
	require.Eventually(t, func() bool {
		// Busy until the run's driver has detached from the runner.
		var err error
		resp, err = h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "close-suspend",
			Reason: "operator suspends", Suspend: true})
		return err == nil
	}, 20*time.Second, 100*time.Millisecond)
	require.Len(t, resp.GetCheckpoints(), 1)
	cp := resp.GetCheckpoints()[0]
	require.Equal(t, []string{first.GetRunnerInstanceId()}, resp.GetClosedRunnerInstanceIds())
	require.Equal(t, "operator suspends", cp.GetReason())
	vr, err := h.backupClient().VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId()})
	require.NoError(t, err)
	require.True(t, vr.GetValid(), vr.GetReason())
	rs, ok := readRunnerState(t, filepath.Join(h.st.RunnerStateRoot(), cp.GetStamp().GetSessionScope()))
	require.True(t, ok)
	require.Equal(t, "suspended", rs.Lifecycle)
	sess, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "close-suspend"})
	require.NoError(t, err)
	require.Equal(t, cp.GetCheckpointId(), sess.GetSessions()[0].GetCheckpoint().GetCheckpointId())

	// The local state is intact: the next run resumes it (no restore).
	h.submit("cs-2", "close-suspend", "second")
	second := h.waitState(ctx, h.client, "cs-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))
}
