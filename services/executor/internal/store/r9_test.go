package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// SPEC R9: every event row belongs to a lease.

type row struct {
	Seq     int64
	Type    string
	Writer  int64
	Origin  string // the run the event names
	SrcSeq  int64
	SrcInst string
}

func rowsOf(t *testing.T, s *store.Store, runID string) []row {
	t.Helper()
	rs, err := s.Pool().Query(context.Background(), `
SELECT seq, event_type, writer_attempt, source_seq, source_instance_id FROM executor.events WHERE run_id = $1 ORDER BY seq`, runID)
	require.NoError(t, err)
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.Seq, &r.Type, &r.Writer, &r.SrcSeq, &r.SrcInst))
		out = append(out, r)
	}
	require.NoError(t, rs.Err())
	evs, err := s.EventsAfter(context.Background(), runID, 0, 1000)
	require.NoError(t, err)
	for i := range out {
		out[i].Origin = evs[i].Event.GetRunId()
	}
	return out
}

func types(rs []row) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Type
	}
	return out
}

func requireRefused(t *testing.T, err error, constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want the database to refuse the row, got %v", err)
	require.Equal(t, constraint, pgErr.ConstraintName, pgErr.Message)
}

// twoRunsOfOneScope submits a and b in one warm scope and drives a to its
// run.terminal on runner instance inst (source seqs 1..3); b is claimed
// next.
func twoRunsOfOneScope(t *testing.T, s *store.Store, a, b, inst string) (*store.Claim, *store.Claim) {
	t.Helper()
	ctx := context.Background()
	for _, id := range []string{a, b} {
		_, _, err := s.SubmitRun(ctx, id, input("shared", "x"))
		require.NoError(t, err)
	}
	ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, a, ca.RunID)
	res, err := s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{
		event(a, inst, 1, "run.attached", nil),
		event(a, inst, 2, "turn.started", nil),
		event(a, inst, 3, store.EventTerminal, map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"}),
	})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	cb, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, b, cb.RunID)
	return ca, cb
}

func TestR9_AForgedLateEventForATerminalRunIsRefusedByTheDatabase(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	ca, _ := twoRunsOfOneScope(t, s, "a", "b", "runner-1")
	db := s.Pool()
	forge := func(seq int64, typ string, writer uint64) error {
		_, err := db.Exec(ctx, `
INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
VALUES ('a', $1, $2::bigint, 'runner-1', $2::bigint + 100, 'forged', $3, '\x00', '\x00')`, int64(writer), seq, typ)
		return err
	}
	// The late harness.exited of the issue: after run.terminal, with writer 0.
	requireRefused(t, forge(4, "harness.exited", 0), store.ConstraintAfterTerminal)
	// Even under the run's own, final attempt.
	requireRefused(t, forge(4, "harness.exited", ca.Attempt), store.ConstraintAfterTerminal)
	// A second run.terminal anywhere in the run.
	requireRefused(t, forge(0, store.EventTerminal, ca.Attempt), store.ConstraintOneTerminal)
	// The store's own fenced paths refuse it as well: the lease is over.
	_, err := s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{event("a", "runner-1", 4, "harness.exited", nil)})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
	require.Equal(t, []string{"run.attached", "turn.started", "run.terminal"}, types(rowsOf(t, s, "a")))
}

func TestR9_ARowNotWrittenByTheRunsCurrentAttemptIsRefusedByTheDatabase(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 2))
	require.NoError(t, err)
	forge := func(writer uint64) error {
		_, err := s.Pool().Exec(ctx, `
INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
VALUES ('r', $1, 3, 'runner-1', 3, 'forged', 'item.delta', '\x00', '\x00')`, int64(writer))
		return err
	}
	requireRefused(t, forge(0), store.ConstraintWriterFence)           // outside any lease
	requireRefused(t, forge(c.Attempt+1), store.ConstraintWriterFence) // an attempt not claimed
	require.NoError(t, forge(c.Attempt))
}

