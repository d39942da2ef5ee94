package synctrace

import (
	"testing"
)

func TestP4_TypesFoldsRunsOfOneType(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"run.attached"}, "run.attached"},
		{[]string{"turn.started", "item.delta", "item.delta", "item.delta", "run.terminal"}, "turn.started+item.delta×3+run.terminal"},
		{[]string{"a", "b", "a"}, "a+b+a"},
	} {
		if got := Types(len(tc.in), func(i int) string { return tc.in[i] }); got != tc.want {
			t.Errorf("Types(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The one test of this package that turns tracing on: the switch is read
// once per process.
func TestP4_SitesAreRecordedWhenTheTraceDirectoryIsSet(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvVar, dir)
	if !On() {
		t.Fatal("tracing is off with " + EnvVar + " set")
	}
	Begin("test.commit", "run-1")()
	BeginNote("test.fsync", "", func() string { return "note" })()
	Step("test.step", "run-1")()
	recs, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].Site != "test.commit" || recs[0].Run != "run-1" || recs[1].Note != "note" ||
		recs[0].Step || recs[1].Step || !recs[2].Step || recs[2].Site != "test.step" {
		t.Fatalf("records %+v", recs)
	}
	for _, r := range recs {
		if r.Process == "" || r.End < r.Start || r.Start == 0 {
			t.Fatalf("record %+v", r)
		}
	}
	if got := Environ(); len(got) != 1 || got[0] != EnvVar+"="+dir {
		t.Fatalf("Environ() = %q", got)
	}
}
