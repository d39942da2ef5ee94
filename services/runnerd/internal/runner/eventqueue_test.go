package runner

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestR4_TheLoopTakesAProviderLinesEventsTogether: the provider's driver
// hands a line's events on one at a time, the line's cursor on the last. A
// drain between them took the first ones alone: journaled without the
// cursor past their line, a runnerd killed before the rest had the host
// replay the line, and those events were journaled twice. What trails
// marked More waits for the line's last event.
func TestR4_TheLoopTakesAProviderLinesEventsTogether(t *testing.T) {
	t.Parallel()
	q := newEventQueue()
	types := func(items []queued) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.ev.Type)
		}
		return out
	}
	q.push(1, ProviderEvent{Type: "item.started", Cursor: 3})
	q.push(1, ProviderEvent{Type: "item.delta", More: true})
	q.push(1, ProviderEvent{Type: "item.delta", More: true})
	require.Equal(t, []string{"item.started"}, types(q.drain()), "the line being handed on stays queued")
	require.Empty(t, q.drain())

	q.push(1, ProviderEvent{Type: "item.completed", Cursor: 4})
	got := q.drain()
	require.Equal(t, []string{"item.delta", "item.delta", "item.completed"}, types(got), "the line's events together")
	require.EqualValues(t, 4, got[2].ev.Cursor)
	require.Empty(t, q.drain())
}
