package runner

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/runnerstate"
)

func TestR4_OutboxSoftLimitRejectsNonP0EventsKeepsTheP0ReserveAndClearsAfterAcks(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.MaxOutboxBytes, c.P0ReserveBytes = 64<<10, 16<<10 })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	e.gw.ack(e.gw.maxSeq())
	e.gw.waitFor("ack applied", func() bool { return true })
	time.Sleep(50 * time.Millisecond)

	// The gateway stops acknowledging; the provider keeps talking.
	big := strings.Repeat("d", 1000)
	for i := 0; i < 80; i++ {
		prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i1", Priority: P2, Payload: map[string]any{"delta": big}})
	}
	bp := e.gw.waitEvent("runner.backpressure", 1)
	assert.Equal(t, uint32(0), bp.GetPriority())
	assert.Equal(t, true, bp.GetPayload().AsMap()["active"])
	e.gw.waitFor("backpressure lifecycle", func() bool { return true })
	require.Eventually(t, func() bool { return e.state().Lifecycle == runnerstate.LifecycleBackpressure }, 5*time.Second, 10*time.Millisecond)
	deltas := len(e.gw.eventsOf("item.delta"))
	assert.Less(t, deltas, 80, "deltas beyond the soft limit were rejected")
	assert.Greater(t, deltas, 30, "deltas up to the soft limit were kept")

	// No new turn while in backpressure (a policy rejection, no effect).
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "ok"})
	term := e.gw.waitEvent("run.terminal", 1) // P0 events use the reserve
	assert.Equal(t, "completed", term.GetPayload().AsMap()["turnTerminalState"])
	res := e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "more"}))
	assert.Equal(t, runnerstate.StatusRejected, res.GetStatus())
	assert.Equal(t, failure.RunnerBackpressure, res.GetCode())
	assert.Equal(t, 1, e.prov.count())

	// Seqs stay contiguous: rejected events took none.
	got := e.gw.distinct()
	for s := uint64(1); s <= e.gw.maxSeq(); s++ {
		_, ok := got[s]
		require.True(t, ok, "seq %d present", s)
	}

	// Acknowledging drains the outbox and relieves the backpressure.
	e.gw.ack(e.gw.maxSeq())
	relief := e.gw.waitEvent("runner.backpressure", 2)
	pl := relief.GetPayload().AsMap()
	assert.Equal(t, false, pl["active"])
	assert.Greater(t, pl["rejectedEvents"].(float64), 0.0)
	require.Eventually(t, func() bool { return e.state().Lifecycle == runnerstate.LifecycleReady }, 5*time.Second, 10*time.Millisecond)
	assert.Greater(t, e.state().PeakOutboxBytes, uint64(40<<10))
	res = e.gw.command(cs.next("c-turn3", CmdTurnStart, map[string]any{"text": "more"}))
	assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, ExitOK, p.stop(t))
}

func TestR4_P0EventBeyondTheOutboxLimitIsUnrecoverable(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.MaxOutboxBytes, c.P0ReserveBytes = 32<<10, 8<<10 })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.emit(ProviderEvent{Type: "session.updated", Priority: P0, Payload: map[string]any{"blob": strings.Repeat("p", 40<<10)}})
	assert.Equal(t, ExitError, p.wait(t, 10*time.Second))
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleUnrecoverable, st.Lifecycle)
	assert.Equal(t, "p0_storage_exhausted", st.LifecycleReason)
}

func TestR4_OutboxLimitFlagsAreValidated(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	for _, c := range []struct{ max, reserve uint64 }{{1 << 10, 0}, {1 << 30, 1 << 20}, {1 << 20, 600 << 10}} {
		_, err := Run(t.Context(), e.config(func(cfg *Config) { cfg.MaxOutboxBytes, cfg.P0ReserveBytes = c.max, c.reserve }))
		require.Error(t, err, "%+v", c)
	}
}
