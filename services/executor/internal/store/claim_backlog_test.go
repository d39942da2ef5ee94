package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// queue submits runs id → session, in the given order.
func queue(t *testing.T, s *store.Store, runs ...[2]string) {
	t.Helper()
	for _, r := range runs {
		_, created, err := s.SubmitRun(context.Background(), r[0], input(r[1], "turn "+r[0]))
		require.NoError(t, err)
		require.True(t, created, r[0])
	}
}

// backlog is n runs prefix1…prefixN of one session.
func backlog(prefix, session string, n int) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{fmt.Sprintf("%s%d", prefix, i+1), session}
	}
	return out
}

// claimID claims the next due run and returns its id ("" when none is due).
func claimID(t *testing.T, s *store.Store) (string, *store.Claim) {
	t.Helper()
	c, err := s.ClaimNext(context.Background(), "owner", time.Minute, ctl)
	require.NoError(t, err)
	if c == nil {
		return "", nil
	}
	return c.RunID, c
}

// endRun ends a claimed run with its terminal event.
func endRun(t *testing.T, s *store.Store, c *store.Claim) {
	t.Helper()
	res, err := s.AppendEvents(context.Background(), c.Fence, []*prpv1.Event{event(c.RunID, "runner-"+c.RunID, 1, "run.terminal",
		map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
}

// heads lists the unfinished runs of a session marked as its head.
func heads(t *testing.T, s *store.Store, session string) []string {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `
SELECT c.run_id FROM executor.coordinators c JOIN executor.runs r ON r.run_id = c.run_id
 WHERE r.normalized_session_id = $1 AND c.scope_head AND c.phase NOT IN ('completed', 'terminal_failure')
 ORDER BY c.submit_seq`, session)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out = append(out, id)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestE7_ClaimUnderABacklogTakesEachSessionsHeadInSubmissionOrder(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	queue(t, s, backlog("a", "sess-a", 50)...)
	queue(t, s, [2]string{"b1", "sess-b"}, [2]string{"a51", "sess-a"}, [2]string{"c1", "sess-c"}, [2]string{"b2", "sess-b"})

	a1, ca1 := claimID(t, s)
	require.Equal(t, "a1", a1)
	b1, cb1 := claimID(t, s)
	require.Equal(t, "b1", b1, "a2…a51 wait behind a1; b1 is the next head")
	c1, _ := claimID(t, s)
	require.Equal(t, "c1", c1)
	none, _ := claimID(t, s)
	require.Empty(t, none, "every other run waits behind a busy session")

	endRun(t, s, cb1)
	b2, _ := claimID(t, s)
	require.Equal(t, "b2", b2)
	endRun(t, s, ca1)
	for i := 2; i <= 51; i++ {
		id, c := claimID(t, s)
		require.Equal(t, fmt.Sprintf("a%d", i), id, "sess-a runs in submission order")
		none, _ := claimID(t, s)
		require.Empty(t, none)
		endRun(t, s, c)
	}
	require.Empty(t, heads(t, s, "sess-a"))
}

func TestE10_ASessionsBacklogDoesNotDelayOtherSessions(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	// Session x queues 200 turns first; four other sessions queue one each
	// afterwards. Each other session's turn is claimed before x's second.
	queue(t, s, backlog("x", "sess-x", 200)...)
	queue(t, s, [2]string{"p1", "sess-p"}, [2]string{"q1", "sess-q"}, [2]string{"r1", "sess-r"}, [2]string{"s1", "sess-s"})
	var got []string
	for {
		id, _ := claimID(t, s)
		if id == "" {
			break
		}
		got = append(got, id)
	}
	require.Equal(t, []string{"x1", "p1", "q1", "r1", "s1"}, got)
	require.Equal(t, []string{"x1"}, heads(t, s, "sess-x"))
}

func TestE11_ARetryingHeadHoldsItsSessionUntilDueUnderABacklog(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	queue(t, s, backlog("a", "sess-a", 20)...)
	queue(t, s, [2]string{"b1", "sess-b"})
	_, c := claimID(t, s)
	require.Equal(t, "a1", c.RunID)
	require.NoError(t, s.RecordFailure(ctx, c.Fence, store.FailureDecision{
		Retry: true, NextAttemptAt: time.Now().Add(time.Hour), Code: "native_session_interrupted", Message: "retry later",
	}))
	b1, _ := claimID(t, s)
	require.Equal(t, "b1", b1)
	none, _ := claimID(t, s)
	require.Empty(t, none, "a1 is not due and a2… stay behind it")
	require.Equal(t, []string{"a1"}, heads(t, s, "sess-a"))

	_, err := s.Pool().Exec(ctx, `UPDATE executor.coordinators SET next_attempt_at = now() - interval '1 second' WHERE run_id = 'a1'`)
	require.NoError(t, err)
	again, c := claimID(t, s)
	require.Equal(t, "a1", again)
	require.EqualValues(t, 2, c.Attempt)
	// The retry ends terminally: a2 is next.
	require.NoError(t, s.RecordFailure(ctx, c.Fence, store.FailureDecision{Code: "native_session_retry_exhausted", Message: "gone"}))
	a2, _ := claimID(t, s)
	require.Equal(t, "a2", a2)
}

func TestE6_CancellingQueuedRunsUnderABacklogKeepsTheSessionOrder(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	queue(t, s, backlog("a", "sess-a", 6)...)
	cancel := func(id string) {
		t.Helper()
		out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: id, Scope: "run", Reason: "not needed"})
		require.NoError(t, err)
		require.True(t, out.Active)
	}
	cancel("a1") // the queued head: a2 heads the session now
	require.Equal(t, []string{"a2"}, heads(t, s, "sess-a"))
	cancel("a4") // a blocked run: the head stays
	require.Equal(t, []string{"a2"}, heads(t, s, "sess-a"))
	var got []string
	for {
		id, c := claimID(t, s)
		if id == "" {
			break
		}
		got = append(got, id)
		none, _ := claimID(t, s)
		require.Empty(t, none)
		endRun(t, s, c)
	}
	require.Equal(t, []string{"a2", "a3", "a5", "a6"}, got)
}

func TestE7_ASubmissionRacingTheEndOfItsSessionsHeadIsNeverStranded(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	queue(t, s, [2]string{"r0", "sess"})
	_, head := claimID(t, s)
	for i := 1; i <= 25; i++ {
		id := fmt.Sprintf("r%d", i)
		var wg sync.WaitGroup
		wg.Go(func() { endRun(t, s, head) })
		wg.Go(func() { queue(t, s, [2]string{id, "sess"}) })
		wg.Wait()
		require.Equal(t, []string{id}, heads(t, s, "sess"), "round %d", i)
		got, c := claimID(t, s)
		require.Equal(t, id, got, "round %d", i)
		head = c
	}
}

func TestE7_Migration00009MarksTheHeadsOfExistingScopesAndGoesDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, Migrator)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	migrations, err := fs.Sub(store.Migrations, "migrations")
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations, goose.WithTableName("executor_goose_version"))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 8)
	require.NoError(t, err)
	// Before 00009: scope a has a finished run, a running one and two
	// queued; scope b two queued; scope c only finished runs.
	_, err = db.ExecContext(ctx, `
INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
SELECT id, 'acme', sc, sc, 'LIFECYCLE_MODE_WARM', '\x'::bytea, 'd'
  FROM (VALUES ('a1', 'a'), ('a2', 'a'), ('a3', 'a'), ('a4', 'a'), ('b1', 'b'), ('b2', 'b'), ('c1', 'c')) v(id, sc)
 ORDER BY id;
INSERT INTO executor.coordinators (run_id, session_scope, submit_seq, phase)
SELECT r.run_id, r.session_scope, r.submit_seq, v.phase FROM executor.runs r
  JOIN (VALUES ('a1', 'completed'), ('a2', 'observed'), ('a3', 'queued'), ('a4', 'queued'),
               ('b1', 'retryable_failure'), ('b2', 'queued'), ('c1', 'terminal_failure')) v(id, phase) ON v.id = r.run_id`)
	require.NoError(t, err)
	require.NoError(t, store.MigrateDB(ctx, db))
	rows, err := db.QueryContext(ctx, `SELECT run_id FROM executor.coordinators WHERE scope_head ORDER BY run_id`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		got = append(got, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"a2", "b1"}, got)
}
