package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/durable"
)

func TestR5_RunnerSuspendStopsTheProviderKeepsTheThreadAndResumes(t *testing.T) {
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)

	// A turn in progress refuses the suspension; nothing changes.
	res := e.gw.command(cs.next("c-suspend-busy", CmdRunnerSuspend, map[string]any{"reason": "idle"}))
	assert.Equal(t, durable.StatusRejected, res.GetStatus())
	assert.Equal(t, CodeTurnAlreadyActive, res.GetCode())
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)

	res = e.gw.command(cs.next("c-suspend", CmdRunnerSuspend, map[string]any{"reason": "warm native session idle timeout"}))
	require.Equal(t, durable.StatusCompleted, res.GetStatus(), res.GetMessage())
	out := res.GetResult().AsMap()
	assert.Equal(t, durable.LifecycleSuspended, out["lifecycle"])
	assert.Equal(t, "thread-1", out["providerThreadId"])
	assert.Equal(t, tRunner, out["runnerInstanceId"])
	ev := e.gw.waitEvent("runner.suspended", 1)
	assert.Equal(t, uint32(P0), ev.GetPriority())
	assert.Equal(t, "warm native session idle timeout", ev.GetPayload().AsMap()["reason"])
	prov.mu.Lock()
	assert.True(t, prov.closed, "the provider was stopped")
	prov.mu.Unlock()

	// Lifecycle suspended is durable before the answer; the runner exits 0
	// once its outbox is acknowledged.
	st := e.state()
	assert.Equal(t, durable.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "thread-1", st.ProviderThreadID)
	assert.Nil(t, st.ProviderProcess)
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	assert.Equal(t, durable.LifecycleSuspended, e.state().Lifecycle)

	// A runnerd started on the suspended state connects as usual and the
	// next turn resumes the same provider thread in a new provider.
	e.start(nil)
	e.gw.waitConns(2)
	e.gw.waitFor("ready", func() bool { return e.state().Lifecycle == durable.LifecycleReady })
	res = e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, durable.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, 2, e.prov.count())
	prov2 := e.prov.last()
	prov2.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, prov2.threadOpen)
	prov2.mu.Unlock()
}
