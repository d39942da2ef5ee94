package runner

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/runnerstate"
)

// TestP4_ASettledRunnerdDoesNotWakeEveryTick: a connected runnerd with
// nothing owed (a warm session between turns: its turn's end saved, its
// acknowledgements in) does not wake its loop for its timers every Tick —
// each wake-up also wakes the Go runtime's sysmon — but when the
// connection's silence or the session's idleness is due.
func TestP4_ASettledRunnerdDoesNotWakeEveryTick(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var (
		mu    sync.Mutex
		wakes int
	)
	e.start(func(c *Config) {
		c.TimerFired = func() {
			mu.Lock()
			wakes++
			mu.Unlock()
		}
	})
	e.gw.waitConns(1)
	var seq uint64
	warmTurn(t, e, &seq, 1)
	require.Eventually(t, func() bool { return statusIn(e.document(), "turn-start-1") == runnerstate.StatusCompleted },
		5*time.Second, 5*time.Millisecond)
	e.gw.ping(1) // persists the acknowledged cursor: nothing is owed
	mu.Lock()
	before := wakes
	mu.Unlock()
	const idle = 500 * time.Millisecond
	time.Sleep(idle)
	e.gw.ping(2) // the loop is alive and answers
	mu.Lock()
	during := wakes - before
	mu.Unlock()
	// The harness's Tick is 10 ms: 50 wake-ups in that time before.
	assert.LessOrEqual(t, during, 1, "timer wake-ups in %s settled", idle)
}
