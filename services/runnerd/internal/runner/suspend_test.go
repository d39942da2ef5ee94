package runner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

func TestR5_RunnerSuspendStopsTheProviderKeepsTheThreadAndResumes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)

	// A turn in progress refuses the suspension; nothing changes.
	res := e.gw.command(cs.next("c-suspend-busy", CmdRunnerSuspend, map[string]any{"reason": "idle"}))
	assert.Equal(t, runnerstate.StatusRejected, res.GetStatus())
	assert.Equal(t, failure.TurnAlreadyActive, res.GetCode())
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)

	res = e.gw.command(cs.next("c-suspend", CmdRunnerSuspend, map[string]any{"reason": "warm native session idle timeout"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	out := res.GetResult().AsMap()
	assert.Equal(t, runnerstate.LifecycleSuspended, out["lifecycle"])
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
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "thread-1", st.ProviderThreadID)
	assert.Nil(t, st.ProviderProcess)
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	assert.Equal(t, runnerstate.LifecycleSuspended, e.state().Lifecycle)

	// A runnerd started on the suspended state connects as usual and the
	// next turn resumes the same provider thread in a new provider.
	e.start(nil)
	e.gw.waitConns(2)
	e.gw.waitFor("ready", func() bool { return e.state().Lifecycle == runnerstate.LifecycleReady })
	res = e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, 2, e.prov.count())
	prov2 := e.prov.last()
	prov2.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, prov2.threadOpen)
	prov2.mu.Unlock()
}

func TestR5_IdleTimeoutIsADurableSuspension(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	// 1 s: at 300 ms a loaded box (load 50) let the runner go idle
	// between the run.attach and the turn.start.
	p := e.start(func(c *Config) { c.IdleTimeout = time.Second })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)

	// Idle with no active turn: the provider is closed cleanly, the thread
	// is kept and lifecycle suspended (idle_timeout) is durable before the
	// P0 runner.suspended goes out.
	ev := e.gw.waitEvent("runner.suspended", 1)
	assert.Equal(t, uint32(P0), ev.GetPriority())
	assert.Equal(t, map[string]any{"reason": "idle_timeout", "providerThreadId": "thread-1"}, ev.GetPayload().AsMap())
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "idle_timeout", st.LifecycleReason)
	assert.Equal(t, "thread-1", st.ProviderThreadID)
	assert.Nil(t, st.ProviderProcess)
	assert.Nil(t, st.ActiveTurn)
	prov.mu.Lock()
	assert.True(t, prov.closed, "the provider was stopped")
	prov.mu.Unlock()
	assert.Empty(t, e.gw.eventsOf("runner.stopped"))

	// It exits 0 once the outbox is acknowledged, still suspended.
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	st = e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "idle_timeout", st.LifecycleReason)
	assert.Equal(t, "thread-1", st.ProviderThreadID)

	// A runnerd started on the suspended state continues the same thread.
	e.start(nil)
	e.gw.waitConns(2)
	e.gw.waitFor("ready", func() bool { return e.state().Lifecycle == runnerstate.LifecycleReady })
	res := e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, 2, e.prov.count())
	prov2 := e.prov.last()
	prov2.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, prov2.threadOpen)
	prov2.mu.Unlock()
}

// bareRunner is a Runner with its state and outbox opened but no loop,
// connection or provider, for driving one transition directly.
func bareRunner(t *testing.T) *Runner {
	t.Helper()
	cfg := Config{IdleTimeout: time.Millisecond}
	cfg.defaults()
	store, err := statedir.OpenStore(t.TempDir())
	require.NoError(t, err)
	ob, _, err := statedir.OpenOutbox(store.Dir, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	r := &Runner{
		cfg: cfg, log: cfg.Logger, link: newLink(&cfg), sup: newSupervisor(nil),
		st: runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: tRunner, NormalizedSessionID: tSess, SessionScope: tScope}),
	}
	r.link.disconnectedSince = time.Now() // within the reconnect grace
	r.j = &journal{log: cfg.Logger, host: r, st: r.st, store: store, outbox: ob}
	r.st.Lifecycle, r.st.ProviderThreadID = runnerstate.LifecycleReady, "thread-1"
	require.NoError(t, r.j.save())
	return r
}

