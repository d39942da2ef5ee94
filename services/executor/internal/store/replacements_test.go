package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
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
	ev := store.ControlEvent{Type: "session.continuity_break", Replacement: a.GetReplacementId(), Payload: map[string]any{"why": "host lost"}}
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
