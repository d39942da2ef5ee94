package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestF6_ReplicasHeartbeatTheirCapacityAndAStoppedOneLeavesTheFleetAtOnce(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const live = 3 * time.Second
	f, err := s.HeartbeatReplica(ctx, "a", "10.0.0.1:7400", 64, live)
	require.NoError(t, err)
	require.Equal(t, store.Fleet{Replicas: 1, Capacity: 64}, f)
	f, err = s.HeartbeatReplica(ctx, "b", "10.0.0.2:7400", 32, live)
	require.NoError(t, err)
	require.Equal(t, store.Fleet{Replicas: 2, Capacity: 96}, f)

	submitted(t, s, "r1")
	submitted(t, s, "r2")
	for _, owner := range []string{"a", "b"} {
		_, err := s.ClaimNext(ctx, owner, time.Minute, ctl)
		require.NoError(t, err)
	}
	facts, err := s.FairShare(ctx, "a", live)
	require.NoError(t, err)
	require.Equal(t, store.FairShareFacts{Mine: 1, Active: 2, OtherCapacity: 32}, facts)

	require.NoError(t, s.RemoveReplica(ctx, "b"))
	facts, err = s.FairShare(ctx, "a", live)
	require.NoError(t, err)
	require.Equal(t, store.FairShareFacts{Mine: 1, Active: 2, OtherCapacity: 0}, facts, "b stopped: a is alone")

	// A replica silent past the live window no longer counts.
	_, err = s.HeartbeatReplica(ctx, "c", "", 16, live)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE executor.replicas SET heartbeat_at = now() - interval '10 seconds' WHERE owner = 'c'`)
	require.NoError(t, err)
	f, err = s.HeartbeatReplica(ctx, "a", "10.0.0.1:7400", 64, live)
	require.NoError(t, err)
	require.Equal(t, store.Fleet{Replicas: 1, Capacity: 64}, f)
}
