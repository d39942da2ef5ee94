package store_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// roundTrips counts a pool's round trips to the server two ways: what pgx
// sends (each statement outside a batch, each batch) and what crosses the
// wire (each write after a read: a flush the client then waits on).
type roundTrips struct {
	mu                  sync.Mutex
	statements, batches int
	wire                int
	waiting             bool // written since the last read
	sql                 []string
}

func (r *roundTrips) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statements, r.batches, r.wire, r.sql = 0, 0, 0, nil
}

// count returns the statements and batches pgx sent, and the wire's round
// trips, since the last reset.
func (r *roundTrips) count() (pgxRoundTrips, wire int, sql []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statements + r.batches, r.wire, slices.Clone(r.sql)
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statements++
	r.sql = append(r.sql, d.SQL)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	r.sql = append(r.sql, fmt.Sprintf("batch of %d", d.Batch.Len()))
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

type countingConn struct {
	net.Conn
	r *roundTrips
}

func (c countingConn) Write(p []byte) (int, error) {
	c.r.mu.Lock()
	if !c.r.waiting {
		c.r.wire++
		c.r.waiting = true
	}
	c.r.mu.Unlock()
	return c.Conn.Write(p)
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.r.mu.Lock()
		c.r.waiting = false
		c.r.mu.Unlock()
	}
	return n, err
}

// countedStore is a store on one connection whose round trips r counts.
func countedStore(t *testing.T) (*store.Store, *roundTrips) {
	t.Helper()
	r := &roundTrips{}
	s, err := store.Open(context.Background(), pgtest.NewDB(t, Migrator), runrules.New(), pgstore.MaxConns(1), func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = r
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: conn, r: r}, nil
		}
	})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, r
}

// endOf is a turn's last batch: its completed item and the run's terminal.
func endOf(run string, from uint64, state string) []*prpv1.Event {
	turn := map[string]string{store.StateSucceeded: "completed", store.StateCancelled: "interrupted", store.StateFailed: "failed"}[state]
	return []*prpv1.Event{
		event(run, "runner-1", from, "item.completed", map[string]any{"text": "done"}),
		event(run, "runner-1", from+1, store.EventTerminal, map[string]any{
			"runTerminalState": state, "turnTerminalState": turn, "finalMessage": "done"}),
	}
}

// warmed claims a run on s and ends it, so that the connection has
// prepared the careful path's statements (as a replica's long-lived
// connections have), then claims runID.
func warmed(t *testing.T, s *store.Store, runID string) *store.Claim {
	t.Helper()
	w := claimed(t, s, "warm-"+runID, "o")
	_, err := s.AppendEvents(context.Background(), w.Fence, endOf(w.RunID, 1, store.StateSucceeded))
	require.NoError(t, err)
	return claimed(t, s, runID, "o")
}

// SPEC P4: the commit of a turn's terminal batch (the careful path: the
// fenced lock, the dedupe read, the insert, the count, the governed wait
// read, the run's finish, the notification) is pipelined: BEGIN with the
// lock and the reads, then the writes with the COMMIT — two round trips
// where the statements one by one took ten (three with the COMMIT sent
// after the writes' results were read: a lost fence now fails the batch,
// COMMIT included, instead of being read from the finish's row count).
func TestP4_TheTerminalBatchCommitsInTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, r := countedStore(t)
	c := warmed(t, s, "r")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 3))
	require.NoError(t, err)

	s.FlushNotifications()
	r.reset()
	res, err := s.AppendEvents(ctx, c.Fence, endOf("r", 4, store.StateSucceeded))
	require.NoError(t, err)
	s.FlushNotifications()
	pgxTrips, wire, sql := r.count()
	require.Equal(t, 2, pgxTrips, "statements and batches sent: %q", sql)
	require.Equal(t, 2, wire, "round trips on the wire: %q", sql)

	require.Equal(t, store.AppendResult{Inserted: 2, Terminal: true, Outcome: store.Terminal{State: store.StateSucceeded}}, res)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState())
	require.Equal(t, store.PhaseCompleted, run.GetPhase())
	require.EqualValues(t, 5, run.GetEventCount())
	require.Equal(t, "done", run.GetResult().GetFinalMessage())
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 5)
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq)
		require.EqualValues(t, i+1, e.Event.GetSourceSeq())
	}
	require.Equal(t, store.EventTerminal, evs[4].Event.GetEventType())
	require.Equal(t, "done", evs[4].Result.GetFinalMessage(), "the result committed with the terminal")
}

