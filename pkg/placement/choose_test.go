package placement

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF2_Choose(t *testing.T) {
	a := Candidate{ID: "a", Labels: map[string]string{"zone": "a", "gpu": "false"}, Capacity: 10}
	b := Candidate{ID: "b", Labels: map[string]string{"zone": "b", "gpu": "false"}, Capacity: 20}
	c := Candidate{ID: "c", Labels: map[string]string{"zone": "c", "gpu": "true"}, Capacity: 30}
	with := func(c Candidate, load int) Candidate { c.Load = load; return c }
	for _, tc := range []struct {
		name     string
		cs       []Candidate
		want     map[string]string
		chosen   string
		matching int
	}{
		{"no gateways", nil, nil, "", 0},
		{"empty: the most free sessions", []Candidate{a, b, c}, nil, "c", 3},
		{"least loaded relative to capacity", []Candidate{with(a, 1), with(b, 4), with(c, 9)}, nil, "a", 3},
		{"ratio ties go to more free sessions", []Candidate{with(a, 5), with(b, 10)}, nil, "b", 2},
		{"equal ratio and room: the lower id", []Candidate{with(b, 2), {ID: "a2", Capacity: 20, Load: 2}}, nil, "a2", 2},
		{"labels select", []Candidate{a, b, c}, map[string]string{"zone": "b"}, "b", 1},
		{"several labels all must hold", []Candidate{a, b, c}, map[string]string{"gpu": "false", "zone": "a"}, "a", 1},
		{"a label value must be equal", []Candidate{a, b, c}, map[string]string{"gpu": "maybe"}, "", 0},
		{"a missing key does not satisfy", []Candidate{a, b, c}, map[string]string{"rack": "1"}, "", 0},
		{"full gateways are skipped", []Candidate{with(a, 10), with(b, 3)}, map[string]string{"gpu": "false"}, "b", 2},
		{"over capacity (burst) is full", []Candidate{with(a, 12)}, nil, "", 1},
		{"all matching full", []Candidate{with(a, 10), with(b, 20), c}, map[string]string{"gpu": "false"}, "", 2},
		{"zero capacity never takes one", []Candidate{{ID: "z", Capacity: 0}}, nil, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Choose(tc.cs, tc.want)
			require.Equal(t, tc.chosen, got.GatewayID)
			require.Equal(t, tc.matching, got.Matching)
		})
	}
}

func TestF2_SpreadByCapacity(t *testing.T) {
	// 30 placements onto capacities 10/20/30 land at most one apart from
	// their share (5/10/15), each counted at once.
	cs := []Candidate{{ID: "a", Capacity: 10}, {ID: "b", Capacity: 20}, {ID: "c", Capacity: 30}}
	for range 30 {
		id := Choose(cs, nil).GatewayID
		for i := range cs {
			if cs[i].ID == id {
				cs[i].Load++
			}
		}
	}
	require.Equal(t, []int{5, 10, 15}, []int{cs[0].Load, cs[1].Load, cs[2].Load})
}
