package placement

import (
	"testing"
	"time"
)

// TestF7_AnUnplacedRunWaitsLongerTheLongerItHasWaited: the delay between the
// claims of a run that cannot be placed starts at the poll interval, grows
// with the time waited and stops at MaxDeferDelay (or a longer poll).
func TestF7_AnUnplacedRunWaitsLongerTheLongerItHasWaited(t *testing.T) {
	for _, tc := range []struct {
		poll, waited, want time.Duration
	}{
		{time.Second, 0, time.Second},
		{time.Second, 3 * time.Second, time.Second},
		{time.Second, 8 * time.Second, 2 * time.Second},
		{time.Second, 20 * time.Second, 5 * time.Second},
		{time.Second, 30 * time.Minute, MaxDeferDelay},
		{10 * time.Second, time.Hour, 10 * time.Second},
		{0, 0, 0},
		{time.Second, -time.Minute, time.Second}, // clock skew: never below the poll
	} {
		if got := DeferDelay(tc.poll, tc.waited); got != tc.want {
			t.Errorf("DeferDelay(%v, %v) = %v, want %v", tc.poll, tc.waited, got, tc.want)
		}
	}
}
