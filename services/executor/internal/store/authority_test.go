package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/store"
)

var ctl = store.Controller{Identity: procid.Identity{BootID: "boot-1", PIDNamespace: "pid:[1]", PID: 4242, StartTicks: 77}}

func submitted(t *testing.T, s *store.Store, id string) {
	t.Helper()
	in := input("s-"+id, "x")
	in.Binding.IssueId = "ISS-" + id
	_, _, err := s.SubmitRun(context.Background(), id, in)
	require.NoError(t, err)
}

func TestE7_RenewsOnlyWhenTheExactFencedOwnerRemainsCurrent(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "run-lease")
	c, err := s.ClaimRun(ctx, "run-lease", "owner-lease", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	renewed, err := s.RenewLeases(ctx, "owner-lease", []store.Lease{{RunID: "run-lease", Attempt: c.Attempt}}, time.Minute)
	require.NoError(t, err)
	require.True(t, renewed["run-lease"])
	// Another replica takes the run over after expiry: the old fence renews nothing.
	_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET lease_expires_at = now() - interval '1 second' WHERE run_id = 'run-lease'`)
	require.NoError(t, err)
	_, err = s.ClaimRun(ctx, "run-lease", "owner-2", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	renewed, err = s.RenewLeases(ctx, "owner-lease", []store.Lease{{RunID: "run-lease", Attempt: c.Attempt}}, time.Minute)
	require.NoError(t, err)
	require.False(t, renewed["run-lease"], "native_session_lease_lost for the stale owner")
}

func TestE7_DoesNotReacquireAProviderAfterADurableResultExists(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	_, err := s.Pool().Exec(ctx, `UPDATE executor.coordinators SET phase = 'workspace_finalizing', result_id = 'native-result-1' WHERE run_id = 'r'`)
	require.NoError(t, err)
	_, err = s.ClaimRun(ctx, "r", "o", time.Minute, ctl, nil, nil)
	require.EqualValues(t, failure.NativeResultPendingFinalization, failure.CodeOf(err))
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	none, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, none, "the dispatcher never picks it either")
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Zero(t, run.GetAttempt(), "nothing was written")
}

func TestE7_DoesNotReacquireAProviderWhileDurableCancellationIsPendingOrAcknowledged(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"pending", "acknowledged"} {
		t.Run(state, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			submitted(t, s, "r")
			_, err := s.Pool().Exec(ctx, `UPDATE executor.runs SET result_metadata = jsonb_build_object('nativeCancellation',
			  jsonb_build_object('schema', 'tether.native-cancellation.v1', 'intentId', 'native-cancellation:intent-1', 'dispatchState', $1::text))
			  WHERE run_id = 'r'`, state)
			require.NoError(t, err)
			_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET cancel_state = $1 WHERE run_id = 'r'`, state)
			require.NoError(t, err)
			_, err = s.ClaimRun(ctx, "r", "o", time.Minute, ctl, nil, nil)
			require.EqualValues(t, failure.NativeCancellationPendingRecovery, failure.CodeOf(err))
			none, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
			require.NoError(t, err)
			require.Nil(t, none)
		})
	}
}

