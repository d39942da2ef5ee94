package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// runWithEvents submits run id of session, stores n events for it in one
// statement under its lease, then its terminal.
func runWithEvents(t *testing.T, s *store.Store, id, session string, n int) {
	t.Helper()
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, id, input(session, "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, id, c.RunID)
	_, err = s.Pool().Exec(ctx, `
WITH b AS (UPDATE executor.runs SET event_count = $2 WHERE run_id = $1)
INSERT INTO executor.events (run_id, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, writer_attempt)
SELECT $1, g, 'runner-1', g, $1 || '-' || g, 'item.delta', '\x00'::bytea, convert_to(repeat('x', 256), 'UTF8'), $3
  FROM generate_series(1, $2::int) g`, id, n, int64(c.Attempt))
	require.NoError(t, err)
	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(id, "runner-1", uint64(n)+1, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
}

// TestL2_TheEventsTableStopsGrowingOnceRetentionIsReached: the events of
// purged runs leave space that later appends reuse (after autovacuum, here
// VACUUM): with retention the table's size levels off instead of growing
// with its history.
func TestL2_TheEventsTableStopsGrowingOnceRetentionIsReached(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour}, "test"))
	size := func() int64 {
		var n int64
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT pg_relation_size('executor.events')`).Scan(&n))
		return n
	}
	const perRun = 5000
	var sizes []int64
	for gen := range 4 {
		// A generation of runs of one session, then every run expires and
		// is purged but the session's newest (kept).
		for i := range 2 {
			runWithEvents(t, s, fmt.Sprintf("g%d-%d", gen, i), "s", perRun)
		}
		_, err := s.Pool().Exec(ctx, `UPDATE executor.runs SET ended_at = now() - interval '2 hours'`)
		require.NoError(t, err)
		ids, err := s.ExpiredRuns(ctx, 100, 1<<40)
		require.NoError(t, err)
		_, err = s.PurgeRuns(ctx, ids)
		require.NoError(t, err)
		_, err = s.Pool().Exec(ctx, `VACUUM executor.events`)
		require.NoError(t, err)
		sizes = append(sizes, size())
	}
	// Generation 0 grows the table; later ones reuse what was purged.
	require.LessOrEqual(t, sizes[3], sizes[1]+sizes[1]/5, "sizes by generation: %v", sizes)
}

// TestL2_APurgeBatchDeletesEventsByIndexRange: the purge deletes a run's
// events through the events primary key (run_id, seq) — an index range per
// run, whatever the table's size — never by scanning the table.
func TestL2_APurgeBatchDeletesEventsByIndexRange(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i := range 10 {
		runWithEvents(t, s, fmt.Sprintf("r%d", i), "s", 3000)
	}
	_, err := s.Pool().Exec(ctx, `ANALYZE executor.events`)
	require.NoError(t, err)
	var plan []map[string]any
	var raw []byte
	require.NoError(t, s.Pool().QueryRow(ctx, `EXPLAIN (FORMAT JSON) DELETE FROM executor.events WHERE run_id = ANY($1)`, []string{"r1", "r2"}).Scan(&raw))
	require.NoError(t, json.Unmarshal(raw, &plan))
	scan := plan[0]["Plan"].(map[string]any)["Plans"].([]any)[0].(map[string]any)
	require.Contains(t, []string{"Index Scan", "Bitmap Heap Scan"}, scan["Node Type"], "%s", raw)
	if scan["Node Type"] == "Index Scan" {
		require.Equal(t, "events_pkey", scan["Index Name"], "%s", raw)
	}
}

// TestL2_ExpiredRunsComeOldestFirstInBatchesCutAtTheEventBound: the purge's
// candidates come in ended order (runs_ended_idx) and a batch is cut at the
// event bound, so a batch's cost follows the batch, not the history.
func TestL2_ExpiredRunsComeOldestFirstInBatchesCutAtTheEventBound(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i := range 5 {
		runWithEvents(t, s, fmt.Sprintf("e%d", i), "s", 100)
	}
	_, err := s.Pool().Exec(ctx, `UPDATE executor.runs SET ended_at = now() - make_interval(hours => 10 - substr(run_id, 2)::int)`)
	require.NoError(t, err)
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour}, "test"))
	ids, err := s.ExpiredRuns(ctx, 10, 250)
	require.NoError(t, err)
	require.Equal(t, []string{"e0", "e1"}, ids, "oldest first, cut at 250 events (101 each with the terminal)")
	var exists bool
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = 'executor' AND indexname = 'runs_ended_idx')`).Scan(&exists))
	require.True(t, exists)
}
