package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// SPEC P1, P4: an attach's prior runs are bounded probes however many runs
// the session and the table hold: the session's newest runs in index
// order, and the newest run of each of the scope's newest runners (the
// scope's scope_runners rows, then one probe of runs by submit_seq) — no
// scan of the session's runs or of the table, also in the generic plan.
func TestP1_AnAttachsPriorRunsAreBoundedProbes(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, err := s.Pool().Exec(ctx, `
INSERT INTO executor.runs (run_id, company_id, agent_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
SELECT 'r' || g, 'acme', 'a', CASE WHEN g % 2 = 0 THEN 's' ELSE 's-' || g % 200 END,
       CASE WHEN g % 2 = 0 THEN 'big' ELSE 'small-' || g % 200 END, 'LIFECYCLE_MODE_WARM', '\x00', 'd'
  FROM generate_series(1, 20000) g;
INSERT INTO executor.scope_runners (session_scope, runner_instance_id, first_run_id, last_submit_seq)
SELECT r.session_scope, 'runner-' || r.submit_seq, r.run_id, r.submit_seq FROM executor.runs r WHERE r.submit_seq % 20 < 2;
ANALYZE executor.runs; ANALYZE executor.scope_runners`)
	require.NoError(t, err)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE prior_runs(text, text, text, text, text, int, text, int) AS `+store.PriorRunsSQL)
	require.NoError(t, err)
	text := explainAnalyze(ctx, t, tx, `EXECUTE prior_runs('acme', 'a', 's', '', 'r20000', 16, 'big', 4)`)
	require.NotContains(t, text, "Seq Scan", text)
	require.Contains(t, text, "runs_prior_session_idx", text)
	require.Contains(t, text, "scope_runners_pkey", text)
	require.Contains(t, text, "runs_submit_seq_key", text)
	t.Log(text)
}

// explainAnalyze runs EXPLAIN ANALYZE of stmt in tx (costs, timing and the
// summary left out) and returns the plan's text.
func explainAnalyze(ctx context.Context, t *testing.T, tx pgx.Tx, stmt string) string {
	t.Helper()
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) `+stmt)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(plan, "\n")
}