func TestR9_SessionEventsAfterARunEndedAreFiledUnderTheNextRunUnderItsFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, cb := twoRunsOfOneScope(t, s, "a", "b", "runner-1")
	// What runnerd sends the next run's driver: the tail it emitted after
	// a ended (harness.exited names a, the run it last served), a late
	// duplicate of a's terminal, then b's own events.
	batch := []*prpv1.Event{
		event("a", "runner-1", 3, store.EventTerminal, map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"}),
		event("a", "runner-1", 4, "harness.exited", map[string]any{"code": "provider_process_exited"}),
		event("b", "runner-1", 5, "run.attached", nil),
		event("b", "runner-1", 6, "turn.started", nil),
	}
	res, err := s.AppendEvents(ctx, cb.Fence, batch)
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Inserted: 3, Dropped: 1, TurnStarted: true}, res)

	require.Equal(t, []string{"run.attached", "turn.started", "run.terminal"}, types(rowsOf(t, s, "a")), "nothing after a's run.terminal")
	b := rowsOf(t, s, "b")
	require.Equal(t, []string{"harness.exited", "run.attached", "turn.started"}, types(b))
	for _, r := range b {
		require.EqualValues(t, cb.Attempt, r.Writer, "written under b's fence")
	}
	require.Equal(t, "a", b[0].Origin, "the event keeps its bytes: it names the run the runner last served")

	// A replay (the acknowledgement was lost) is a duplicate wherever the
	// event was filed; other bytes are a replay conflict.
	res, err = s.AppendEvents(ctx, cb.Fence, batch)
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Duplicates: 3, Dropped: 1}, res)
	_, err = s.AppendEvents(ctx, cb.Fence, []*prpv1.Event{event("a", "runner-1", 4, "harness.exited", map[string]any{"code": "other"})})
	require.EqualValues(t, failure.NativeEventReplayConflict, failure.CodeOf(err))

	// A stale attempt of b files nothing, neither its own nor a's events.
	stale := cb.Fence
	stale.Attempt++
	_, err = s.AppendEvents(ctx, stale, []*prpv1.Event{event("a", "runner-1", 7, "harness.exited", nil)})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
	require.Len(t, rowsOf(t, s, "b"), 3)
}

