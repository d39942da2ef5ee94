package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

func TestF1_TetherctlGatewaysShowsStateLoadCapacityAndLastHeartbeat(t *testing.T) {
	now := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	renderGateways(&out, []*executorv1.Gateway{
		{GatewayId: "gw-a", Address: "10.0.0.1:7401", Labels: map[string]string{"zone": "a", "gpu": "false"}, Capacity: 20, Sessions: 5, PlacedScopes: 7,
			State: executorv1.GatewayState_GATEWAY_STATE_ACTIVE, LastHeartbeatAt: timestamppb.New(now.Add(-1200 * time.Millisecond))},
		{GatewayId: "gw-b", Address: "10.0.0.2:7401", Capacity: 10, Sessions: 10, PlacedScopes: 4,
			State: executorv1.GatewayState_GATEWAY_STATE_DRAINING, LastHeartbeatAt: timestamppb.New(now.Add(-2 * time.Second)),
			Drain: &executorv1.DrainProgress{MovedScopes: 3, RemainingScopes: 4, BusyScopes: 1}},
		{GatewayId: "gw-c", Address: "10.0.0.3:7401", Capacity: 10,
			State: executorv1.GatewayState_GATEWAY_STATE_LOST, LastHeartbeatAt: timestamppb.New(now.Add(-time.Minute))},
	}, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, []string{"GATEWAY", "STATE", "LOAD", "SESSIONS/CAPACITY", "PLACED", "LAST", "HEARTBEAT", "ADDRESS", "LABELS", "DRAIN"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"gw-a", "active", "25%", "5/20", "7", "1.2s", "ago", "10.0.0.1:7401", "gpu=false,zone=a"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"gw-b", "draining", "100%", "10/10", "4", "2s", "ago", "10.0.0.2:7401", "draining,", "3", "moved,", "4", "left", "(1", "busy)"}, strings.Fields(lines[2]))
	require.Equal(t, []string{"gw-c", "lost", "0%", "0/10", "0", "1m0s", "ago", "10.0.0.3:7401"}, strings.Fields(lines[3]))
}

func TestF4_TetherctlDrainProgressLine(t *testing.T) {
	g := &executorv1.Gateway{GatewayId: "gw-b", State: executorv1.GatewayState_GATEWAY_STATE_DRAINING,
		Drain: &executorv1.DrainProgress{MovedScopes: 2, RemainingScopes: 3, BusyScopes: 1}}
	require.Equal(t, "gateway gw-b draining: draining, 2 moved, 3 left (1 busy)", drainLine(g))
	g.Drain = &executorv1.DrainProgress{MovedScopes: 5, Done: true}
	require.Equal(t, "gateway gw-b draining: drained, 5 moved", drainLine(g))
}
