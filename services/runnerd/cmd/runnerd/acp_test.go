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
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// TestR11_RunnerdKillMidTurnLoadsTheACPSessionAndRetriesTheTurn: runnerd
// driving an ACP agent (profile acpx-codex) is SIGKILLed mid-turn. The agent
// is not hosted, so the restarted runnerd kills what is left of its group,
// loads the recorded ACP session in a new agent process, reports the turn
// lost (retryable; never a silent second start), and the next turn sees the
// session's history (SPEC R8, R11).
func TestR11_RunnerdKillMidTurnLoadsTheACPSessionAndRetriesTheTurn(t *testing.T) {
	t.Parallel()
	runnerd, fake, g, url, stateDir, ws, callLog := newBinRunnerd(t, "fake-acp-agent")
	args := []string{"--state-dir", stateDir, "--workspace", ws, "--provider", "acpx-codex", "--provider-command", fake,
		"--provider-arg", "-flavor", "--provider-arg", "codex", "--provider-arg", "-call-log=" + callLog}

	first := startRunnerd(t, runnerd, g, url, args...)
	c := newFrameCollector(t, g)
	c.send("c1", "run.attach", map[string]any{"input": inputMap(t, &prpv1.Provider{Kind: "acpx", Agent: "codex", PermissionMode: "approve-all"})})
	c.send("c2", "turn.start", map[string]any{"text": "first words"})
	c.collect(func() bool { return c.count("run.terminal") >= 1 }, "the first turn's run.terminal")
	c.send("c3", "turn.start", map[string]any{"text": "a long one [hold]"})
	c.collect(func() bool {
		for _, ev := range c.events {
			if ev.GetEventType() == "item.delta" && ev.GetTurnId() == "acp-turn-2" {
				return true
			}
		}
		return false
	}, "a delta of the held turn")

	st, err := (&statedir.Store{Dir: filepath.Join(stateDir, "runner")}).Load()
	require.NoError(t, err)
	agent := st.ProviderProcess
	require.NotNil(t, agent)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	<-first.exited
	require.True(t, procid.Alive(agent.PID, agent.StartTicks, ""), "the agent outlived its runnerd (it ignores stdin EOF)")

	g.mu.Lock()
	g.conn = nil
	g.mu.Unlock()
	second := startRunnerd(t, runnerd, g, url, args...)
	c.collect(func() bool { return c.count("turn.lost") >= 1 }, "turn.lost")
	require.Eventually(t, func() bool { return !procid.Alive(agent.PID, agent.StartTicks, "") }, 10*time.Second, 20*time.Millisecond,
		"the restarted runnerd killed the orphaned agent's group")

	c.send("c4", "turn.start", map[string]any{"text": "and now [history]"})
	c.collect(func() bool { return c.count("run.terminal") >= 2 }, "the next turn's run.terminal")
	var finals []string
	for _, ev := range c.events {
		if ev.GetEventType() == "run.terminal" {
			finals = append(finals, ev.GetPayload().AsMap()["finalMessage"].(string))
		}
	}
	assert.ElementsMatch(t, []string{"ECHO: first words", "HISTORY: first words"}, finals)
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(calls), "process-start\n"), "a new agent process after the kill")
	assert.Equal(t, 1, strings.Count(string(calls), "session/new\n"))
	assert.Equal(t, 1, strings.Count(string(calls), "session/load\n"), "the recorded session was loaded")
	assert.Equal(t, 3, strings.Count(string(calls), "session/prompt\n"), "the lost turn was not started again behind the controller's back")

	require.NoError(t, syscall.Kill(second.cmd.Process.Pid, syscall.SIGTERM))
	select {
	case <-second.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("runnerd did not exit on SIGTERM")
	}
}
