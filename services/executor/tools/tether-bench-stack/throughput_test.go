package main

import "testing"

func TestSwitchesOfSumsBothCountersOfAStatusFile(t *testing.T) {
	t.Parallel()
	status := "Name:\trunnerd\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n"
	if got := switchesOf(status); got != 127 {
		t.Fatalf("switchesOf = %d, want 127", got)
	}
	if got := switchesOf("Name:\tx\n"); got != 0 {
		t.Fatalf("switchesOf without counters = %d, want 0", got)
	}
}
