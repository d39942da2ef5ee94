package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

const gatewayTTL = 15 * time.Second

// silence moves a gateway's last heartbeat back by d (as if it had been
// silent that long).
func silence(t *testing.T, s *store.Store, id string, d time.Duration) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(),
		`UPDATE executor.gateways SET heartbeat_at = heartbeat_at - $2 * interval '1 microsecond' WHERE gateway_id = $1`, id, d.Microseconds())
	require.NoError(t, err)
}

func TestF1_AGatewayRegistersHeartbeatsDrainsAndIsLostPastItsTTL(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	a := store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.1:7401", Labels: map[string]string{"zone": "a", "gpu": "false"}, Capacity: 10, Sessions: 2}
	g, err := s.RegisterGateway(ctx, a, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, g.GetState())
	require.Equal(t, a.Labels, g.GetLabels())
	require.EqualValues(t, 10, g.GetCapacity())
	require.EqualValues(t, 2, g.GetSessions())
	_, err = s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-b", Address: "10.0.0.2:7401", Capacity: 5}, gatewayTTL)
	require.NoError(t, err)

	// A heartbeat updates the load and keeps the registration time.
	silence(t, s, "gw-a", 5*time.Second)
	a.Sessions = 7
	again, err := s.RegisterGateway(ctx, a, gatewayTTL)
	require.NoError(t, err)
	require.EqualValues(t, 7, again.GetSessions())
	require.Equal(t, g.GetRegisteredAt().AsTime(), again.GetRegisteredAt().AsTime())
	require.True(t, again.GetLastHeartbeatAt().AsTime().After(g.GetLastHeartbeatAt().AsTime()))

	a.Draining = true
	_, err = s.RegisterGateway(ctx, a, gatewayTTL)
	require.NoError(t, err)
	silence(t, s, "gw-b", gatewayTTL+time.Second)
	gs, err := s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Len(t, gs, 2)
	require.Equal(t, "gw-a", gs[0].GetGatewayId())
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_DRAINING, gs[0].GetState())
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_LOST, gs[1].GetState(), "silent past its TTL")

	// A lost gateway that heartbeats again is active again.
	_, err = s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-b", Address: "10.0.0.2:7401", Capacity: 5}, gatewayTTL)
	require.NoError(t, err)
	gs, err = s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, gs[1].GetState())
}

func TestF1_BadAnnouncementsAreRefusedWithStableCodesAndChangeNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for _, capacity := range []int{0, -3} {
		_, err := s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.1:7401", Capacity: capacity}, gatewayTTL)
		require.EqualValues(t, failure.GatewayCapacityInvalid, failure.CodeOf(err), capacity)
		require.Equal(t, codes.InvalidArgument, status.Code(err))
	}
	gs, err := s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Empty(t, gs, "nothing was registered")

	_, err = s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.1:7401", Capacity: 4}, gatewayTTL)
	require.NoError(t, err)
	_, err = s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.9:7401", Capacity: 8}, gatewayTTL)
	require.EqualValues(t, failure.GatewayIDConflict, failure.CodeOf(err))
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.Contains(t, err.Error(), "10.0.0.1:7401")
	gs, err = s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:7401", gs[0].GetAddress(), "the live gateway keeps its id")
	require.EqualValues(t, 4, gs[0].GetCapacity())

	// Once the holder is lost, its id may move to a new address (the host
	// was replaced).
	silence(t, s, "gw-a", gatewayTTL+time.Second)
	moved, err := s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.9:7401", Capacity: 8}, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.9:7401", moved.GetAddress())
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, moved.GetState())
}
