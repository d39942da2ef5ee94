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
		{GatewayId: "gw-a", Address: "10.0.0.1:7401", Labels: map[string]string{"zone": "a", "gpu": "false"}, Capacity: 20, Sessions: 5,
			State: executorv1.GatewayState_GATEWAY_STATE_ACTIVE, LastHeartbeatAt: timestamppb.New(now.Add(-1200 * time.Millisecond))},
		{GatewayId: "gw-b", Address: "10.0.0.2:7401", Capacity: 10, Sessions: 10,
			State: executorv1.GatewayState_GATEWAY_STATE_DRAINING, LastHeartbeatAt: timestamppb.New(now.Add(-2 * time.Second))},
		{GatewayId: "gw-c", Address: "10.0.0.3:7401", Capacity: 10,
			State: executorv1.GatewayState_GATEWAY_STATE_LOST, LastHeartbeatAt: timestamppb.New(now.Add(-time.Minute))},
	}, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, []string{"GATEWAY", "STATE", "LOAD", "SESSIONS/CAPACITY", "LAST", "HEARTBEAT", "ADDRESS", "LABELS"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"gw-a", "active", "25%", "5/20", "1.2s", "ago", "10.0.0.1:7401", "gpu=false,zone=a"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"gw-b", "draining", "100%", "10/10", "2s", "ago", "10.0.0.2:7401"}, strings.Fields(lines[2]))
	require.Equal(t, []string{"gw-c", "lost", "0%", "0/10", "1m0s", "ago", "10.0.0.3:7401"}, strings.Fields(lines[3]))
}
