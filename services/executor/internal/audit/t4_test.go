package audit

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A turn of r1 that r1's runner began after r1's run.terminal, stored in
// the next run r2 (the injected turn), is event_of_another_run;
// r1's own late events before its terminal, other sources, and turns of
// r2 itself are not.
func TestT4_AuditReportsATurnOfAnotherRunAfterItsTerminal(t *testing.T) {
	src := func(e Event, source string, seq uint64, runID string) Event {
		e.Source, e.SourceSeq, e.EventRunID = source, seq, runID
		return e
	}
	base := func() *history {
		h := &history{runs: []Run{
			{ID: "r1", State: "succeeded", Attempt: 1, EventCount: 2},
			{ID: "r2", State: "succeeded", Attempt: 1, EventCount: 3},
		}}
		h.events = []Event{
			src(Event{RunID: "r1", Seq: 1, Type: EventTurnStarted, Writer: 1}, "runner-a", 1, "r1"),
			src(Event{RunID: "r1", Seq: 2, Type: EventTerminal, Writer: 1}, "runner-a", 2, "r1"),
			src(Event{RunID: "r2", Seq: 1, Type: EventTurnStarted, Writer: 1}, "runner-a", 3, "r2"),
			src(Event{RunID: "r2", Seq: 2, Type: "turn.completed", Writer: 1}, "runner-a", 4, "r2"),
			src(Event{RunID: "r2", Seq: 3, Type: EventTerminal, Writer: 1}, "runner-a", 5, "r2"),
		}
		return h
	}
	rep := base().check()
	require.True(t, rep.Clean(), "%+v", rep.Violations)

	// Injected: a turn of r1 begun after its terminal, in r2's history.
	for _, injected := range []Event{
		src(Event{RunID: "r2", Seq: 4, Type: EventTurnStarted, Writer: 1}, "runner-a", 6, "r1"),
		src(Event{RunID: "r2", Seq: 4, Type: EventCommandExecuted, Writer: 1, CommandID: "r1/g9/turn.start", CommandType: CommandTurnStart}, "runner-a", 6, "r1"),
	} {
		h := base()
		h.events[4].Seq, h.events[4].SourceSeq = 4, 7 // r2's terminal last
		h.runs[1].EventCount = 4
		injected.Seq = 3
		h.events = append(h.events, injected)
		rep := h.check()
		requireOnly(t, rep, ClassForeignRunEvent, "r2")
		require.Len(t, rep.Violations, 1)
	}

	// Not injected: r1's turn event from before its terminal (a late
	// delivery), and one from another source.
	for _, late := range []Event{
		src(Event{RunID: "r2", Seq: 4, Type: EventTurnStarted, Writer: 1}, "runner-a", 1, "r1"),
		src(Event{RunID: "r2", Seq: 4, Type: EventTurnStarted, Writer: 1}, "runner-b", 9, "r1"),
	} {
		h := base()
		h.events[4].Seq = 4
		h.runs[1].EventCount = 4
		late.Seq = 3
		h.events = append(h.events, late)
		rep := h.check()
		require.Zero(t, rep.ByClass[ClassForeignRunEvent], "%+v", rep.Violations)
	}
}