func TestR9_AnIdleSuspensionsEventsWaitForTheScopesNextRunAndAreFiledUnderItsFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, _, err := s.SubmitRun(ctx, id, input("idle", "x"))
		require.NoError(t, err)
	}
	ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{
		event("a", "runner-1", 1, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
	})
	require.NoError(t, err)
	// The idle sweep's suspension reports events with no run open.
	suspended := []*prpv1.Event{
		event("a", "runner-1", 2, "runner.suspended", nil),
		event("a", "runner-1", 3, "harness.exited", nil),
		event("gone", "runner-1", 4, "harness.exited", nil),
	}
	res, err := s.AppendEvents(ctx, store.Fence{}, suspended)
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Parked: 2, Dropped: 1}, res)
	res, err = s.AppendEvents(ctx, store.Fence{}, suspended[:2])
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Duplicates: 2}, res)
	require.Len(t, rowsOf(t, s, "a"), 1, "nothing after a's run.terminal")

	cb, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "b", cb.RunID)
	require.NoError(t, s.RecordControl(ctx, cb.Fence, scope.OfRun("b", input("idle", "x")),
		[]store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a"}}}))
	b := rowsOf(t, s, "b")
	require.Equal(t, []string{"runner.suspended", "harness.exited", "session.authority_rotated"}, types(b))
	for _, r := range b {
		require.EqualValues(t, cb.Attempt, r.Writer)
	}
	// A replay of the same events by the runner is a duplicate.
	res, err = s.AppendEvents(ctx, cb.Fence, suspended[:2])
	require.NoError(t, err)
	require.Equal(t, 2, res.Duplicates)
	var parked int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.parked_events`).Scan(&parked))
	require.Zero(t, parked)
}

func TestR9_ACancelledRunWaitingForItsRetryEndsUnderItsLastAttempt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	require.NoError(t, s.RecordFailure(ctx, c.Fence, store.FailureDecision{Retry: true, NextAttemptAt: time.Now().Add(time.Hour),
		Code: "native_session_interrupted", Message: "runner lost"}))
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "stop"})
	require.NoError(t, err)
	require.True(t, out.Active)
	rs := rowsOf(t, s, "r")
	require.Equal(t, []string{"run.retry_scheduled", "run.terminal"}, types(rs))
	for _, r := range rs {
		require.EqualValues(t, c.Attempt, r.Writer)
	}
}

// A runner restarted as the turn ended sends the run's run.terminal and,
// in the same batch, what it emitted after it under the same run id
// (harness.exited, runner.reconciled): the run takes nothing after its
// terminal, the rest waits for the scope's next run and is filed under it.
func TestR9_EventsAfterTheRunsOwnTerminalInOneBatchGoToTheScopesNextRun(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, _, err := s.SubmitRun(ctx, id, input("restart", "x"))
		require.NoError(t, err)
	}
	ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	res, err := s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{
		event("a", "runner-1", 1, "turn.completed", nil),
		event("a", "runner-1", 2, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
		event("a", "runner-1", 3, "harness.exited", nil),
		event("a", "runner-1", 4, "runner.reconciled", nil),
	})
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Inserted: 2, Parked: 2, Terminal: true, Outcome: store.Terminal{State: store.StateSucceeded}}, res)
	require.Equal(t, []string{"turn.completed", "run.terminal"}, types(rowsOf(t, s, "a")))

	cb, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "b", cb.RunID)
	require.NoError(t, s.RecordControl(ctx, cb.Fence, "", []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a"}}}))
	b := rowsOf(t, s, "b")
	require.Equal(t, []string{"harness.exited", "runner.reconciled", "session.authority_rotated"}, types(b))
	for _, r := range b {
		require.EqualValues(t, cb.Attempt, r.Writer)
	}
}

// A runner that replays a turn after a restart may label the turn's events
// with an earlier run of the scope: the run's own run.terminal, then a
// reconciled turn.completed naming the earlier run, from the same source
// after it. Filed after the terminal, the database refused the batch
// (events_after_terminal) on every attempt, and the run was re-claimed
// every lease TTL without end (chaos, attempt 87). What follows the
// terminal waits for the scope's next run whichever run it names, and the
// terminal is the run's last row even when another source's event follows
// it in the batch.
func TestR9_EventsAfterTheRunsTerminalNamingAnEarlierRunGoToTheScopesNextRunToo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		batch  []*prpv1.Event
		res    store.AppendResult
		rows   []string // of run a
		nextRs []string // of run b, after its control event
	}{{
		name: "the same source's events after the terminal name an earlier run",
		batch: []*prpv1.Event{
			event("p", "runner-2", 1, "item.completed", nil),
			event("a", "runner-2", 2, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
			event("p", "runner-2", 3, "turn.completed", nil),
		},
		res:    store.AppendResult{Inserted: 2, Parked: 1, Terminal: true, Outcome: store.Terminal{State: store.StateSucceeded}},
		rows:   []string{"item.completed", "run.terminal"},
		nextRs: []string{"turn.completed", "session.authority_rotated"},
	}, {
		name: "another source's event follows the terminal in the batch",
		batch: []*prpv1.Event{
			event("a", "runner-2", 2, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
			event("a", "runner-3", 1, "runner.reconciled", nil),
		},
		res:    store.AppendResult{Inserted: 2, Terminal: true, Outcome: store.Terminal{State: store.StateSucceeded}},
		rows:   []string{"runner.reconciled", "run.terminal"},
		nextRs: []string{"session.authority_rotated"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx := context.Background()
			for _, id := range []string{"p", "a", "b"} {
				_, _, err := s.SubmitRun(ctx, id, input("replay", "x"))
				require.NoError(t, err)
			}
			cp, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.Equal(t, "p", cp.RunID)
			_, err = s.AppendEvents(ctx, cp.Fence, []*prpv1.Event{
				event("p", "runner-1", 1, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
			})
			require.NoError(t, err)

			ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.Equal(t, "a", ca.RunID)
			res, err := s.AppendEvents(ctx, ca.Fence, tc.batch)
			require.NoError(t, err, "nothing after the terminal is filed under the run")
			require.Equal(t, tc.res, res)
			require.Equal(t, tc.rows, types(rowsOf(t, s, "a")))

			cb, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.Equal(t, "b", cb.RunID)
			require.NoError(t, s.RecordControl(ctx, cb.Fence, "", []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a"}}}))
			require.Equal(t, tc.nextRs, types(rowsOf(t, s, "b")))
		})
	}
}

// A batch the database refuses for putting a row after the run's terminal
// while the driver's lease holds is not a lost lease: reported as one, the
// driver stopped silently and the run was re-claimed every lease TTL. It is
// the runner's protocol error, which fails the attempt visibly.
func TestR9_ABatchRefusedAfterTheTerminalWhileTheLeaseHoldsIsNotALostLease(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "a", input("two-terminals", "x"))
	require.NoError(t, err)
	ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{
		event("a", "runner-1", 1, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
		event("a", "runner-2", 1, store.EventTerminal, map[string]any{"runTerminalState": "failed"}),
	})
	require.Error(t, err)
	require.EqualValues(t, failure.RunnerProtocolError, failure.CodeOf(err), "%v", err)
	require.Empty(t, rowsOf(t, s, "a"))

	// A stale fence is still a lost lease.
	_, err = s.AppendEvents(ctx, store.Fence{RunID: "a", Owner: "o", Attempt: ca.Attempt + 1}, []*prpv1.Event{
		event("a", "runner-1", 1, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
	})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
}
