package main

import (
	"slices"
	"testing"
)

func TestQ3_TheFairnessBenchReadsIncreasingBacklogSizes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		ok   bool
	}{
		{"0,1000,10000,100000", []int{0, 1000, 10000, 100000}, true},
		{"0", []int{0}, true},
		{" 5 , 10", []int{5, 10}, true},
		{"1000,0", nil, false},
		{"0,0", nil, false},
		{"-1", nil, false},
		{"1k", nil, false},
		{"", nil, false},
	} {
		got, err := parseSizes(tc.in)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("parseSizes(%q) = %v, %v; want %v, ok %t", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestQ3_TheFairnessBenchRefillsEveryRunOfAThatLeftFlight(t *testing.T) {
	for _, tc := range []struct {
		name        string
		before, now []string
		want        []string
	}{
		{"first poll", nil, []string{"a1", "a2"}, nil},
		{"nothing ended", []string{"a1", "a2"}, []string{"a2", "a1"}, nil},
		{"one ended, its refill started", []string{"a1", "a2"}, []string{"a2", "a3"}, []string{"a1"}},
		{"all ended", []string{"a1", "a2"}, nil, []string{"a1", "a2"}},
		{"B's run took the slot", []string{"a1", "a2"}, []string{"a2"}, []string{"a1"}},
	} {
		if got := ended(tc.before, tc.now); !slices.Equal(got, tc.want) {
			t.Errorf("%s: ended(%v, %v) = %v, want %v", tc.name, tc.before, tc.now, got, tc.want)
		}
	}
}
