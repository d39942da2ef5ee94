package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestF5_AReleasedLeaseIsClaimedAtOnceAndOnlyItsExactFenceReleasesIt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	c, err := s.ClaimNext(ctx, "a", 10*time.Minute, ctl)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Attempt)

	for _, stale := range []store.Fence{
		{RunID: "r", Owner: "b", Attempt: 1}, // another owner
		{RunID: "r", Owner: "a", Attempt: 2}, // another attempt
	} {
		released, err := s.ReleaseLease(ctx, stale)
		require.NoError(t, err)
		require.False(t, released, "%+v does not hold the lease", stale)
	}
	none, err := s.ClaimNext(ctx, "b", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, none, "the 10-minute lease still holds")

	released, err := s.ReleaseLease(ctx, c.Fence)
	require.NoError(t, err)
	require.True(t, released)
	renewed, err := s.RenewLeases(ctx, "a", []store.Lease{{RunID: "r", Attempt: 1}}, time.Minute)
	require.NoError(t, err)
	require.False(t, renewed["r"], "a released lease is not renewed")

	taken, err := s.ClaimNext(ctx, "b", time.Minute, ctl)
	require.NoError(t, err)
	require.NotNil(t, taken, "claimed at once, long before the old expiry")
	require.EqualValues(t, 2, taken.Attempt)
	require.Equal(t, c.TurnGeneration, taken.TurnGeneration, "the same provider turn is resumed, not started again")
	again, err := s.ReleaseLease(ctx, c.Fence)
	require.NoError(t, err)
	require.False(t, again, "the old fence releases nothing once the run is taken")
	err = s.RecordRunner(ctx, c.Fence, "runner-1", nil, nil)
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
}

func TestF5_ProofOfDeathHoldsOnlyWithinOnePIDNamespace(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "r")
	submitted(t, s, "legacy")
	_, err := s.ClaimRun(ctx, "r", "a", 10*time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	noNS := ctl
	noNS.PIDNamespace = ""
	_, err = s.ClaimRun(ctx, "legacy", "a", 10*time.Minute, noNS, nil, nil)
	require.NoError(t, err)

	// A sibling on the same boot in another PID namespace (another
	// container) sees none of them: a pid of "a" means nothing there.
	container := ctl
	container.PIDNamespace = "pid:[2]"
	held, err := s.HeldOnHost(ctx, container, "b")
	require.NoError(t, err)
	require.Empty(t, held)
	// Even with a matching pid and start time, a proof from another
	// namespace does not take the run.
	proof := store.Controller{Identity: procid.Identity{BootID: ctl.BootID, PIDNamespace: container.PIDNamespace, PID: ctl.PID, StartTicks: ctl.StartTicks}}
	_, err = s.ClaimRun(ctx, "r", "b", time.Minute, container, nil, &store.DeadProof{Owner: "a", Attempt: 1, Controller: proof})
	require.EqualValues(t, failure.NativeFinalizationLeaseBusy, failure.CodeOf(err))
	// A holder recorded without a namespace is never proven dead by pid.
	_, err = s.ClaimRun(ctx, "legacy", "b", time.Minute, ctl, nil, &store.DeadProof{Owner: "a", Attempt: 1, Controller: noNS})
	require.EqualValues(t, failure.NativeFinalizationLeaseBusy, failure.CodeOf(err))

	// The same namespace lists only the holder it can judge.
	held, err = s.HeldOnHost(ctx, ctl, "b")
	require.NoError(t, err)
	require.Len(t, held, 1)
	require.Equal(t, "r", held[0].RunID)
	require.Equal(t, ctl, held[0].Controller)
}
