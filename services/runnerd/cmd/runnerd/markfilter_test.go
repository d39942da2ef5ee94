package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
)

func notice(msg string) codex.Event {
	return codex.Event{Type: "provider.notice.recorded", Payload: map[string]any{"message": msg}}
}

// TestR4_AHostedLinesEventsAreHandedOnWithTheMarkPastTheLine: the events a
// provider line causes reach the runner only with the host's mark for that
// line, as one queue item (the cursor on the last event), so no batch the
// runner journals holds a line's events without the cursor past it (a
// runnerd killed in between made the re-attached host replay the line: a
// doubled delta).
func TestR4_AHostedLinesEventsAreHandedOnWithTheMarkPastTheLine(t *testing.T) {
	t.Parallel()
	var got []runner.ProviderEvent
	f := &markFilter{emit: func(ev runner.ProviderEvent) { got = append(got, ev) }}
	delta := func(d string) codex.Event {
		return codex.Event{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Payload: map[string]any{"delta": d}}
	}
	line := func(answer bool, evs ...codex.Event) {
		f.LineStart()
		for _, ev := range evs {
			f.handle(ev)
		}
		f.LineDone(answer)
	}

	line(false, delta("a"), delta("b")) // one line, two events
	require.Empty(t, got, "held until the line's mark")
	line(false, notice(provhost.MarkPrefix+"7"))
	require.Len(t, got, 2)
	require.Equal(t, "a", got[0].Payload["delta"])
	require.Zero(t, got[0].Cursor)
	require.True(t, got[0].More, "the runner takes it with the rest of its line")
	require.Equal(t, "b", got[1].Payload["delta"])
	require.EqualValues(t, 7, got[1].Cursor, "the cursor rides on the line's last event")
	require.False(t, got[1].More)

	// An answer is not marked: its events go on at once.
	got = nil
	line(true, codex.Event{Type: "session.started"})
	require.Len(t, got, 1)

	// A line that caused no event: its mark goes on alone.
	got = nil
	line(false)
	line(false, notice(provhost.MarkPrefix+"8"))
	require.Equal(t, []runner.ProviderEvent{{Cursor: 8}}, got)

	// An event between lines (a request expiring, a failure) is not held.
	got = nil
	f.handle(codex.Event{Type: "runtime_request.expired"})
	require.Len(t, got, 1)

	// Re-attached: the host re-announces the active turn (a notice, then
	// the turn's line, neither marked); the duplicate turn.started is
	// dropped and nothing waits for a mark that does not come.
	got = nil
	line(false, notice(provhost.AdoptPrefix+"turn-1"))
	line(false, codex.Event{Type: "turn.started", TurnID: "turn-1"}, codex.Event{Type: "item.started", TurnID: "turn-1"})
	require.Len(t, got, 1)
	require.Equal(t, "item.started", got[0].Type)
	got = nil
	f.handle(codex.Event{Type: "runtime_request.expired"})
	require.Len(t, got, 1, "nothing is held after the re-announced turn")

	// The reader ends with a line whose mark never came: its events go on.
	got = nil
	line(false, delta("c"))
	require.Empty(t, got)
	f.ReaderDone()
	require.Len(t, got, 1)
	f.handle(delta("d"))
	require.Len(t, got, 2)
}
