package runner

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// TestP2_ATurnsEndAndItsRunTerminalAreJournaledInOneOutboxWrite: the
// provider's turn.<status> event reaches runnerd's loop before the turn's
// result (every driver emits the event, then delivers the result). Both
// are journaled in one outbox append (one fsync, one batch the executor
// persists in one commit) instead of the event alone and then the
// run.terminal: the loop waits for the result the event announces. The
// fake delivers the result only once the event was journaled on its own
// (as a runnerd that does not wait does) or after a pause.
func TestP2_ATurnsEndAndItsRunTerminalAreJournaledInOneOutboxWrite(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var (
		mu      sync.Mutex
		appends [][]string // the event types of each outbox append
	)
	alone := make(chan struct{}, 1)
	e.start(func(c *Config) {
		// Far longer than the fake's pause: the wait ends on the result.
		c.TurnEndFollowWindow = time.Minute
		c.OutboxSynced = func(recs []statedir.Record) {
			mu.Lock()
			defer mu.Unlock()
			var types []string
			for _, r := range recs {
				types = append(types, r.EventType)
			}
			appends = append(appends, types)
			if len(types) > 0 && types[len(types)-1] == prp.EventTurnInterrupted {
				alone <- struct{}{}
			}
		}
	})
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.emit(ProviderEvent{Type: prp.EventTurnInterrupted, TurnID: "turn-1", Priority: P0, Payload: map[string]any{}})
	select {
	case <-alone:
	case <-time.After(200 * time.Millisecond):
	}
	prov.done <- TurnResult{TurnID: "turn-1", Status: "interrupted"}
	e.gw.waitEvent(prp.EventRunTerminal, 1)

	mu.Lock()
	defer mu.Unlock()
	var withEnd [][]string
	for _, a := range appends {
		for _, typ := range a {
			if typ == prp.EventTurnInterrupted || typ == prp.EventRunTerminal {
				withEnd = append(withEnd, a)
				break
			}
		}
	}
	require.NotEmpty(t, withEnd)
	assert.Len(t, withEnd, 1, "outbox appends holding the turn's end: %v", withEnd)
	assert.Equal(t, []string{prp.EventTurnInterrupted, prp.EventRunTerminal}, withEnd[0])
}