func TestE7_ClaimRefusesAChangedBindingAndABusyLeaseUnlessItsControllerIsProvenDead(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	other := &prpv1.Binding{CompanyId: "acme", AgentId: "agent-2", IssueId: "ISS-r"}
	_, err := s.ClaimRun(ctx, "r", "a", time.Minute, ctl, other, nil)
	require.EqualValues(t, failure.NativeExecutionBindingChanged, failure.CodeOf(err))

	c, err := s.ClaimRun(ctx, "r", "a", time.Minute, ctl, &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1", IssueId: "ISS-r"}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Attempt)

	_, err = s.ClaimRun(ctx, "r", "b", time.Minute, ctl, nil, nil)
	require.EqualValues(t, failure.NativeFinalizationLeaseBusy, failure.CodeOf(err))
	require.Equal(t, codes.Aborted, status.Code(err))
	// A proof for another controller (PID reuse, stale attempt) is refused.
	_, err = s.ClaimRun(ctx, "r", "b", time.Minute, ctl, nil,
		&store.DeadProof{Owner: "a", Attempt: 1, Controller: store.Controller{Identity: procid.Identity{BootID: "boot-1", PIDNamespace: "pid:[1]", PID: 4242, StartTicks: 78}}})
	require.EqualValues(t, failure.NativeFinalizationLeaseBusy, failure.CodeOf(err))

	held, err := s.HeldOnHost(ctx, ctl, "b")
	require.NoError(t, err)
	require.Equal(t, []store.Held{{RunID: "r", Owner: "a", Attempt: 1, Controller: ctl}}, held)
	taken, err := s.ClaimRun(ctx, "r", "b", time.Minute, ctl, nil, &store.DeadProof{Owner: "a", Attempt: 1, Controller: ctl})
	require.NoError(t, err)
	require.EqualValues(t, 2, taken.Attempt)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 1, "turn.started", nil)})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err), "the dead controller's fence writes nothing")
}

func TestE7_LeaseTTLBounds(t *testing.T) {
	for ttl, ok := range map[time.Duration]bool{time.Second: true, 20 * time.Minute: true, 999 * time.Millisecond: false, 21 * time.Minute: false} {
		err := store.CheckLeaseTTL(ttl)
		if ok {
			require.NoError(t, err, ttl)
		} else {
			require.EqualValues(t, failure.NativeSessionLeaseTTLInvalid, failure.CodeOf(err), ttl)
		}
	}
}

