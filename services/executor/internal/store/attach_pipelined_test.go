package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// SPEC P4: a warm attach's bookkeeping (the fenced lock, the checkpoints'
// supersede, the parked events, the authority rotation's control event,
// the run's event count, the runner record) is pipelined: BEGIN with the
// lock and the reads, then the writes with the COMMIT — two round trips
// where the statements one by one took nine (three with the COMMIT after
// the writes' results were read); the notification follows the commit,
// beside the caller. A stale fence writes nothing in two (BEGIN with the
// lock, ROLLBACK).
func TestP4_RecordAttachCommitsInTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, r := countedStore(t)
	rotated := func(prev string) []store.ControlEvent {
		return []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: prev}}}
	}
	rec := store.RunnerRecord{InstanceID: "runner-1", Runner: &prpv1.ProcessInfo{Pid: 42}}
	// A run whose attach prepares the statements on the one connection, as
	// a replica's long-lived connections have them.
	w := claimed(t, s, "warm", "o")
	require.NoError(t, s.RecordAttach(ctx, w.Fence, "s-warm", rotated("w0"), rec))
	_, err := s.AppendEvents(ctx, w.Fence, endOf("warm", 1, store.StateSucceeded))
	require.NoError(t, err)

	c := claimed(t, s, "r", "o")
	stale := c.Fence
	stale.Attempt++
	s.FlushNotifications()
	r.reset()
	err = s.RecordAttach(ctx, stale, "s-r", rotated("r0"), rec)
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "%v", err)
	s.FlushNotifications()
	pgxTrips, wire, sql := r.count()
	require.Equal(t, 2, pgxTrips, "BEGIN with the lock, ROLLBACK: %q", sql)
	require.Equal(t, 2, wire, "%q", sql)

	s.FlushNotifications()
	r.reset()
	require.NoError(t, s.RecordAttach(ctx, c.Fence, "s-r", rotated("r0"), rec))
	s.FlushNotifications()
	pgxTrips, wire, sql = r.count()
	require.Equal(t, 3, pgxTrips, "BEGIN with the lock and reads, the writes with the COMMIT; the notification: %q", sql)
	require.Equal(t, 3, wire, "%q", sql)

	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 1, run.GetEventCount())
	require.Equal(t, "runner-1", run.GetRunnerInstanceId())
	require.EqualValues(t, 42, run.GetRunnerProcess().GetPid())
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, "session.authority_rotated", evs[0].Event.GetEventType())
	require.EqualValues(t, 1, evs[0].Seq)
	require.EqualValues(t, 1, evs[0].Event.GetSourceSeq())
	require.Equal(t, "r:"+store.ControlInstance+":1", evs[0].Event.GetSourceEventId())

	// The runner record alone is one statement.
	s.FlushNotifications()
	r.reset()
	require.NoError(t, s.RecordAttach(ctx, c.Fence, "", nil, store.RunnerRecord{InstanceID: "runner-2"}))
	s.FlushNotifications()
	pgxTrips, _, sql = r.count()
	require.Equal(t, 1, pgxTrips, "%q", sql)
	run, err = s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "runner-2", run.GetRunnerInstanceId())
	require.EqualValues(t, 1, run.GetEventCount())
}

// SPEC R9 through the pipelined attach (RecordAttach): the events parked
// for the scope are filed under the next run's fence before its control
// events, which continue the run's control source seqs; a replacement is
// applied once, so a second attempt's bookkeeping appends no second
// continuity break.
func TestR9_ParkedEventsGoBeforeThePipelinedAttachsControlEvents(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("attach-parked", "x")
	sc := scope.OfRun("a", in)
	for _, id := range []string{"a", "b"} {
		_, _, err := s.SubmitRun(ctx, id, in)
		require.NoError(t, err)
	}
	ca, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.RecordRunner(ctx, ca.Fence, "runner-1", nil, nil))
	res, err := s.AppendEvents(ctx, ca.Fence, []*prpv1.Event{
		event("a", "runner-1", 1, "turn.completed", nil),
		event("a", "runner-1", 2, store.EventTerminal, map[string]any{"runTerminalState": "succeeded"}),
		event("a", "runner-1", 3, "harness.exited", nil),
		event("a", "runner-1", 4, "runner.reconciled", nil),
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.Parked)
	rep, err := s.RecordReplacement(ctx, store.ReplacementRequest{Scope: sc, CompanyID: "acme", SessionID: "attach-parked",
		RequestedBy: "alice", Caller: "addr:test", Reason: "host lost"})
	require.NoError(t, err)

	cb, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "b", cb.RunID)
	control := []store.ControlEvent{
		{Type: "session.continuity_break", Replacement: rep.GetReplacementId(), Payload: &prpv1.SessionContinuityBreak{Why: "host lost"}},
		{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a"}},
	}
	rec := store.RunnerRecord{InstanceID: "runner-1"}
	require.NoError(t, s.RecordAttach(ctx, cb.Fence, sc, control, rec))
	require.NoError(t, s.RecordAttach(ctx, cb.Fence, sc, control, rec))
	b := rowsOf(t, s, "b")
	require.Equal(t, []string{"harness.exited", "runner.reconciled", "session.continuity_break", "session.authority_rotated",
		"session.authority_rotated"}, types(b))
	for _, r := range b {
		require.EqualValues(t, cb.Attempt, r.Writer)
	}
	evs, err := s.EventsAfter(ctx, "b", 0, 10)
	require.NoError(t, err)
	var seqs []uint64
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq)
		if e.Event.GetSourceInstanceId() == store.ControlInstance {
			seqs = append(seqs, e.Event.GetSourceSeq())
		}
	}
	require.Equal(t, []uint64{1, 2, 3}, seqs)
	run, err := s.GetRun(ctx, "b")
	require.NoError(t, err)
	require.EqualValues(t, 5, run.GetEventCount())
	reps, err := s.Replacements(ctx, sc)
	require.NoError(t, err)
	require.Equal(t, "b", reps[0].GetAppliedRunId())
}

