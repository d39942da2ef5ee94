package codex

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/provhost"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

func notice(msg string) Event {
	return Event{Type: "provider.notice.recorded", Payload: map[string]any{"message": msg}}
}

// TestR4_AHostedLinesEventsAreHandedOnWithTheMarkPastTheLine: the events a
// provider line causes reach the runner only with the host's mark for that
// line, as one queue item (the cursor on the last event), so no batch the
// runner journals holds a line's events without the cursor past it (a
// runnerd killed in between made the re-attached host replay the line: a
// doubled delta).
func TestR4_AHostedLinesEventsAreHandedOnWithTheMarkPastTheLine(t *testing.T) {
	t.Parallel()
	var got []provider.Event
	f := &markFilter{emit: func(ev provider.Event) { got = append(got, ev) }}
	delta := func(d string) Event {
		return Event{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Payload: map[string]any{"delta": d}}
	}
	line := func(answer bool, evs ...Event) {
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
	line(true, Event{Type: "session.started"})
	require.Len(t, got, 1)

	// A line that caused no event: its mark goes on alone.
	got = nil
	line(false)
	line(false, notice(provhost.MarkPrefix+"8"))
	require.Equal(t, []provider.Event{{Cursor: 8}}, got)

	// An event between lines (a request expiring, a failure) is not held.
	got = nil
	f.handle(Event{Type: "runtime_request.expired"})
	require.Len(t, got, 1)

	// Re-attached: the host re-announces the active turn (a notice, then
	// the turn's line, neither marked); the duplicate turn.started is
	// dropped and nothing waits for a mark that does not come.
	got = nil
	line(false, notice(provhost.AdoptPrefix+"turn-1"))
	line(false, Event{Type: "turn.started", TurnID: "turn-1"}, Event{Type: "item.started", TurnID: "turn-1"})
	require.Len(t, got, 1)
	require.Equal(t, "item.started", got[0].Type)
	got = nil
	f.handle(Event{Type: "runtime_request.expired"})
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

// TestR7_ATurnResultWaitsForItsHeldCompletionEvent: a turn's result reaches
// the runner only after the events the filter was handed before it were
// handed on. The driver delivers the result on its own channel right after
// emitting turn.completed; when that event was held for a line's mark (a
// reconciled turn's event emitted while the reader was in the middle of
// another line), the runner journaled run.terminal first and the turn's
// turn.completed after it, past the run's end (R7 and R9: the watch ended
// at the terminal without the turn's completion).
func TestR7_ATurnResultWaitsForItsHeldCompletionEvent(t *testing.T) {
	t.Parallel()
	type setup struct {
		f   *markFilter
		p   *providerSession
		mu  *sync.Mutex
		got *[]provider.Event
	}
	newSetup := func() setup {
		var mu sync.Mutex
		var got []provider.Event
		f := &markFilter{emit: func(ev provider.Event) {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		}}
		// done is unbuffered: a result is handed on only to a receiver.
		p := &providerSession{f: f, done: make(chan TurnResult), stop: make(chan struct{})}
		return setup{f: f, p: p, mu: &mu, got: &got}
	}
	types := func(s setup) []string {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []string
		for _, ev := range *s.got {
			if ev.Type != "" {
				out = append(out, ev.Type)
			}
		}
		return out
	}
	completed := Event{Type: "turn.completed", TurnID: "turn-1", Payload: map[string]any{"status": "completed", "reconciled": true}}
	res := TurnResult{TurnID: "turn-1", Status: "completed"}
	// pass runs as forward does, on its own goroutine; passed reports what it returned.
	pass := func(s setup) <-chan bool {
		passed := make(chan bool, 1)
		go func() { passed <- s.p.pass(res) }()
		return passed
	}
	notYet := func(t *testing.T, s setup) {
		t.Helper()
		select {
		case r := <-s.p.done:
			t.Fatalf("the result %+v reached the runner while turn.completed was held (handed on: %v)", r, types(s))
		case <-time.After(50 * time.Millisecond):
		}
	}
	take := func(t *testing.T, s setup, passed <-chan bool) {
		t.Helper()
		select {
		case r := <-s.p.done:
			require.Equal(t, res, r)
		case <-time.After(10 * time.Second):
			t.Fatal("the result was not handed on")
		}
		require.True(t, <-passed)
	}

	t.Run("the line's mark releases it", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		// The reader is in a line; the runner's ReconcileTurn emits the
		// turn's completion meanwhile (held), then delivers the result.
		s.f.LineStart()
		s.f.handle(Event{Type: "item.delta", TurnID: "turn-2", ItemID: "i", Payload: map[string]any{"delta": "x"}})
		s.f.handle(completed)
		s.f.LineDone(false) // its mark has not come
		passed := pass(s)
		notYet(t, s)
		require.Empty(t, types(s))

		s.f.LineStart()
		s.f.handle(notice(provhost.MarkPrefix + "9"))
		s.f.LineDone(false)
		take(t, s, passed)
		require.Equal(t, []string{"item.delta", "turn.completed"}, types(s), "handed on before the result")
	})

	t.Run("the reader's end releases it", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		s.f.LineStart()
		s.f.handle(completed)
		s.f.LineDone(false)
		passed := pass(s)
		notYet(t, s)
		s.f.ReaderDone()
		take(t, s, passed)
		require.Equal(t, []string{"turn.completed"}, types(s))
	})

	t.Run("stop ends the wait", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		s.f.LineStart()
		s.f.handle(completed)
		passed := pass(s)
		select {
		case <-passed:
			t.Fatal("pass returned while turn.completed was held")
		case <-time.After(50 * time.Millisecond):
		}
		close(s.p.stop)
		select {
		case ok := <-passed:
			require.False(t, ok, "nothing took the result")
		case <-time.After(10 * time.Second):
			t.Fatal("stop did not end the wait")
		}
	})

	t.Run("nothing held: at once", func(t *testing.T) {
		t.Parallel()
		// Not hosted (no line observer), or between lines: nothing is held.
		s := newSetup()
		s.f.handle(completed)
		// A suppressed turn.started and a bare mark are not counted.
		s.f.LineStart()
		s.f.handle(notice(provhost.AdoptPrefix + "turn-3"))
		s.f.LineDone(false)
		s.f.LineStart()
		s.f.handle(Event{Type: "turn.started", TurnID: "turn-3"})
		s.f.LineDone(false)
		take(t, s, pass(s))
		require.Equal(t, []string{"turn.completed"}, types(s))
	})
}