func TestE11_RetryableFailureRequeuesWithANewTurnGenerationAndProjection(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	c, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Zero(t, c.TurnGeneration)
	// Not due yet: the dispatcher honours next_attempt_at.
	require.NoError(t, s.RecordFailure(ctx, c.Fence, store.FailureDecision{
		Retry: true, NextAttemptAt: time.Now().Add(time.Hour), Code: "native_session_interrupted", Message: "first",
	}))
	notYet, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, notYet)
	_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET phase = 'observed', lease_owner = 'o', lease_expires_at = now() + interval '1 minute', turn_generation = 0 WHERE run_id = 'r'`)
	require.NoError(t, err)
	next := time.Now().Add(-time.Millisecond) // due at once
	require.NoError(t, s.RecordFailure(ctx, c.Fence, store.FailureDecision{
		Retry: true, NextAttemptAt: next, Code: "native_session_interrupted", Message: "provider_stdout_closed: gone",
		Recovery: &executorv1.Recovery{RecoveryOwnerKind: "agent", RecoveryOwnerAgentId: "agent-1",
			RecoveryActionCause: "native_session_interrupted", SupersedeOnIdentityChange: true},
	}))
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "retryable_failure", run.GetPhase())
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
	require.Equal(t, "agent", run.GetRecovery().GetRecoveryOwnerKind())
	require.Equal(t, "native_session_interrupted", run.GetFailure().GetCode())
	again, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.EqualValues(t, 2, again.Attempt)
	require.EqualValues(t, 1, again.TurnGeneration, "a retry starts a new provider turn")

	require.NoError(t, s.RecordFailure(ctx, again.Fence, store.FailureDecision{Code: "native_session_retry_exhausted", Message: "x",
		Recovery: &executorv1.Recovery{Exhausted: true, IssueStatus: "in_review", RecoveryOwnerKind: "board"}}))
	run, err = s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_FAILED, run.GetState())
	require.Equal(t, "in_review", run.GetRecovery().GetIssueStatus())
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	require.Equal(t, []string{"run.retry_scheduled", "run.retry_scheduled", "run.terminal"},
		[]string{evs[0].Event.GetEventType(), evs[1].Event.GetEventType(), evs[2].Event.GetEventType()})
}

func activities(t *testing.T, s *store.Store, run string) []string {
	t.Helper()
	as, err := s.Activities(context.Background(), run)
	require.NoError(t, err)
	var out []string
	for _, a := range as {
		out = append(out, a.Action)
	}
	return out
}

func TestE6_CancellingAQueuedRunEndsItAtOnceAndALateCancelIsNotActive(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.NoError(t, err)
	require.True(t, out.Active)
	require.False(t, out.NeedsDispatch)
	require.Equal(t, "acknowledged", out.Record.GetDispatchState())
	require.False(t, out.Record.GetDispatched(), "no provider was running")
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_CANCELLED, run.GetState())
	require.Equal(t, []string{"native.cancellation_intent_recorded", "native.cancellation_acknowledged"}, activities(t, s, "r"))

	// A finished run without a cancellation: not active, nothing written.
	submitted(t, s, "done")
	c, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("done", "runner-1", 1, "run.terminal",
		map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"})})
	require.NoError(t, err)
	late, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "done", Scope: "run", Reason: "late cancel"})
	require.NoError(t, err)
	require.False(t, late.Active)
	require.Empty(t, activities(t, s, "done"))
}

func TestE6_BindsCancellationToTheRunsIssueAndMergesMetadataUnderRowLocks(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	_, err := s.Pool().Exec(ctx, `UPDATE executor.runs SET result_metadata = '{"durableReceipt":{"operationId":"operation-1"}}' WHERE run_id = 'r'`)
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.NoError(t, err)
	require.True(t, out.NeedsDispatch, "a driven run is cancelled by its driver")
	rec := out.Record
	require.Equal(t, "tether.native-cancellation.v1", rec.GetSchema())
	require.Equal(t, "ISS-r", rec.GetIssueId(), "bound to the run's own issue")
	require.Equal(t, "acme", rec.GetCompanyId())
	require.Equal(t, "pending", rec.GetDispatchState())
	require.NotEmpty(t, rec.GetIntentAuditId())

	require.NoError(t, s.AcknowledgeCancellation(ctx, c.Fence, rec.GetIntentId()))
	var meta map[string]any
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT result_metadata FROM executor.runs WHERE run_id = 'r'`).Scan(&meta))
	require.Equal(t, map[string]any{"operationId": "operation-1"}, meta["durableReceipt"], "other keys survive the merge")
	nc := meta["nativeCancellation"].(map[string]any)
	require.Equal(t, "acknowledged", nc["dispatchState"])
	require.Equal(t, true, nc["dispatched"])
	require.Equal(t, rec.GetIntentAuditId(), nc["intentAuditId"])
	require.NotEmpty(t, nc["acknowledgementAuditId"])
	as, err := s.Activities(ctx, "r")
	require.NoError(t, err)
	require.Len(t, as, 2)
	for _, a := range as {
		require.Equal(t, "acme", a.CompanyID)
		require.Equal(t, "ISS-r", a.IssueID)
		require.Equal(t, "r", a.RunID)
	}
}

func TestE6_RecoversAPostDispatchPersistenceFailureWithoutASecondIntent(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	c, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.NoError(t, err)
	fails := 1
	s.SetHooks(store.Hooks{BeforeCancellationAck: func(string) error {
		if fails > 0 {
			fails--
			return errors.New("injected")
		}
		return nil
	}})
	err = s.AcknowledgeCancellation(ctx, c.Fence, out.Record.GetIntentId())
	require.EqualValues(t, "post_dispatch_db_failure", failure.CodeOf(err))
	rec, err := s.Cancellation(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "pending", rec.GetDispatchState())
	require.False(t, rec.GetDispatched())

	again, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.NoError(t, err)
	require.True(t, again.NeedsDispatch)
	require.Equal(t, out.Record.GetIntentAuditId(), again.Record.GetIntentAuditId(), "no second intent")
	require.NoError(t, s.AcknowledgeCancellation(ctx, c.Fence, out.Record.GetIntentId()))
	third, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.NoError(t, err)
	require.False(t, third.NeedsDispatch)
	require.True(t, third.Record.GetDispatched())
	require.NoError(t, s.AcknowledgeCancellation(ctx, c.Fence, out.Record.GetIntentId()), "a repeated ack is a no-op")
	require.Equal(t, []string{"native.cancellation_intent_recorded", "native.cancellation_acknowledged"}, activities(t, s, "r"))
}

