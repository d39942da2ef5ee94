package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// finish claims the next run and persists its terminal event.
func finish(t *testing.T, s *store.Store, want string) {
	t.Helper()
	ctx := context.Background()
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, want, c.RunID)
	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(want, "runner-1", 1, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
}

func TestR5_SuspensionClaimIsFencedPerIdlePeriod(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("idle", "x")
	sc := scope.OfRun("w1", in)
	_, _, err := s.SubmitRun(ctx, "w1", in)
	require.NoError(t, err)

	// An open run is never suspended.
	ok, err := s.ClaimSuspension(ctx, sc, "w1", "replica-a", time.Minute, true)
	require.NoError(t, err)
	require.False(t, ok)
	finish(t, s, "w1")

	idle, err := s.IdleWarmSessions(ctx, 10)
	require.NoError(t, err)
	require.Len(t, idle, 1)
	require.Equal(t, sc, idle[0].Scope)
	require.Equal(t, "w1", idle[0].LastRunID)
	require.True(t, proto.Equal(in, idle[0].Input))

	// One replica claims; the other does not, forced or not.
	ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-a", time.Minute, false)
	require.NoError(t, err)
	require.True(t, ok)
	for _, force := range []bool{false, true} {
		ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-b", time.Minute, force)
		require.NoError(t, err)
		require.False(t, ok)
	}
	idle, err = s.IdleWarmSessions(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, idle, "a claimed idle period is not offered again")

	// Done: not claimed again unless forced (CloseSession).
	require.NoError(t, s.FinishSuspension(ctx, sc, "w1", "replica-a", store.SuspensionSuspended, "", "cp-1"))
	ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-b", time.Minute, false)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-b", 10*time.Millisecond, true)
	require.NoError(t, err)
	require.True(t, ok)
	// An expired claim is taken over; the old owner's outcome is ignored.
	require.Eventually(t, func() bool {
		ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-a", time.Minute, false)
		return err == nil && ok
	}, time.Minute, 2*time.Millisecond)
	require.NoError(t, s.FinishSuspension(ctx, sc, "w1", "replica-b", store.SuspensionFailed, "late", ""))
	ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-b", time.Minute, true)
	require.NoError(t, err)
	require.False(t, ok, "replica-a still holds it")

	// A newer run starts a new idle period; the old one is never claimed.
	_, _, err = s.SubmitRun(ctx, "w2", input("idle", "y"))
	require.NoError(t, err)
	ok, err = s.ClaimSuspension(ctx, sc, "w1", "replica-b", time.Minute, true)
	require.NoError(t, err)
	require.False(t, ok)
}

func TestR5_CheckpointsAreCurrentUntilARunAttachesAgain(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("cp", "x")
	sc := scope.OfRun("c1", in)
	_, _, err := s.SubmitRun(ctx, "c1", in)
	require.NoError(t, err)
	finish(t, s, "c1")
	cur, err := s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Nil(t, cur)

	stamp := &backupv1.Stamp{CheckpointId: "cp-1", LeaseId: "local-x", SessionScope: scope.Of(in), Signature: "ab"}
	rec := store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "cp", LastRunID: "c1", GatewayScope: scope.Of(in),
		Stamp: stamp, CheckpointID: "cp-1", ManifestDigest: "sha256:00", LeaseID: "local-x", RunnerInstanceID: "runner-1",
		ProviderThreadID: "thread-1", Reason: "idle"}
	got, err := s.RecordCheckpoint(ctx, rec)
	require.NoError(t, err)
	require.Equal(t, "cp-1", got.GetCheckpointId())
	require.True(t, proto.Equal(stamp, got.GetStamp()))
	cur, err = s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Equal(t, "cp-1", cur.GetCheckpointId())
	require.Equal(t, "runner-1", cur.GetRunnerInstanceId())
	require.Equal(t, "local-x", cur.GetLeaseId())

	// A run attached a runner: the checkpoint no longer stands for the
	// session (but stays the latest on record).
	require.NoError(t, s.SupersedeCheckpoints(ctx, sc))
	cur, err = s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Nil(t, cur)
	latest, err := s.LatestCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Equal(t, "cp-1", latest.GetCheckpointId())

	// A checkpoint recorded after a newer run already started is
	// superseded from the start.
	_, _, err = s.SubmitRun(ctx, "c2", input("cp", "y"))
	require.NoError(t, err)
	_, err = s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	rec.CheckpointID, rec.Stamp = "cp-2", &backupv1.Stamp{CheckpointId: "cp-2"}
	_, err = s.RecordCheckpoint(ctx, rec)
	require.NoError(t, err)
	cur, err = s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Nil(t, cur)
}

