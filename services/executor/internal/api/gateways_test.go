package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestF1_TheRegistryExportsEachGatewaysSessionsAndCapacity(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	for _, a := range []store.GatewayAnnouncement{
		{ID: "gw-a", Address: "10.0.0.1:7401", Capacity: 20, Sessions: 5},
		{ID: "gw-b", Address: "10.0.0.2:7401", Capacity: 10, Sessions: 1},
	} {
		_, err := e.store.RegisterGateway(ctx, a, api.DefaultGatewayTTL)
		require.NoError(t, err)
	}
	_, err := e.store.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - interval '1 hour' WHERE gateway_id = 'gw-b'`)
	require.NoError(t, err)
	r := &api.Registry{Store: e.store, TTL: time.Minute}
	require.NoError(t, testutil.CollectAndCompare(r, strings.NewReader(`
# HELP tether_executor_gateway_capacity Session scopes each registered gateway holds at most, as it announced.
# TYPE tether_executor_gateway_capacity gauge
tether_executor_gateway_capacity{gateway="gw-a"} 20
tether_executor_gateway_capacity{gateway="gw-b"} 10
# HELP tether_executor_gateway_sessions Session scopes each registered gateway holds, as it last announced, by gateway and state (active, draining, lost); read from the database at scrape time.
# TYPE tether_executor_gateway_sessions gauge
tether_executor_gateway_sessions{gateway="gw-a",state="active"} 5
tether_executor_gateway_sessions{gateway="gw-b",state="lost"} 1
`)))
}