func outboxTypes(r *Runner) []string {
	var types []string
	for _, rec := range r.j.outbox.After(0) {
		types = append(types, rec.EventType)
	}
	return types
}

func TestR5_IdleTimeoutOfARevokedOrUnrecoverableRunnerStops(t *testing.T) {
	t.Parallel()
	for _, lc := range []string{runnerstate.LifecycleRevoked, runnerstate.LifecycleUnrecoverable} {
		t.Run(lc, func(t *testing.T) {
			r := bareRunner(t)
			r.st.Lifecycle = lc
			_, done := r.checkTimers(time.Now().Add(time.Second))
			require.False(t, done)
			require.NotNil(t, r.exit)
			assert.Equal(t, ExitOK, r.exit.code)
			assert.False(t, r.exit.immediate)
			assert.Equal(t, []string{"runner.stopped"}, outboxTypes(r))
			st, err := r.j.store.Load()
			require.NoError(t, err)
			assert.Equal(t, runnerstate.LifecycleStopped, st.Lifecycle)
			assert.Equal(t, "idle_timeout", st.LifecycleReason)
		})
	}
}

func TestR5_IdleSuspensionThatCannotBePersistedExitsWithError(t *testing.T) {
	t.Parallel()
	r := bareRunner(t)
	r.j.store = &statedir.Store{Dir: filepath.Join(r.j.store.Dir, statedir.OutboxFile, "not-a-dir")}
	_, done := r.checkTimers(time.Now().Add(time.Second))
	require.False(t, done)
	require.NotNil(t, r.exit)
	assert.Equal(t, ExitError, r.exit.code)
	assert.Equal(t, "runner_state_write_failed", r.exit.reason)
	assert.True(t, r.exit.immediate)
	assert.Empty(t, outboxTypes(r), "no runner.suspended for a suspension that is not durable")
}

func TestR4_SessionCloseOfAnIdleRunnerIsADurableSuspension(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)

	// session.close with no active turn: the provider is closed cleanly, the
	// thread is kept and lifecycle suspended (session_closed) is durable
	// before the answer and the P0 runner.suspended.
	res := e.gw.command(cs.next("c-close", CmdSessionClose, map[string]any{}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, map[string]any{"lifecycle": runnerstate.LifecycleSuspended, "providerThreadId": "thread-1"}, res.GetResult().AsMap())
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "session_closed", st.LifecycleReason)
	assert.Equal(t, "thread-1", st.ProviderThreadID)
	assert.Nil(t, st.ProviderProcess)
	assert.Nil(t, st.ActiveTurn)
	ev := e.gw.waitEvent("runner.suspended", 1)
	assert.Equal(t, uint32(P0), ev.GetPriority())
	assert.Equal(t, map[string]any{"reason": "session_closed", "providerThreadId": "thread-1"}, ev.GetPayload().AsMap())
	prov.mu.Lock()
	assert.True(t, prov.closed, "the provider was stopped")
	prov.mu.Unlock()

	// It exits 0 once the outbox is acknowledged, still suspended.
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	assert.Empty(t, e.gw.eventsOf("runner.stopped"), "a closed session is a suspension, not a stop")
	st = e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "session_closed", st.LifecycleReason)
	assert.Equal(t, "thread-1", st.ProviderThreadID)

	// A runnerd started on the suspended state continues the same thread.
	e.start(nil)
	e.gw.waitConns(2)
	e.gw.waitFor("ready", func() bool { return e.state().Lifecycle == runnerstate.LifecycleReady })
	res = e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, 2, e.prov.count())
	prov2 := e.prov.last()
	prov2.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, prov2.threadOpen)
	prov2.mu.Unlock()
}