// TestP6_AnIdlePeriodCheckpointedOnlineIsOfferedAgainForItsSuspensionOnly:
// an idle period whose online checkpoint is recorded (checkpointed) is
// listed again, marked Checkpointed, and claimed only for its suspension
// at the idle timeout (afterCheckpoint), with its attempts counted afresh;
// a plain claim (another online checkpoint) does not take it.
func TestP6_AnIdlePeriodCheckpointedOnlineIsOfferedAgainForItsSuspensionOnly(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("online", "x")
	sc := scope.OfRun("o1", in)
	_, _, err := s.SubmitRun(ctx, "o1", in)
	require.NoError(t, err)
	finish(t, s, "o1")

	ok, err := s.ClaimSuspension(ctx, sc, "o1", "replica-a", time.Minute, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.FinishSuspension(ctx, sc, "o1", "replica-a", store.SuspensionCheckpointed, "", "cp-online"))

	idle, err := s.IdleWarmSessions(ctx, 10)
	require.NoError(t, err)
	require.Len(t, idle, 1, "the checkpointed period still waits for its suspension")
	require.True(t, idle[0].Checkpointed)

	ok, err = s.ClaimIdlePeriod(ctx, sc, "o1", "replica-b", time.Minute, false, false)
	require.NoError(t, err)
	require.False(t, ok, "not checkpointed twice")
	ok, err = s.ClaimIdlePeriod(ctx, sc, "o1", "replica-b", time.Minute, false, true)
	require.NoError(t, err)
	require.True(t, ok, "claimed for its suspension")
	var attempts int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT attempts FROM executor.session_suspensions WHERE session_scope = $1`, sc).Scan(&attempts))
	require.Equal(t, 1, attempts)
	idle, err = s.IdleWarmSessions(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, idle, "being suspended")
	require.NoError(t, s.FinishSuspension(ctx, sc, "o1", "replica-b", store.SuspensionSuspended, "", "cp-idle"))
	idle, err = s.IdleWarmSessions(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, idle, "suspended")
}

// TestP6_TheAttachFactsCarryTheCurrentCheckpointsRestoreOrder: the facts a
// run's attach reads in one round trip include RestoreOrderOf for the
// current checkpoint's runner (the Open of a turn after an online
// checkpoint needs no read of its own); none without a current checkpoint.
func TestP6_TheAttachFactsCarryTheCurrentCheckpointsRestoreOrder(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("order", "x")
	sc := scope.OfRun("o1", in)
	_, _, err := s.SubmitRun(ctx, "o1", in)
	require.NoError(t, err)
	finish(t, s, "o1")
	_, _, err = s.SubmitRun(ctx, "o2", input("order", "y"))
	require.NoError(t, err)
	f, err := s.AttachFacts(ctx, "o2", sc, input("order", "y"), 16)
	require.NoError(t, err)
	require.Nil(t, f.CheckpointOrder, "no current checkpoint")

	stamp := &backupv1.Stamp{CheckpointId: "cp-o", LeaseId: "local-x", SessionScope: scope.Of(in), Signature: "ab"}
	_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "order", LastRunID: "o1",
		GatewayScope: scope.Of(in), Stamp: stamp, CheckpointID: "cp-o", ManifestDigest: "sha256:00", LeaseID: "local-x",
		RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "checkpoint"})
	require.NoError(t, err)
	f, err = s.AttachFacts(ctx, "o2", sc, input("order", "y"), 16)
	require.NoError(t, err)
	require.NotNil(t, f.CheckpointOrder)
	want, err := s.RestoreOrderOf(ctx, sc, "runner-1")
	require.NoError(t, err)
	require.Equal(t, "runner-1", f.CheckpointOrder.RunnerInstanceID)
	require.EqualValues(t, 1, want.MinSourceSeq)
	require.Equal(t, want.MinSourceSeq, f.CheckpointOrder.MinSourceSeq)
	require.ElementsMatch(t, want.ServedRunnerIDs, f.CheckpointOrder.ServedRunnerIDs)
}
