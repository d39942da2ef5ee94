package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestF3_AReplaceSessionDecisionIsRefusedUnderALiveRunKeptOnceWhilePendingAndAppliedByOneRun(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("replace", "x")
	sc := scope.OfRun("p1", in)
	req := store.ReplacementRequest{Scope: sc, CompanyID: "acme", SessionID: "replace", RequestedBy: "alice", Caller: "addr:test", Reason: "host lost"}
	_, _, err := s.SubmitRun(ctx, "p1", in)
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)

	// A run of the scope in flight: its runner serves it now.
	_, err = s.RecordReplacement(ctx, req)
	require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err))
	facts, err := s.AttachFacts(ctx, "p1", sc, in, 8)
	require.NoError(t, err)
	require.False(t, facts.ContinuityRequired, "the scope's first run")
	require.NoError(t, s.RecordRunner(ctx, c.Fence, "runner-1", nil, nil))
	_, err = s.AppendEvents(ctx, c.Fence, terminalOf("p1"))
	require.NoError(t, err)

	// Pending: asking again returns the same decision.
	a, err := s.RecordReplacement(ctx, req)
	require.NoError(t, err)
	b, err := s.RecordReplacement(ctx, store.ReplacementRequest{Scope: sc, CompanyID: "acme", SessionID: "replace", RequestedBy: "bob", Caller: "x", Reason: "again"})
	require.NoError(t, err)
	require.Equal(t, a.GetReplacementId(), b.GetReplacementId())
	require.Equal(t, "alice", b.GetRequestedBy())

	_, _, err = s.SubmitRun(ctx, "p2", in)
	require.NoError(t, err)
	c2, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	facts, err = s.AttachFacts(ctx, "p2", sc, in, 8)
	require.NoError(t, err)
	require.True(t, facts.ContinuityRequired, "a runner served p1")
	require.Equal(t, a.GetReplacementId(), facts.Replacement.GetReplacementId())

	// Applied once: a second attempt's bookkeeping appends nothing more.
	ev := store.ControlEvent{Type: "session.continuity_break", Replacement: a.GetReplacementId(), Payload: &prpv1.SessionContinuityBreak{Why: "host lost"}}
	require.NoError(t, s.RecordControl(ctx, c2.Fence, sc, []store.ControlEvent{ev}))
	require.NoError(t, s.RecordControl(ctx, c2.Fence, sc, []store.ControlEvent{ev}))
	stored, err := s.EventsAfter(ctx, "p2", 0, 100)
	require.NoError(t, err)
	require.Len(t, stored, 1)
	require.Equal(t, "session.continuity_break", stored[0].Event.GetEventType())
	facts, err = s.AttachFacts(ctx, "p2", sc, in, 8)
	require.NoError(t, err)
	require.Equal(t, "p2", facts.Replacement.GetAppliedRunId(), "a later attempt of p2 still sees the decision it applied")
	reps, err := s.Replacements(ctx, sc)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	require.Equal(t, "p2", reps[0].GetAppliedRunId())

	// Once applied, a new decision may be recorded.
	_, err = s.AppendEvents(ctx, c2.Fence, terminalOf("p2"))
	require.NoError(t, err)
	d, err := s.RecordReplacement(ctx, req)
	require.NoError(t, err)
	require.NotEqual(t, a.GetReplacementId(), d.GetReplacementId())
}

func terminalOf(run string) []*prpv1.Event {
	return []*prpv1.Event{event(run, "runner-"+run, 1, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})}
}

func TestF3_ARunInFlightRestoresTheCheckpointItsAttemptStartedFromUntilARunSettlesAfterIt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("inflight", "x")
	sc := scope.OfRun("i1", in)
	_, _, err := s.SubmitRun(ctx, "i1", in)
	require.NoError(t, err)
	c1, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.RecordRunner(ctx, c1.Fence, "runner-1", nil, nil))
	_, err = s.AppendEvents(ctx, c1.Fence, terminalOf("i1"))
	require.NoError(t, err)
	_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "inflight", LastRunID: "i1",
		GatewayScope: sc, Stamp: &backupv1.Stamp{CheckpointId: "cp-1"}, CheckpointID: "cp-1", ManifestDigest: "sha256:00",
		LeaseID: "l", RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "idle"})
	require.NoError(t, err)

	// i2 attaches a runner (the checkpoint is superseded) and its gateway
	// is lost mid-turn: its next attempt still restores cp-1.
	_, _, err = s.SubmitRun(ctx, "i2", in)
	require.NoError(t, err)
	c2, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.RecordControl(ctx, c2.Fence, sc, nil))
	require.NoError(t, s.RecordRunner(ctx, c2.Fence, "runner-1", nil, nil))
	facts, err := s.AttachFacts(ctx, "i2", sc, in, 8)
	require.NoError(t, err)
	require.Nil(t, facts.Checkpoint, "superseded")
	require.Equal(t, "cp-1", facts.Restorable.GetCheckpointId())

	// Once i2 settled, cp-1 lacks its turn: nothing is restorable.
	_, err = s.AppendEvents(ctx, c2.Fence, terminalOf("i2"))
	require.NoError(t, err)
	_, _, err = s.SubmitRun(ctx, "i3", in)
	require.NoError(t, err)
	facts, err = s.AttachFacts(ctx, "i3", sc, in, 8)
	require.NoError(t, err)
	require.Nil(t, facts.Restorable)
	require.True(t, facts.ContinuityRequired)
}

