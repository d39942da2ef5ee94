package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func seqs(inst string, ns ...uint64) []*prpv1.Event {
	out := make([]*prpv1.Event, len(ns))
	for i, n := range ns {
		out[i] = &prpv1.Event{SourceInstanceId: inst, SourceSeq: n}
	}
	return out
}

func TestG4_AckIsHighestContiguousPersistedSeq(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		floor   uint64
		batches [][]uint64
		want    []map[string]uint64
	}{
		{"in order", 0, [][]uint64{{1, 2}, {3}}, []map[string]uint64{{"r": 2}, {"r": 3}}},
		{"gap then fill", 0, [][]uint64{{1, 3}, {2}}, []map[string]uint64{{"r": 1}, {"r": 3}}},
		{"from runner cursor", 5, [][]uint64{{6, 7}}, []map[string]uint64{{"r": 7}}},
		{"replayed duplicates below cursor", 5, [][]uint64{{4, 5}, {6}}, []map[string]uint64{{}, {"r": 6}}},
		{"nothing contiguous", 0, [][]uint64{{2, 3}}, []map[string]uint64{{}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAckTracker()
			for i, b := range c.batches {
				require.Equal(t, c.want[i], a.persisted(c.floor, seqs("r", b...)), "batch %d", i)
			}
		})
	}
}

func TestG3_RunPlacementSelectsTheGatewayTransport(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		in   *prpv1.RunnerPlacement
		mode string
		auth bool
	}{
		"default":          {nil, "TRANSPORT_MODE_DIAL_WS_LOOPBACK", false},
		"loopback":         {&prpv1.RunnerPlacement{TransportMode: "dial_ws_loopback"}, "TRANSPORT_MODE_DIAL_WS_LOOPBACK", false},
		"wss":              {&prpv1.RunnerPlacement{TransportMode: "dial_wss"}, "TRANSPORT_MODE_DIAL_WSS", false},
		"ingress":          {&prpv1.RunnerPlacement{TransportMode: "listen_ws", IngressAuthorized: true}, "TRANSPORT_MODE_LISTEN_WS", true},
		"ingress, no auth": {&prpv1.RunnerPlacement{TransportMode: "listen_ws"}, "TRANSPORT_MODE_LISTEN_WS", false},
	}
	for name, c := range cases {
		got := RunnerTarget(&prpv1.ExecutionInput{Runner: c.in})
		require.Equal(t, c.mode, got.GetMode().String(), name)
		require.Equal(t, c.auth, got.GetRunnerIngressAuthorized(), name)
	}
}