// SPEC P4: a replayed terminal batch (the runner resent it: its
// acknowledgement was lost) drops what is stored with the same bytes and
// files the rest in the same two round trips; replayed after the run's
// finish, the fenced lock finds the lease gone (it ended with the run) and
// nothing is written, as before; the same source seqs with other bytes are
// refused, writing nothing.
func TestP4_AReplayedTerminalBatchIsDeduplicated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, r := countedStore(t)
	c := warmed(t, s, "r")
	batch := endOf("r", 1, store.StateSucceeded)
	// The turn's first event is stored; the batch comes again with the
	// run's terminal.
	_, err := s.AppendEvents(ctx, c.Fence, batch[:1])
	require.NoError(t, err)
	s.FlushNotifications()
	r.reset()
	res, err := s.AppendEvents(ctx, c.Fence, batch)
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Inserted: 1, Duplicates: 1, Terminal: true, Outcome: store.Terminal{State: store.StateSucceeded}}, res)
	s.FlushNotifications()
	pgxTrips, wire, sql := r.count()
	require.Equal(t, 2, pgxTrips, "%q", sql)
	require.Equal(t, 2, wire, "%q", sql)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 2, run.GetEventCount())
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState())

	// The whole batch again, after the run's finish.
	s.FlushNotifications()
	r.reset()
	res, err = s.AppendEvents(ctx, c.Fence, batch)
	s.FlushNotifications()
	pgxTrips, wire, sql = r.count()
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "%v", err)
	require.Equal(t, codes.Aborted, status.Code(err))
	require.Zero(t, res.Inserted)
	require.Equal(t, 2, pgxTrips, "BEGIN with the lock, ROLLBACK: %q", sql)
	require.Equal(t, 2, wire, "%q", sql)
	after, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 2, after.GetEventCount())

	// A replay of stored source seqs with other bytes (the turn's first
	// event stored, then resent changed beside the terminal).
	c2 := claimed(t, s, "r2", "o")
	_, err = s.AppendEvents(ctx, c2.Fence, endOf("r2", 1, store.StateSucceeded)[:1])
	require.NoError(t, err)
	changed := endOf("r2", 1, store.StateSucceeded)
	changed[0] = event("r2", "runner-1", 1, "item.completed", map[string]any{"text": "other"})
	_, err = s.AppendEvents(ctx, c2.Fence, changed)
	require.EqualValues(t, failure.NativeEventReplayConflict, failure.CodeOf(err), "%v", err)
	run2, err := s.GetRun(ctx, "r2")
	require.NoError(t, err)
	require.EqualValues(t, 1, run2.GetEventCount())
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run2.GetState(), "nothing of the refused batch was written")
}

// SPEC P4, E7: a terminal batch from a writer whose fence no longer holds
// (a stale attempt, another owner) writes nothing and fails with the code
// it always did (native_session_lease_lost), whether the lock finds the
// fence gone or the run's finish does (the coordinator taken over between
// the two).
func TestP4_AFencedOutTerminalBatchWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 2))
	require.NoError(t, err)

	for _, stale := range []store.Fence{
		{RunID: "r", Owner: "o", Attempt: c.Fence.Attempt + 1},
		{RunID: "r", Owner: "other", Attempt: c.Fence.Attempt},
	} {
		res, err := s.AppendEvents(ctx, stale, endOf("r", 3, store.StateSucceeded))
		require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "%+v: %v", stale, err)
		require.Equal(t, codes.Aborted, status.Code(err))
		require.Zero(t, res.Inserted)
		require.False(t, res.Terminal)
	}
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 2, run.GetEventCount())
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())

	// The lease lost between the lock and the finish: the coordinator's
	// fenced update finds no row, and the whole transaction is rolled
	// back (a trigger stands in for the takeover, taking the coordinator
	// as the batch's insert lands).
	takeOverAtEvent(t, s, "run.terminal")
	res, err := s.AppendEvents(ctx, c.Fence, endOf("r", 3, store.StateSucceeded))
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "%v", err)
	require.False(t, res.Terminal)
	run, err = s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 2, run.GetEventCount(), "the insert was rolled back")
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())
	require.Equal(t, "o", run.GetLeaseOwner(), "the takeover was rolled back with it")
}

