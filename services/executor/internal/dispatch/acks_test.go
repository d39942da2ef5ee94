package dispatch

import (
	"testing"
	"time"

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

// After a takeover the successor's attach asks the runner to replay from
// its acknowledged cursor (9), but the runner sent events it produced live
// (23, 24) before it read the request: they are dropped, and the replay
// (10..24) is persisted in source order. Other sources and duplicates pass.
// (TestE7_SameHostSuccessorTakesOver… once persisted 9 then 23: the
// deltas of 10..22 landed after them.)
func TestE7_EventsAheadOfTheReplayWaitForItSoTheLogStaysInSourceOrder(t *testing.T) {
	now := time.Unix(100, 0)
	nums := func(evs []*prpv1.Event) []uint64 {
		var out []uint64
		for _, e := range evs {
			out = append(out, e.GetSourceSeq())
		}
		return out
	}
	cases := []struct {
		name    string
		acked   uint64
		batches [][]uint64
		want    [][]uint64
		gapOpen bool
	}{
		{"in order", 9, [][]uint64{{10, 11}, {12}}, [][]uint64{{10, 11}, {12}}, false},
		{"live events ahead of the replay", 9, [][]uint64{{23, 24}, {10, 11, 12}, {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}, {25}},
			[][]uint64{nil, {10, 11, 12}, {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}, {25}}, false},
		{"duplicates below the cursor pass", 9, [][]uint64{{8, 9, 10}}, [][]uint64{{8, 9, 10}}, false},
		{"a gap never filled", 9, [][]uint64{{10}, {12}}, [][]uint64{{10}, nil}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newSeqGate("r", c.acked)
			for i, b := range c.batches {
				require.Equal(t, c.want[i], nums(g.admit(seqs("r", b...), now)), "batch %d", i)
			}
			since, open := g.gap()
			require.Equal(t, c.gapOpen, open)
			if open {
				require.Equal(t, now, since)
			}
		})
	}
	g := newSeqGate("r", 0)
	other := g.admit(seqs("another-runner", 7), now)
	require.Len(t, other, 1, "another source's events pass")
}
