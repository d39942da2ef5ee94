package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// archives counts the checkpoint archives in the verifier's file:// bucket
// (fileblob keeps attributes beside each blob in a .attrs file).
func (h *harness) archives() int {
	h.t.Helper()
	n := 0
	require.NoError(h.t, filepath.WalkDir(h.st.BlobDir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && !strings.HasSuffix(p, ".attrs") {
			n++
		}
		return nil
	}))
	return n
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.store().Pool().QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// idleRuns runs warm runs of session one after another, each followed by
// its idle suspension, and returns the checkpoints, oldest first.
func (h *harness) idleRuns(ctx context.Context, session string, ids ...string) []string {
	h.t.Helper()
	var cps []string
	prev := ""
	for _, id := range ids {
		h.submitIdle(ctx, id, session, "turn "+id)
		h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		_, cp := h.waitCheckpoint(ctx, session, prev)
		prev = cp.GetCheckpointId()
		cps = append(cps, prev)
	}
	return cps
}

func TestL1_RetentionPrunesCheckpointsWithTheirArchivesAndKeepsTheOneASessionRestoresFrom(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{ExecutorArgs: []string{"-retention-interval", "200ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cps := h.idleRuns(ctx, "ret", "ret-1", "ret-2", "ret-3")
	require.Equal(t, 3, h.archives())
	require.Equal(t, 3, h.count(`SELECT count(*) FROM backup.checkpoints`))

	// Keep one checkpoint per session and ended runs for an hour; the
	// runs ended two hours ago.
	require.NoError(t, h.store().SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour, CheckpointsKept: 1}, "test"))
	_, err := h.store().Pool().Exec(ctx, `UPDATE executor.runs SET ended_at = ended_at - interval '2 hours'`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return h.count(`SELECT count(*) FROM executor.runs`) == 1 && h.archives() == 1
	}, 30*time.Second, 100*time.Millisecond, "the purge deleted the superseded checkpoints, their archives and their runs")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM backup.checkpoints WHERE checkpoint_id = $1`, cps[2]))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM executor.session_checkpoints WHERE checkpoint_id = $1`, cps[2]))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM executor.runs WHERE client_run_id = 'ret-3'`), "the session's newest run stays")
	require.Zero(t, h.count(`SELECT count(*) FROM executor.events e JOIN executor.runs r USING (run_id) WHERE r.client_run_id <> 'ret-3'`))
	require.Zero(t, h.count(`SELECT count(*) FROM executor.events WHERE run_id NOT IN (SELECT run_id FROM executor.runs)`))

	// The session goes on from the checkpoint that was kept.
	h.submitIdle(ctx, "ret-4", "ret", "turn ret-4")
	run := h.waitState(ctx, h.client, "ret-4", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "6 earlier messages")
}

func TestL1_DeleteRunRefusesARunningRunAndDeletesAnEndedOneWithItsCheckpointArchive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cps := h.idleRuns(ctx, "del", "del-1", "del-2")
	require.Equal(t, 2, h.archives())

	// The run the session's current checkpoint names stays.
	_, err := h.client.DeleteRun(ctx, &executorv1.DeleteRunRequest{RunId: "del-2"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.EqualValues(t, failure.RunHoldsCurrentCheckpoint, failure.CodeOf(err))

	// A running run is refused.
	h.submit("del-live", "del-live", stalledTurn)
	h.waitState(ctx, h.client, "del-live", executorv1.RunState_RUN_STATE_RUNNING)
	_, err = h.client.DeleteRun(ctx, &executorv1.DeleteRunRequest{RunId: "del-live"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.EqualValues(t, failure.RunNotEnded, failure.CodeOf(err))
	_, err = h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "del-live", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	require.NoError(t, err)

	resp, err := h.client.DeleteRun(ctx, &executorv1.DeleteRunRequest{RunId: "del-1", Reason: "customer asked"})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.GetDeleted().GetRuns())
	require.EqualValues(t, 1, resp.GetDeleted().GetCheckpoints())
	require.Positive(t, resp.GetDeleted().GetEvents())
	_, err = h.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "del-1"})
	require.Equal(t, codes.NotFound, status.Code(err))
	require.Equal(t, 1, h.archives(), "the superseded checkpoint's archive went with its run")
	require.Zero(t, h.count(`SELECT count(*) FROM backup.checkpoints WHERE checkpoint_id = $1`, cps[0]))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM backup.checkpoints WHERE checkpoint_id = $1`, cps[1]))
	require.Zero(t, h.count(`SELECT count(*) FROM executor.events WHERE run_id NOT IN (SELECT run_id FROM executor.runs)`))

	acts, err := h.store().OperatorActions(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, acts, 1)
	require.Equal(t, "run.delete", acts[0].Action)
	require.Equal(t, "del-1", acts[0].RunID)
	require.Equal(t, "customer asked", acts[0].Reason)
	require.NotEmpty(t, acts[0].Principal)
	require.EqualValues(t, 1, acts[0].Details["checkpoints"])
}

func TestL1_PurgeCompanyRemovesEverythingOfTheCompanyAndNothingElse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.idleRuns(ctx, "pur", "pur-1")
	_, err := h.client.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "token", Value: []byte("v")})
	require.NoError(t, err)
	_, err = h.client.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "globex", Name: "token", Value: []byte("v")})
	require.NoError(t, err)
	in, err := cli.InputSpec{Prompt: "globex turn", Company: "globex", Agent: "agent-1", Session: "g", Lifecycle: "per_turn"}.Input()
	require.NoError(t, err)
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "g-1", Input: in})
	require.NoError(t, err)
	h.waitState(ctx, h.client, "g-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, 1, h.archives())

	resp, err := h.client.PurgeCompany(ctx, &executorv1.PurgeCompanyRequest{CompanyId: "acme", Reason: "contract ended"})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.GetDeleted().GetRuns())
	require.EqualValues(t, 1, resp.GetDeleted().GetCheckpoints())
	require.EqualValues(t, 1, resp.GetDeleted().GetSecrets())
	require.Zero(t, h.archives(), "the company's checkpoint archive is gone")
	require.Zero(t, h.count(`SELECT count(*) FROM backup.checkpoints`))
	for _, table := range []string{"runs", "session_checkpoints", "secrets", "interactions"} {
		require.Zero(t, h.count(fmt.Sprintf(`SELECT count(*) FROM executor.%s WHERE company_id = 'acme'`, table)), table)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM executor.events WHERE run_id NOT IN (SELECT run_id FROM executor.runs)`))
	require.Zero(t, h.count(`SELECT count(*) FROM executor.placements WHERE session_scope NOT IN (SELECT session_scope FROM executor.runs)`))
	// globex is untouched.
	_, err = h.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "g-1"})
	require.NoError(t, err)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM executor.secrets WHERE company_id = 'globex'`))
	acts, err := h.store().OperatorActions(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, acts, 1)
	require.Equal(t, "company.purge", acts[0].Action)
	require.Equal(t, "contract ended", acts[0].Reason)
}