// SPEC P4, P2: a cancellation acknowledged in the terminal's commit rides
// in its second round trip (its record read in the first); an
// acknowledgement whose write fails in the database is rolled back alone
// (its savepoint), the events and the run's finish committed.
func TestP4_ATerminalAcknowledgesItsCancellationInTheSameTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled := func(t *testing.T, s *store.Store, run string) (store.Fence, string) {
		c := claimed(t, s, run, "o")
		out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: run, Scope: "run", Reason: "budget hard stop"})
		require.NoError(t, err)
		return c.Fence, out.Record.GetIntentId()
	}

	t.Run("acknowledged", func(t *testing.T) {
		t.Parallel()
		s, r := countedStore(t)
		// Warm the connection with a run acknowledged the same way.
		wf, wi := cancelled(t, s, "warm")
		_, err := s.AppendEventsAcking(ctx, wf, endOf("warm", 1, store.StateCancelled), []string{wi})
		require.NoError(t, err)

		f, intent := cancelled(t, s, "r")
		s.FlushNotifications()
		r.reset()
		res, err := s.AppendEventsAcking(ctx, f, endOf("r", 1, store.StateCancelled), []string{"an-older-intent", intent})
		require.NoError(t, err)
		s.FlushNotifications()
		pgxTrips, wire, sql := r.count()
		require.Equal(t, 2, pgxTrips, "%q", sql)
		require.Equal(t, 2, wire, "%q", sql)
		require.True(t, res.Terminal)
		require.Equal(t, []string{"an-older-intent", intent}, res.Acknowledged, "an intent the record is not pending for is a no-op")
		rec, err := s.Cancellation(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "acknowledged", rec.GetDispatchState())
		require.True(t, rec.GetDispatched())
		require.NotEmpty(t, rec.GetAcknowledgementAuditId())
		require.Equal(t, []string{"native.cancellation_intent_recorded", "native.cancellation_acknowledged"}, activities(t, s, "r"))
		var cancelState string
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cancel_state FROM executor.coordinators WHERE run_id = 'r'`).Scan(&cancelState))
		require.Equal(t, "acknowledged", cancelState)
		run, err := s.GetRun(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, executorv1.RunState_RUN_STATE_CANCELLED, run.GetState())
		require.NoError(t, s.AcknowledgeCancellation(ctx, f, intent), "the runner's later answer is a no-op")
		require.Len(t, activities(t, s, "r"), 2)
	})

	t.Run("its write fails", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		f, intent := cancelled(t, s, "r")
		_, err := s.Pool().Exec(ctx, `
CREATE FUNCTION executor.test_refuse_ack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'injected: acknowledgement refused';
END $$;
CREATE TRIGGER test_refuse_ack BEFORE INSERT ON executor.activities FOR EACH ROW
  WHEN (NEW.action = 'native.cancellation_acknowledged') EXECUTE FUNCTION executor.test_refuse_ack();`)
		require.NoError(t, err)
		res, err := s.AppendEventsAcking(ctx, f, endOf("r", 1, store.StateCancelled), []string{intent})
		require.NoError(t, err)
		require.True(t, res.Terminal, "the events and the finish are committed")
		require.Equal(t, 2, res.Inserted)
		require.Empty(t, res.Acknowledged)
		run, err := s.GetRun(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, executorv1.RunState_RUN_STATE_CANCELLED, run.GetState())
		require.EqualValues(t, 2, run.GetEventCount())
		rec, err := s.Cancellation(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "pending", rec.GetDispatchState(), "the acknowledgement was rolled back alone")
		require.Equal(t, []string{"native.cancellation_intent_recorded"}, activities(t, s, "r"))
	})
}

// SPEC P4, E4: a terminal batch that opens an interaction is a governed
// wait on it: its wait read follows the batch's writes (it must see the
// interaction), one batch split in two around it.
func TestP4_ATerminalBatchThatOpensAnInteractionWaitsOnIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, r := countedStore(t)
	c := warmed(t, s, "r")
	call := event("r", "runner-1", 1, "semantic_tool.input", askUserCall("call-1", map[string]any{
		"title": "Pick one", "questions": []any{map[string]any{"id": "q", "prompt": "Which?",
			"options": []any{map[string]any{"id": "a", "label": "A"}}}}}))
	s.FlushNotifications()
	r.reset()
	res, err := s.AppendEvents(ctx, c.Fence, append([]*prpv1.Event{call}, endOf("r", 2, store.StateSucceeded)...))
	require.NoError(t, err)
	require.True(t, res.Terminal)
	s.FlushNotifications()
	pgxTrips, _, sql := r.count()
	require.Equal(t, 4, pgxTrips, "BEGIN+reads, the insert and the interaction, the wait read, the finish with the COMMIT: %q", sql)
	list, _, err := s.ListInteractions(ctx, store.InteractionFilter{RunID: "r"}, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "yielded", run.GetResult().GetReportedWorkDisposition())
	require.Equal(t, "interaction-response:"+list[0].GetInteractionId(), run.GetResult().GetContinuation().GetIdempotencyKey())
}

// BenchmarkP4_TerminalBatchCommit times the commit of a turn's terminal
// batch ([item.completed, run.terminal], the careful path) and, for
// reference, a one-statement append of two deltas, on a throwaway cluster
// with fsync off (what the round trips cost, the disk aside) and on a
// durable one (fsync on: the commit's WAL flush included). Besides ns/op
// (the mean) it reports the median (p50-ms), which a shared box disturbs
// less.
func BenchmarkP4_TerminalBatchCommit(b *testing.B) {
	for _, durable := range []bool{false, true} {
		name := "fsync=off"
		var opts []pgtest.Option
		if durable {
			name, opts = "fsync=on", []pgtest.Option{pgtest.WithDurable()}
		}
		b.Run(name, func(b *testing.B) { benchTerminalCommit(b, opts...) })
	}
}

func benchTerminalCommit(b *testing.B, opts ...pgtest.Option) {
	ctx := context.Background()
	c, err := pgtest.Start(ctx, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	dsn := c.DSN("postgres")
	if err := store.Migrate(ctx, dsn); err != nil {
		b.Fatal(err)
	}
	s, err := store.Open(ctx, dsn, runrules.New())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	runs := 0
	claim := func() *store.Claim {
		runs++
		id := fmt.Sprintf("bench-%d", runs)
		if _, _, err := s.SubmitRun(ctx, id, input("s-"+id, "x")); err != nil {
			b.Fatal(err)
		}
		cl, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
		if err != nil || cl == nil || cl.RunID != id {
			b.Fatalf("claim %s: %v %v", id, cl, err)
		}
		return cl
	}
	median := func(b *testing.B, took []time.Duration) {
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	}
	b.Run("terminal", func(b *testing.B) {
		took := make([]time.Duration, 0, b.N)
		for range b.N {
			b.StopTimer()
			cl := claim()
			b.StartTimer()
			start := time.Now()
			res, err := s.AppendEvents(ctx, cl.Fence, endOf(cl.RunID, 1, store.StateSucceeded))
			took = append(took, time.Since(start))
			if err != nil || !res.Terminal {
				b.Fatal(res, err)
			}
		}
		median(b, took)
	})
	b.Run("fast_append", func(b *testing.B) {
		cl := claim()
		took := make([]time.Duration, 0, b.N)
		for i := range b.N {
			start := time.Now()
			if _, err := s.AppendEvents(ctx, cl.Fence, deltas(cl.RunID, "runner-1", 1+2*i, 2)); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		median(b, took)
	})
}
