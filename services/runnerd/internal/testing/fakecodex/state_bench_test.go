package fakecodex

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkP4_FakeSaveAndRefresh is the fake's bookkeeping per turn after
// 100 turns on one thread (the bench's warm session): a save of the whole
// state file and a refresh that parses it again.
func BenchmarkP4_FakeSaveAndRefresh(b *testing.B) {
	st := newPersisted()
	th := &threadState{ID: "thr_1", Cwd: "/w", Model: "m"}
	for i := range 100 {
		texts := make([]string, 8)
		for j := range texts {
			texts[j] = fmt.Sprintf("delta %d of turn %d ", j, i)
		}
		th.Turns = append(th.Turns, &turnState{ID: fmt.Sprintf("turn_%d", i), Status: "completed", Items: []*itemState{
			{Type: "userMessage", ID: fmt.Sprintf("u_%d", i), Text: "hello"},
			{Type: "reasoning", ID: fmt.Sprintf("r_%d", i)},
			{Type: "agentMessage", ID: fmt.Sprintf("a_%d", i), Texts: texts},
		}})
	}
	st.Threads[th.ID] = th
	path := filepath.Join(b.TempDir(), "state.json")
	b.ReportAllocs()
	for b.Loop() {
		if err := saveState(path, st); err != nil {
			b.Fatal(err)
		}
		if _, _, err := loadState(path); err != nil {
			b.Fatal(err)
		}
	}
}
