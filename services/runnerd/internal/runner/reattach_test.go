package runner

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// outboxRecords reads the outbox log as written (crc prefix stripped).
func outboxRecords(t *testing.T, stateDir string) []statedir.Record {
	f, err := os.Open(filepath.Join(stateDir, "runner", statedir.OutboxFile))
	require.NoError(t, err)
	defer f.Close()
	var out []statedir.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		line := sc.Text()
		var r statedir.Record
		require.NoError(t, json.Unmarshal([]byte(line[strings.IndexByte(line, ' ')+1:]), &r))
		out = append(out, r)
	}
	return out
}

// crashState makes the state look like a runnerd killed during turn-7 of
// run-1 with a live provider.
func crashState(t *testing.T, e *testEnv) {
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st, err := store.Load()
	require.NoError(t, err)
	st.ProviderProcess = &runnerstate.Process{PID: 1 << 22, PGID: 1 << 22, StartTicks: 1}
	st.ActiveTurn = &runnerstate.Turn{TurnID: "turn-7", RunID: "run-1", Attempt: 1}
	st.Lifecycle = runnerstate.LifecycleReady
	require.NoError(t, store.Save(st))
}

func TestR4_ProviderCursorIsJournaledWithTheEventsBeforeIt(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.ProviderHost = true })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Priority: P2, Payload: map[string]any{"delta": "a"}})
	prov.emit(ProviderEvent{Cursor: 6})
	prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Priority: P2, Payload: map[string]any{"delta": "b"}})
	prov.emit(ProviderEvent{Cursor: 7})
	e.gw.waitEvent("item.delta", 2)
	require.Eventually(t, func() bool {
		recs := outboxRecords(t, e.stateDir)
		return len(recs) > 0 && recs[len(recs)-1].ProviderCursor == 7
	}, 5*time.Second, 10*time.Millisecond, "the cursor rides on the last record of its batch")
	for _, r := range outboxRecords(t, e.stateDir) {
		assert.NotEqual(t, "", r.EventType, "marks are not events")
	}
	// A mark after events already journaled (no event of its own) still
	// moves the cursor.
	prov.emit(ProviderEvent{Cursor: 9})
	// A mark riding on the last event of its line is journaled on it.
	prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Priority: P2, Payload: map[string]any{"delta": "c"}, Cursor: 10})
	e.gw.waitEvent("item.delta", 3)
	require.Eventually(t, func() bool {
		recs := outboxRecords(t, e.stateDir)
		last := recs[len(recs)-1]
		return last.EventType == "item.delta" && last.ProviderCursor == 10
	}, 5*time.Second, 10*time.Millisecond, "the cursor on the event is journaled with it")
	require.Equal(t, ExitOK, p.stop(t))
	assert.Equal(t, uint64(10), e.state().ProviderCursor)
}

func TestR1_RestartedRunnerReattachesItsHostedProviderAndTheTurnGoesOn(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.ProviderHost = true })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Priority: P2, Payload: map[string]any{"delta": "a"}})
	prov.emit(ProviderEvent{Cursor: 41})
	e.gw.waitEvent("item.delta", 1)
	require.Equal(t, ExitOK, p.stop(t))
	crashState(t, e)

	e.start(func(c *Config) { c.ProviderHost = true })
	e.gw.waitConns(2)
	e.gw.waitEvent("runner.reconciled", 1)
	e.gw.waitFor("a re-attached harness", func() bool {
		for _, ev := range e.gw.events {
			if ev.ev.GetEventType() == "harness.ready" && ev.ev.GetPayload().AsMap()["reattached"] == true {
				return true
			}
		}
		return false
	})
	e.prov.mu.Lock()
	cfg := e.prov.configs[len(e.prov.configs)-1]
	e.prov.mu.Unlock()
	assert.True(t, cfg.Hosted)
	assert.True(t, cfg.Reattach, "the restarted runner re-attaches instead of starting a provider")
	assert.Equal(t, uint64(41), cfg.ResumeAfter, "and resumes after its durable cursor")
	assert.Equal(t, filepath.Join(e.stateDir, "runner"), cfg.HostDir)
	reattached := e.prov.last()
	reattached.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, reattached.threadOpen, "the recorded thread is resumed")
	reattached.mu.Unlock()

	// The turn goes on and ends normally: no provider_process_lost.
	reattached.finish(TurnResult{TurnID: "turn-7", Status: "completed", FinalMessage: "survived"})
	var pl map[string]any
	e.gw.waitFor("terminal of turn-7", func() bool {
		for _, ev := range e.gw.events {
			if ev.ev.GetEventType() == "run.terminal" && ev.ev.GetTurnId() == "turn-7" {
				pl = ev.ev.GetPayload().AsMap()
				return true
			}
		}
		return false
	})
	assert.Equal(t, "completed", pl["turnTerminalState"])
	assert.Equal(t, "survived", pl["finalMessage"])
	assert.Empty(t, e.gw.eventsOf("harness.exited"))
}

func TestR7_RestartedRunnerReportsTheTurnLostWhenTheHostedProviderIsGone(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.ProviderHost = true })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	attachAndTurn(t, e, cs)
	require.Equal(t, ExitOK, p.stop(t))
	crashState(t, e)
	e.prov.mu.Lock()
	e.prov.failNext = &ProviderError{Code: failure.ProviderProcessLost, Message: "the provider host is gone"}
	e.prov.mu.Unlock()

	e.start(func(c *Config) { c.ProviderHost = true })
	ex := e.gw.waitEvent("harness.exited", 1)
	assert.Equal(t, failure.ProviderProcessLost, ex.GetPayload().AsMap()["code"])
	// A fresh provider resumes the thread; the provider never recorded
	// turn-7, so it is lost (the controller retries it), never failed.
	lost := e.gw.waitEvent(EventTurnLost, 1)
	assert.Equal(t, "turn-7", lost.GetTurnId())
	assert.Equal(t, failure.ProviderProcessLost, lost.GetPayload().AsMap()["code"])
	assert.Equal(t, ReconcileMissing, lost.GetPayload().AsMap()["reconciliation"])
	for _, ev := range e.gw.eventsOf("run.terminal") {
		assert.NotEqual(t, "turn-7", ev.GetTurnId(), "the lost turn has no terminal")
	}
	require.Eventually(t, func() bool { st := e.state(); return st.ActiveTurn == nil && st.ProviderProcess != nil }, 5*time.Second, 10*time.Millisecond)
	next := e.prov.last()
	next.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, next.threadOpen)
	next.mu.Unlock()
}