func TestR4_SessionCloseDuringATurnInterruptsItAndSuspends(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)

	// The active turn ends interrupted/cancelled with code session_closed,
	// then the settled runner is suspended with the thread kept.
	res := e.gw.command(cs.next("c-close", CmdSessionClose, map[string]any{}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, map[string]any{"lifecycle": runnerstate.LifecycleSuspended, "providerThreadId": "thread-1"}, res.GetResult().AsMap())
	term := e.gw.waitEvent("run.terminal", 1)
	pl := term.GetPayload().AsMap()
	assert.Equal(t, "interrupted", pl["turnTerminalState"])
	assert.Equal(t, "cancelled", pl["runTerminalState"])
	assert.Equal(t, "session_closed", pl["code"])
	assert.Equal(t, "turn-1", pl["providerTurnId"])
	assert.Equal(t, "thread-1", pl["providerThreadId"])
	assert.Equal(t, "run-1", term.GetRunId())
	susp := e.gw.waitEvent("runner.suspended", 1)
	assert.Equal(t, map[string]any{"reason": "session_closed", "providerThreadId": "thread-1"}, susp.GetPayload().AsMap())
	assert.Less(t, term.GetSourceSeq(), susp.GetSourceSeq(), "the turn's terminal precedes the suspension")
	prov.mu.Lock()
	assert.True(t, prov.closed, "the provider was stopped")
	prov.mu.Unlock()

	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	assert.Empty(t, e.gw.eventsOf("runner.stopped"))
	assert.Len(t, e.gw.eventsOf("run.terminal"), 1)
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "session_closed", st.LifecycleReason)
	assert.Equal(t, "thread-1", st.ProviderThreadID)
	assert.Nil(t, st.ActiveTurn)
	assert.Nil(t, st.ProviderProcess)
}

func TestR4_SessionCloseOfARevokedOrUnrecoverableRunnerStops(t *testing.T) {
	t.Parallel()
	for _, lc := range []string{runnerstate.LifecycleRevoked, runnerstate.LifecycleUnrecoverable} {
		t.Run(lc, func(t *testing.T) {
			r := bareRunner(t)
			r.st.Lifecycle = lc
			out, cerr := r.cmdSessionClose(&prpv1.Command{CommandId: "c-close", Type: CmdSessionClose})
			require.Nil(t, cerr)
			assert.Equal(t, map[string]any{"lifecycle": runnerstate.LifecycleStopped, "providerThreadId": "thread-1"}, outcomeMap(out))
			assert.Equal(t, []string{"runner.stopped"}, outboxTypes(r))
			st, err := r.j.store.Load()
			require.NoError(t, err)
			assert.Equal(t, runnerstate.LifecycleStopped, st.Lifecycle)
			assert.Equal(t, "session_closed", st.LifecycleReason)
		})
	}
}

func TestR4_SessionCloseWhoseSuspensionCannotBePersistedFails(t *testing.T) {
	t.Parallel()
	r := bareRunner(t)
	r.j.store = &statedir.Store{Dir: filepath.Join(r.j.store.Dir, statedir.OutboxFile, "not-a-dir")}
	out, cerr := r.cmdSessionClose(&prpv1.Command{CommandId: "c-close", Type: CmdSessionClose})
	assert.Nil(t, out)
	require.NotNil(t, cerr)
	assert.Equal(t, runnerstate.StatusFailed, cerr.status)
	assert.Equal(t, "runner_state_write_failed", cerr.code)
	require.NotNil(t, r.exit)
	assert.Equal(t, ExitError, r.exit.code)
	assert.Equal(t, "runner_state_write_failed", r.exit.reason)
	assert.True(t, r.exit.immediate)
	assert.Empty(t, outboxTypes(r), "no runner.suspended for a suspension that is not durable")
}

func TestR4_TerminationStillStops(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	require.Equal(t, ExitOK, p.stop(t))
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleStopped, st.Lifecycle)
	assert.Equal(t, "runner_terminated", st.LifecycleReason)
	assert.Empty(t, e.gw.eventsOf("runner.suspended"))
}