// SPEC P2: recording a cancellation of a driven run (the first step of
// every cancellation's path) is pipelined: BEGIN with the run's and its
// coordinator's locks, the activity, the record's merge and its
// notification, COMMIT — three round trips where the statements one by one
// took eight. The record is what it was: pending, audited, mirrored on the
// coordinator; a repeated call finds it and re-notifies.
func TestP2_RecordingACancellationCommitsInThreeRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, r := countedStore(t)
	w := claimed(t, s, "warm", "o")
	_, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "warm", Scope: "run", Reason: "warm", Actor: "test"})
	require.NoError(t, err)
	_, err = s.AppendEventsAcking(ctx, w.Fence, endOf("warm", 1, store.StateCancelled), nil)
	require.NoError(t, err)

	claimed(t, s, "r", "o")
	s.FlushNotifications()
	r.reset()
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "stop", RequestID: "q1", Actor: "test"})
	require.NoError(t, err)
	s.FlushNotifications()
	pgxTrips, wire, sql := r.count()
	require.Equal(t, 3, pgxTrips, "BEGIN with the locks, the writes and the notification, COMMIT: %q", sql)
	require.Equal(t, 3, wire, "%q", sql)
	require.True(t, out.Active)
	require.True(t, out.NeedsDispatch)
	require.Equal(t, "pending", out.Record.GetDispatchState())
	stored, err := s.Cancellation(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, out.Record.GetIntentId(), stored.GetIntentId())
	require.Equal(t, "pending", stored.GetDispatchState())
	require.Equal(t, "q1", stored.GetRequestId())

	again, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "stop", Actor: "test"})
	require.NoError(t, err)
	require.Equal(t, out.Record.GetIntentId(), again.Record.GetIntentId())
	require.True(t, again.NeedsDispatch)

	_, err = s.RecordCancellation(ctx, store.CancelRequest{RunID: "nope", Scope: "run", Reason: "x"})
	require.EqualValues(t, failure.RunNotFound, failure.CodeOf(err), "%v", err)
}

// SPEC P4, R9: the fence lost between the bookkeeping's lock and its
// runner record (the COMMIT pipelined behind the record) writes nothing:
// the record's statement fails, the COMMIT is skipped and the transaction
// rolled back (a trigger stands in for the takeover, taking the
// coordinator as the control event lands).
func TestP4_RecordAttachLosingItsFenceAtTheRunnerRecordWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	c := claimed(t, s, "r", "o")
	takeOverAtEvent(t, s, "session.authority_rotated")
	err := s.RecordAttach(ctx, c.Fence, "s-r", []store.ControlEvent{{Type: "session.authority_rotated",
		Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "r0"}}}, store.RunnerRecord{InstanceID: "runner-1"})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "%v", err)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Zero(t, run.GetEventCount())
	require.Empty(t, run.GetRunnerInstanceId())
	require.Equal(t, "o", run.GetLeaseOwner(), "the takeover was rolled back with it")
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Empty(t, evs)
}

// takeOverAtEvent installs a trigger that stands in for a takeover: when
// an event of type typ is inserted, another owner takes its run's
// coordinator (inside the inserting transaction).
func takeOverAtEvent(t *testing.T, s *store.Store, typ string) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `
CREATE FUNCTION executor.test_take_over() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE executor.coordinators SET lease_owner = 'thief' WHERE run_id = NEW.run_id;
  RETURN NEW;
END $$;
CREATE TRIGGER test_take_over AFTER INSERT ON executor.events FOR EACH ROW
  WHEN (NEW.event_type = '`+typ+`') EXECUTE FUNCTION executor.test_take_over();`)
	require.NoError(t, err)
}