// TestF9_AFailedOrCancelledRunAfterTheOnlyCheckpointNeverMakesItUnrestorable:
// a run that a runner served after the checkpoint and that failed (or was
// cancelled) settles no turn the thread must keep, so the checkpoint stays
// the one a run restores when the root is gone and the scope may still
// move (CanFailOver); only a succeeded run after it retires it.
func TestF9_AFailedOrCancelledRunAfterTheOnlyCheckpointNeverMakesItUnrestorable(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"failed", "cancelled"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx := context.Background()
			in := input("only-"+state, "x")
			sc := scope.OfRun("o1", in)
			_, _, err := s.SubmitRun(ctx, "o1", in)
			require.NoError(t, err)
			c1, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.NoError(t, s.RecordRunner(ctx, c1.Fence, "runner-1", nil, nil))
			_, err = s.AppendEvents(ctx, c1.Fence, terminalOf("o1"))
			require.NoError(t, err)
			_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "only-" + state, LastRunID: "o1",
				GatewayScope: sc, Stamp: &backupv1.Stamp{CheckpointId: "cp-1"}, CheckpointID: "cp-1", ManifestDigest: "sha256:00",
				LeaseID: "l", RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "idle"})
			require.NoError(t, err)

			// o2 attaches a runner (the checkpoint is superseded) and ends
			// without success.
			_, _, err = s.SubmitRun(ctx, "o2", in)
			require.NoError(t, err)
			c2, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.NoError(t, s.RecordControl(ctx, c2.Fence, sc, nil))
			require.NoError(t, s.RecordRunner(ctx, c2.Fence, "runner-1", nil, nil))
			_, err = s.AppendEvents(ctx, c2.Fence, []*prpv1.Event{event("o2", "runner-o2", 1, "run.terminal", map[string]any{
				"turnTerminalState": map[string]string{"failed": "failed", "cancelled": "interrupted"}[state], "runTerminalState": state})})
			require.NoError(t, err)
			run, err := s.GetRun(ctx, "o2")
			require.NoError(t, err)
			require.Equal(t, map[string]executorv1.RunState{"failed": executorv1.RunState_RUN_STATE_FAILED,
				"cancelled": executorv1.RunState_RUN_STATE_CANCELLED}[state], run.GetState())

			_, _, err = s.SubmitRun(ctx, "o3", in)
			require.NoError(t, err)
			facts, err := s.AttachFacts(ctx, "o3", sc, in, 8)
			require.NoError(t, err)
			require.Nil(t, facts.Checkpoint, "superseded")
			require.Equal(t, "cp-1", facts.Restorable.GetCheckpointId(), "still restorable after a %s run", state)
			movable, err := s.CanFailOver(ctx, sc, "o3")
			require.NoError(t, err)
			require.True(t, movable, "the scope can follow its checkpoint off a lost gateway")

			// A run that succeeds after it settles a turn cp-1 lacks.
			c3, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			require.NoError(t, s.RecordRunner(ctx, c3.Fence, "runner-1", nil, nil))
			_, err = s.AppendEvents(ctx, c3.Fence, terminalOf("o3"))
			require.NoError(t, err)
			_, _, err = s.SubmitRun(ctx, "o4", in)
			require.NoError(t, err)
			facts, err = s.AttachFacts(ctx, "o4", sc, in, 8)
			require.NoError(t, err)
			require.Nil(t, facts.Restorable)
		})
	}
}

// TestF9_EveryRunnerThatAttachedForAScopeIsNamedToTheGatewayThatRestoresIt:
// runs.runner_instance_id keeps only a run's newest runner, yet a runner
// whose attempt was cut off (its host died, a fresh runner took the run
// elsewhere) left a root behind. RestoreOrderOf names it among the scope's
// runners, newest first, so a gateway the scope fails back to sets that
// root aside instead of quarantining it as foreign; MinSourceSeq is the
// highest seq held from the checkpoint's runner.
func TestF9_EveryRunnerThatAttachedForAScopeIsNamedToTheGatewayThatRestoresIt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("runners", "x")
	sc := scope.OfRun("sr1", in)
	_, _, err := s.SubmitRun(ctx, "sr1", in)
	require.NoError(t, err)
	c1, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.RecordRunner(ctx, c1.Fence, "runner-cut-off", nil, nil))
	require.NoError(t, s.RecordRunner(ctx, c1.Fence, "runner-a", nil, nil))
	_, err = s.AppendEvents(ctx, c1.Fence, []*prpv1.Event{event("sr1", "runner-a", 7, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	_, _, err = s.SubmitRun(ctx, "sr2", in)
	require.NoError(t, err)
	c2, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.RecordRunner(ctx, c2.Fence, "runner-b", nil, nil))

	order, err := s.RestoreOrderOf(ctx, sc, "runner-a")
	require.NoError(t, err)
	require.EqualValues(t, 7, order.MinSourceSeq)
	require.ElementsMatch(t, []string{"runner-cut-off", "runner-a", "runner-b"}, order.ServedRunnerIDs)
	require.Equal(t, "runner-b", order.ServedRunnerIDs[0], "newest first")

	// A stale fence records nothing, in either table.
	stale := c1.Fence
	require.Error(t, s.RecordRunner(ctx, stale, "runner-z", nil, nil))
	order, err = s.RestoreOrderOf(ctx, sc, "runner-a")
	require.NoError(t, err)
	require.NotContains(t, order.ServedRunnerIDs, "runner-z")
}