func TestE6_FailsClosedWhenThePersistedRunHasNoCoordinator(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	_, err := s.Pool().Exec(ctx, `DELETE FROM executor.coordinators WHERE run_id = 'r'`)
	require.NoError(t, err)
	_, err = s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
	require.EqualValues(t, failure.NativeCancellationCoordinatorMissing, failure.CodeOf(err))
	var meta string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT result_metadata::text FROM executor.runs WHERE run_id = 'r'`).Scan(&meta))
	require.Equal(t, "{}", meta, "no writes")
	require.Empty(t, activities(t, s, "r"), "no audit")
}

// SPEC P2: a cancellation dispatched to the runner is acknowledged in the
// transaction that persists the run's terminal (the turn ended: the
// provider has nothing left to do), one commit instead of two and without
// waiting for the runner's answer; a batch without the terminal
// acknowledges nothing, and an acknowledgement that fails leaves the
// events persisted and the record pending for the runner's answer.
func TestP2_ACancellationIsAcknowledgedInTheCommitOfTheRunsTerminal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled := func(t *testing.T, s *store.Store) (store.Fence, string) {
		submitted(t, s, "r")
		c, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
		require.NoError(t, err)
		out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "budget hard stop"})
		require.NoError(t, err)
		return c.Fence, out.Record.GetIntentId()
	}
	interrupted := func(seq uint64) *prpv1.Event {
		return event("r", "runner-1", seq, "turn.interrupted", map[string]any{})
	}
	terminal := func(seq uint64) *prpv1.Event {
		return event("r", "runner-1", seq, "run.terminal", map[string]any{"turnTerminalState": "interrupted", "runTerminalState": "cancelled"})
	}

	t.Run("with the terminal", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		f, intent := cancelled(t, s)
		res, err := s.AppendEventsAcking(ctx, f, []*prpv1.Event{interrupted(1)}, []string{intent})
		require.NoError(t, err)
		require.Empty(t, res.Acknowledged, "no terminal, no acknowledgement")
		rec, err := s.Cancellation(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "pending", rec.GetDispatchState())

		res, err = s.AppendEventsAcking(ctx, f, []*prpv1.Event{terminal(2)}, []string{intent})
		require.NoError(t, err)
		require.True(t, res.Terminal)
		require.Equal(t, []string{intent}, res.Acknowledged)
		rec, err = s.Cancellation(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "acknowledged", rec.GetDispatchState())
		require.True(t, rec.GetDispatched())
		require.NoError(t, s.AcknowledgeCancellation(ctx, f, intent), "the runner's later answer is a no-op")
		require.Equal(t, []string{"native.cancellation_intent_recorded", "native.cancellation_acknowledged"}, activities(t, s, "r"))
	})
	t.Run("a failed acknowledgement", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		f, intent := cancelled(t, s)
		s.SetHooks(store.Hooks{BeforeCancellationAck: func(string) error { return errors.New("injected") }})
		res, err := s.AppendEventsAcking(ctx, f, []*prpv1.Event{interrupted(1), terminal(2)}, []string{intent})
		require.NoError(t, err)
		require.True(t, res.Terminal, "the events are persisted")
		require.Empty(t, res.Acknowledged)
		run, err := s.GetRun(ctx, "r")
		require.NoError(t, err)
		require.EqualValues(t, 2, run.GetEventCount())
		rec, err := s.Cancellation(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "pending", rec.GetDispatchState())
		s.SetHooks(store.Hooks{})
		require.NoError(t, s.AcknowledgeCancellation(ctx, f, intent), "the runner's answer acknowledges it")
		require.Equal(t, []string{"native.cancellation_intent_recorded", "native.cancellation_acknowledged"}, activities(t, s, "r"))
	})
}
