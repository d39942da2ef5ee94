package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// TestR8_RunnerdKilledAfterAnsweringATurnStartFromItsOutcomeRecordNeverStartsItAgain:
// the real runnerd answers a warm path's run.attach and turn.start once
// their outcomes are journaled in the intent log, before its state document
// holds them; killed (SIGKILL) right after the turn.start's answer, the
// relaunched runnerd finds the outcomes in the log: the resent commands get
// their stored answers (the same turn), the provider turn is started once,
// and the turn goes on to its one run.terminal.
func TestR8_RunnerdKilledAfterAnsweringATurnStartFromItsOutcomeRecordNeverStartsItAgain(t *testing.T) {
	t.Parallel()
	runnerd, fake, g, url, stateDir, ws, callLog := newBinRunnerd(t, "fake-codex-app-server")
	args := []string{"--state-dir", stateDir, "--workspace", ws, "--provider-command", fake,
		"--provider-arg", "app-server", "--provider-arg", "--delta-delay-ms=25", "--provider-arg", "--state-file-in-codex-home",
		"--provider-arg", "--durable-turn-ids", "--provider-arg", "--call-log=" + callLog}

	first := startRunnerd(t, runnerd, g, url, args...)
	c := newFrameCollector(t, g)
	attach := map[string]any{"input": inputMap(t, &prpv1.Provider{Kind: "codex", Model: "gpt-fake"})}
	prompt := "tell me a long story with many many words so that the reply streams for quite a while before the turn ends"
	c.send("c1", "run.attach", attach)
	c.send("c2", "turn.start", map[string]any{"text": prompt})
	answer := func(from int) *prpv1.CommandResult {
		for _, r := range c.results[from:] {
			if r.GetCommandId() == "c2" {
				return r
			}
		}
		return nil
	}
	c.collect(func() bool { return answer(0) != nil }, "the turn.start's answer")
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	<-first.exited
	first1 := answer(0)
	require.Equal(t, runnerstate.StatusCompleted, first1.GetStatus(), first1.GetMessage())
	turnID := first1.GetResult().AsMap()["turnId"]
	require.NotEmpty(t, turnID)

	dir := filepath.Join(stateDir, "runner")
	ins, err := statedir.ReadIntentLog(dir)
	require.NoError(t, err)
	doc, err := (&statedir.Store{Dir: dir}).Load()
	require.NoError(t, err)
	if rec := doc.ProcessedCommands["c2"]; rec != nil {
		assert.NotEqual(t, runnerstate.StatusCompleted, rec.Status, "answered before the state document held it")
	}
	statedir.ReplayIntents(doc, ins)
	require.NotNil(t, doc.ProcessedCommands["c2"])
	assert.Equal(t, runnerstate.StatusCompleted, doc.ProcessedCommands["c2"].Status, "the intent log holds the outcome")
	require.NotNil(t, doc.ActiveTurn)
	assert.Equal(t, turnID, doc.ActiveTurn.TurnID)

	g.mu.Lock()
	g.conn = nil
	g.mu.Unlock()
	startRunnerd(t, runnerd, g, url, args...)
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)
	from := len(c.results)
	c.seq = 0 // the controller resends both
	c.send("c1", "run.attach", attach)
	c.send("c2", "turn.start", map[string]any{"text": prompt})
	c.collect(func() bool { return answer(from) != nil }, "the resent turn.start's answer")
	again := answer(from)
	assert.Equal(t, runnerstate.StatusCompleted, again.GetStatus(), again.GetMessage())
	assert.Equal(t, turnID, again.GetResult().AsMap()["turnId"], "the stored answer: the same turn")
	for _, r := range c.results[from:] {
		if r.GetCommandId() == "c1" {
			assert.Equal(t, runnerstate.StatusCompleted, r.GetStatus(), r.GetMessage())
		}
	}
	c.collect(func() bool { return c.count("run.terminal") >= 1 }, "run.terminal")
	assert.Equal(t, 1, c.count("run.terminal"))
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(calls), "turn/start\n"), "the provider turn started exactly once")
}
