package dispatch

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF6_FairShareAllowsAClaimOnlyBelowTheReplicasShareOfTheFleetsRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mine, active, myCap, fleetCap int
		want                          bool
	}{
		{0, 0, 64, 64, true},     // alone
		{500, 500, 64, 64, true}, // alone: its capacity bounds it, not fairness
		{0, 0, 64, 192, true},    // three equal replicas, nothing driven: share ⌈1/3⌉ = 1
		{1, 1, 64, 192, false},   // one ahead: the others claim first
		{1, 2, 64, 192, false},   // 1 of 2: share ⌈3/3⌉ = 1
		{1, 3, 64, 192, true},    // 1 of 3: share ⌈4/3⌉ = 2
		{2, 3, 64, 192, false},
		{6, 20, 64, 192, true}, // share ⌈21/3⌉ = 7
		{7, 20, 64, 192, false},
		{3, 6, 128, 192, true}, // twice the capacity, twice the share: ⌈7·2/3⌉ = 5
		{5, 6, 128, 192, false},
		{36, 100, 64, 128, true}, // the other replica is full (64 of 64): share ⌈101/2⌉ = 51
	} {
		got := FairShareAllows(tc.mine, tc.active, tc.myCap, tc.fleetCap)
		require.Equal(t, tc.want, got, "%+v", tc)
	}
}

// TestF6_ClaimsThatFollowTheRuleStaySpreadOverThreeReplicas replays the
// worst order of claims: one replica tries first every time (it receives
// every submission), the others only when it may not. Over 60 runs no
// replica ends above 1.5× its fair share: with equal capacities also while
// runs end as others begin; with unequal ones while the fleet is loaded
// (with a few runs in flight every replica drives about one).
func TestF6_ClaimsThatFollowTheRuleStaySpreadOverThreeReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		caps   []int
		ending bool
	}{{[]int{64, 64, 64}, true}, {[]int{64, 64, 64}, false}, {[]int{32, 64, 96}, false}} {
		caps := tc.caps
		fleetCap := 0
		for _, c := range caps {
			fleetCap += c
		}
		active := make([]int, len(caps))
		claims := make([]int, len(caps))
		for run := range 60 {
			if tc.ending && run%4 == 3 { // runs end as others begin: the oldest of each replica
				for i := range active {
					active[i] = max(0, active[i]-1)
				}
			}
			total := 0
			for _, a := range active {
				total += a
			}
			for i := range caps { // replica 0 always tries first
				if FairShareAllows(active[i], total, caps[i], fleetCap) {
					active[i]++
					claims[i]++
					break
				}
			}
		}
		for i, c := range caps {
			fair := 60 * float64(c) / float64(fleetCap)
			require.LessOrEqual(t, float64(claims[i]), 1.5*fair, fmt.Sprintf("caps %v: claims %v", caps, claims))
		}
	}
}
