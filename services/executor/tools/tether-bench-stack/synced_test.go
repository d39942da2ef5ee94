package main

import (
	"testing"
	"time"
)

func TestP4_TheSyncedWritesToAnEventEndAtTheCommitThatPersistsIt(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	w := func(site, note string, start, end float64) syncedWrite {
		return syncedWrite{site: site, note: note, start: ms(start), end: ms(end)}
	}
	// The median warm turn of 2026-12-02 03:35 (the lead's quiet-box run).
	turn := []syncedWrite{
		w("executor.submit+claim", "", 1.05, 3.44),
		w("executor.attach", "session.authority_rotated", 12.99, 18.84),
		w("runnerd.intents", "run.attach+turn.start", 13.47, 14.28),
		{site: "provider.save", start: ms(18.54), end: ms(21.78), provider: true},
		w("runnerd.outbox", "run.attached+command.executed+turn.started+item.delta×2", 25.39, 26.79),
		w("atomic runner-state.json", "", 27.39, 31.04),
		w("executor.events", "run.attached+command.executed+turn.started+item.delta×2", 29.97, 34.44),
		w("atomic runner-state.json", "", 31.08, 34.77),
		w("runnerd.outbox", "item.completed+turn.completed+run.terminal", 35.0, 36.0),
		w("executor.events", "item.completed+turn.completed+run.terminal", 36.5, 39.0),
	}
	for _, tc := range []struct {
		name  string
		ws    []syncedWrite
		typ   string
		until time.Duration
		want  int
	}{
		// submit, intents, outbox, the commit: the snapshots written while
		// the commit ran are not on its path (the greedy chain up to
		// turn.started's arrival counted them: 5).
		{"turn.started", turn, "turn.started", ms(37.59), 4},
		{"run.terminal", turn, "run.terminal", ms(41.59), 7},
		{"no commit carries it: the writes ended by until", append(turn[:6:6], turn[7]), "turn.started", ms(37.59), 5},
		{"item.delta×2 is item.delta", turn, "item.delta", ms(37.59), 4},
		{"a step of the path is not a write", append([]syncedWrite{{site: "executor.route", start: ms(3.5), end: ms(4.0), step: true}}, turn...),
			"turn.started", ms(37.59), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chainTo(tc.ws, tc.typ, tc.until); got != tc.want {
				t.Fatalf("chainTo = %d, want %d", got, tc.want)
			}
		})
	}
}
