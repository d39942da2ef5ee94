package acp

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
	"github.com/tether-run/tether/services/runnerd/internal/testing/fakeacp"
)

func errCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Three warm turns on one agent process and one ACP session; the agent's
// history carries the earlier prompts; warnings sent without a messageId
// are notices, never answer text.
func TestR11_WarmTurnsKeepOneAgentSessionWithHistory(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentCodex, ApproveAll)
	s, rec, recordID := h.start("")
	require.True(t, strings.HasPrefix(recordID, "acpx-"))

	r1 := turnOf(t, s, "first prompt")
	r2 := turnOf(t, s, "second prompt")
	r3 := turnOf(t, s, "what came before [history]")
	assert.Equal(t, provider.TurnCompleted, r1.Status)
	assert.Equal(t, "ECHO: first prompt", r1.FinalMessage)
	assert.Equal(t, "ECHO: second prompt", r2.FinalMessage)
	assert.Equal(t, "HISTORY: first prompt | second prompt", r3.FinalMessage)

	calls := h.calls()
	assert.Equal(t, 1, count(calls, "process-start"), calls)
	assert.Equal(t, 1, count(calls, "session/new"), calls)
	assert.Equal(t, 3, count(calls, "session/prompt"), calls)
	notices := rec.ofType("provider.notice.recorded")
	require.Len(t, notices, 1)
	assert.Equal(t, fakeacp.WarningText, notices[0].Payload["message"])
	for _, ev := range rec.ofType("item.delta") {
		assert.NotContains(t, ev.Payload["delta"], "Warning")
	}
	assert.Len(t, rec.ofType("turn.completed"), 3)
	st := s.State()
	assert.Equal(t, int64(3), st.TurnSeq)
	assert.Equal(t, "workspace-write", st.AgentMode, "approve-all runs codex-acp in workspace-write, not the auto-review mode")
	assert.Equal(t, r3.FinalMessage, st.Turns[2].FinalMessage)
}

// session/cancel ends the active turn interrupted; the session takes the
// next prompt.
func TestR11_InterruptCancelsTheActiveTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentClaude, ApproveAll)
	s, rec, _ := h.start("")
	id, err := s.StartTurn(context.Background(), "wait for me [hold]")
	require.NoError(t, err)
	rec.waitFor(t, "item.delta")
	require.NoError(t, s.Interrupt(context.Background(), id))
	r := waitTurn(t, s, id)
	assert.Equal(t, provider.TurnInterrupted, r.Status)
	assert.Equal(t, 1, count(h.calls(), "session/cancel"))
	assert.Equal(t, failure.ProviderUnknownTurn, errCode(s.Interrupt(context.Background(), id)))

	next := turnOf(t, s, "after the cancel")
	assert.Equal(t, provider.TurnCompleted, next.Status)
	assert.Equal(t, "ECHO: after the cancel", next.FinalMessage)
}

// Each permission mode switches the agent to its mode and answers
// session/request_permission by option kind, with the agents' own option
// ids and reject semantics (codex-acp ends the turn, claude goes on).
func TestR11_PermissionModesAnsweredByOptionKind(t *testing.T) {
	t.Parallel()
	cases := []struct {
		agent, mode, prompt string
		decision, option    string
		status, final       string
		agentMode           string
	}{
		{AgentCodex, ApproveAll, "run it [shell]", "allow", "allow_once", provider.TurnCompleted, "TOOL RESULT: " + fakeacp.ToolOutput, "workspace-write"},
		{AgentCodex, DenyAll, "run it [shell]", "reject", "cancel", provider.TurnInterrupted, "", "read-only"},
		{AgentCodex, ApproveReads, "look [read]", "allow", "allow_once", provider.TurnCompleted, "TOOL RESULT: " + fakeacp.ToolOutput, "read-only"},
		{AgentClaude, ApproveAll, "run it [shell]", "allow", "allow-once", provider.TurnCompleted, "TOOL RESULT: " + fakeacp.ToolOutput, "default"},
		{AgentClaude, DenyAll, "run it [shell]", "reject", "reject", provider.TurnCompleted, "TOOL REJECTED", "default"},
		{AgentClaude, ApproveReads, "run it [shell]", "reject", "reject", provider.TurnCompleted, "TOOL REJECTED", "default"},
		{AgentClaude, ApproveReads, "look [read]", "allow", "allow-once", provider.TurnCompleted, "TOOL RESULT: " + fakeacp.ToolOutput, "default"},
	}
	for _, tc := range cases {
		t.Run(tc.agent+"/"+tc.mode+"/"+tc.prompt, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tc.agent, tc.mode)
			s, rec, _ := h.start("")
			r := turnOf(t, s, tc.prompt)
			assert.Equal(t, tc.status, r.Status)
			assert.Equal(t, tc.final, r.FinalMessage)
			assert.Equal(t, tc.agentMode, s.State().AgentMode)
			assert.Equal(t, 1, count(h.calls(), "session/set_mode"))

			d := rec.ofType("permission.decided")
			require.Len(t, d, 1)
			assert.Equal(t, tc.decision, d[0].Payload["decision"])
			assert.Equal(t, tc.option, d[0].Payload["optionId"])
			assert.Equal(t, tc.mode, d[0].Payload["permissionMode"])
			assert.Contains(t, h.calls(), "permission selected "+tc.option)

			receipts := rec.ofType("tool.receipt")
			require.Len(t, receipts, 1)
			assert.Equal(t, tc.decision, receipts[0].Payload["permission"])
			assert.Equal(t, tc.decision == "allow", receipts[0].Payload["success"])
			if tc.decision == "allow" {
				assert.Equal(t, float64(0), receipts[0].Payload["exitCode"])
			}
			if tc.status == provider.TurnInterrupted {
				assert.Contains(t, r.ErrorMessage, "declined permission")
			}
		})
	}
}

func TestR11_DecideByOptionKind(t *testing.T) {
	t.Parallel()
	codex := []Option{{"allow_once", "Yes", "allow_once"}, {"accept_execpolicy_amendment", "Always", "allow_always"}, {"cancel", "No", "reject_once"}}
	alwaysOnly := []Option{{"a", "Always", "allow_always"}, {"r", "Never", "reject_always"}}
	cases := []struct {
		mode, kind string
		options    []Option
		want       Decision
	}{
		{ApproveAll, "execute", codex, Decision{true, "allow_once", "allow_once"}},
		{ApproveAll, "edit", alwaysOnly, Decision{true, "a", "allow_always"}},
		{ApproveReads, "read", codex, Decision{true, "allow_once", "allow_once"}},
		{ApproveReads, "search", codex, Decision{true, "allow_once", "allow_once"}},
		{ApproveReads, "execute", codex, Decision{false, "cancel", "reject_once"}},
		{ApproveReads, "", codex, Decision{false, "cancel", "reject_once"}},
		{DenyAll, "read", codex, Decision{false, "cancel", "reject_once"}},
		{DenyAll, "read", alwaysOnly, Decision{false, "r", "reject_always"}},
		{DenyAll, "execute", []Option{{"y", "Yes", "allow_once"}}, Decision{}},
		{"bogus", "read", codex, Decision{false, "cancel", "reject_once"}},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, Decide(tc.mode, tc.kind, tc.options), "%s %s", tc.mode, tc.kind)
	}
	assert.Equal(t, "workspace-write", AgentMode(AgentCodex, ApproveAll))
	assert.Equal(t, "read-only", AgentMode(AgentCodex, DenyAll))
	assert.Equal(t, "default", AgentMode(AgentClaude, ApproveAll))
	assert.Equal(t, "default", AgentMode(AgentClaude, ApproveReads))
	assert.Equal(t, "", AgentMode("pi", ApproveAll))
}

// A new agent process loads the recorded session (session/load): its
// history replay is not re-emitted, and the next prompt sees the history.
// Every resume checks the recorded identity first: a different permission
// mode, workspace, model or record id is refused before session/load.
func TestR11_ResumeLoadsTheRecordedSessionAndChecksItsIdentity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentCodex, ApproveAll)
	s1, _, recordID := h.start("")
	turnOf(t, s1, "remember this")
	agentSession := s1.State().Identity.AgentSessionID
	require.NoError(t, s1.Close(context.Background(), time.Second))

	s2, rec, id := h.start(recordID)
	assert.Equal(t, recordID, id)
	started := rec.waitFor(t, "session.started")
	assert.Equal(t, true, started.Payload["resumed"])
	assert.Equal(t, agentSession, started.Payload["agentSessionId"])
	assert.Empty(t, rec.ofType("item.delta"), "the load's history replay is not news")
	r := turnOf(t, s2, "and now [history]")
	assert.Equal(t, "HISTORY: remember this", r.FinalMessage)
	assert.Equal(t, "acp-turn-2", r.TurnID, "turn ids continue from the durable counter")
	assert.Equal(t, 1, count(h.calls(), "session/load"))

	require.NoError(t, s2.Close(context.Background(), time.Second))
	mismatches := map[string]func(*Config){
		"permissionMode":  func(c *Config) { c.PermissionMode = DenyAll },
		"workspaceDigest": func(c *Config) { c.Dir = h.home },
		"requestedModel":  func(c *Config) { c.Model = "fake-model-large" },
		"profileDigest":   func(c *Config) { c.Args = append(c.Args, "-delta-delay-ms", "2") },
	}
	for field, mutate := range mismatches {
		cfg := h.config()
		mutate(&cfg)
		_, _, _, err := h.tryStart(cfg, recordID)
		assert.Equal(t, failure.RunnerHarnessStateMismatch, errCode(err), field)
		assert.Contains(t, err.Error(), field)
	}
	_, _, _, err := h.tryStart(h.config(), "acpx-someone-else")
	assert.Equal(t, failure.RunnerHarnessStateMismatch, errCode(err))
	assert.Equal(t, 1, count(h.calls(), "session/load"), "no refused resume reached the agent")
}

// An agent killed mid-turn: the session ends with the signal named, the
// turn gets no result from the dead process, and a new process loads the
// session, reconciles the turn as missing (the runner retries it) and
// takes one more turn with the history.
func TestR11_KilledAgentResumesAndReconcilesTheLostTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentClaude, ApproveAll)
	s1, rec1, recordID := h.start("")
	turnOf(t, s1, "before the kill")
	lost, err := s1.StartTurn(context.Background(), "long one [hold]")
	require.NoError(t, err)
	rec1.waitFor(t, "item.delta")
	require.NoError(t, syscall.Kill(s1.Process().PID, syscall.SIGKILL))
	select {
	case <-s1.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the session did not notice the kill")
	}
	assert.Equal(t, failure.ProviderProcessExited, errCode(s1.ExitErr()))
	assert.Contains(t, s1.ExitErr().Error(), "killed by signal SIGKILL")
	select {
	case r := <-s1.TurnDone():
		t.Fatalf("a result came from the dead process: %+v", r)
	default:
	}

	s2, _, _ := h.start(recordID)
	last, err := s2.LastTurn(context.Background())
	require.NoError(t, err)
	assert.Equal(t, lost, last)
	outcome, _, err := s2.ReconcileTurn(context.Background(), lost)
	assert.Equal(t, ReconcileMissing, outcome)
	assert.Equal(t, failure.ProviderTurnMissing, errCode(err))
	outcome, status, err := s2.ReconcileTurn(context.Background(), "acp-turn-1")
	require.NoError(t, err)
	assert.Equal(t, ReconcileTerminalized, outcome)
	assert.Equal(t, provider.TurnCompleted, status)
	assert.Equal(t, "ECHO: before the kill", waitTurn(t, s2, "acp-turn-1").FinalMessage)

	r := turnOf(t, s2, "after [history]")
	assert.Equal(t, provider.TurnCompleted, r.Status)
	assert.Contains(t, r.FinalMessage, "before the kill")
}

// Close kills the agent's whole process group: the fake, like the real
// agents, ignores stdin EOF and has a child of its own.
func TestR11_CloseKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentCodex, ApproveAll)
	h.extraArgs = []string{"-child"}
	s, _, _ := h.start("")
	turnOf(t, s, "hello")
	var child int
	for _, l := range h.calls() {
		if pid, ok := strings.CutPrefix(l, "child "); ok {
			child, _ = strconv.Atoi(pid)
		}
	}
	require.NotZero(t, child)
	pi := s.Process()
	assert.Equal(t, pi.PID, pi.PGID)
	require.NoError(t, s.Close(context.Background(), 2*time.Second))
	require.Eventually(t, func() bool {
		return !procid.Alive(pi.PID, pi.StartTicks, "") && !alive(child)
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, failure.ProviderClosed, errCode(s.ExitErr()))
}

func alive(pid int) bool {
	_, err := procid.StartTicks(pid)
	return err == nil
}

// Steering is not an ACP capability: steering_unsupported.
func TestR11_SteeringIsUnsupported(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentCodex, ApproveAll)
	s, rec, _ := h.start("")
	id, err := s.StartTurn(context.Background(), "[hold]")
	require.NoError(t, err)
	rec.waitFor(t, "item.delta")
	err = s.Steer(context.Background(), id, "change course")
	assert.Equal(t, failure.SteeringUnsupported, errCode(err))
	assert.True(t, strings.HasPrefix(err.Error(), failure.SteeringUnsupported))
	require.NoError(t, s.Interrupt(context.Background(), id))
	waitTurn(t, s, id)
}

// Usage: each turn's own ACP usage, the session's cumulative total across
// turns (kept in the durable state), and the turn's share of the agent's
// cumulative cost in its currency.
func TestR11_UsageAndCostPerTurnAndCumulative(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentClaude, ApproveAll)
	s, rec, _ := h.start("")
	r1 := turnOf(t, s, "one two")
	r2 := turnOf(t, s, "three")
	assert.Equal(t, Usage{InputTokens: 20, CachedInputTokens: 2, OutputTokens: 3}, r1.Usage)
	assert.Equal(t, Usage{InputTokens: 10, CachedInputTokens: 2, OutputTokens: 2}, r2.Usage)
	require.NotNil(t, r2.Total)
	assert.Equal(t, Usage{InputTokens: 30, CachedInputTokens: 4, OutputTokens: 5}, *r2.Total)
	require.NotNil(t, r2.Cost)
	assert.Equal(t, "USD", r2.Cost.Currency)
	assert.InDelta(t, 12.0/1e6, r2.Cost.Amount, 1e-12)
	assert.NotEmpty(t, rec.ofType("usage.reported"))
	assert.Equal(t, Usage{InputTokens: 30, CachedInputTokens: 4, OutputTokens: 5}, s.State().Cumulative)
}

// The durable state is bounded: the newest MaxTurnRecords turns, and a
// document beyond MaxStateBytes is refused.
func TestR11_DurableStateIsBounded(t *testing.T) {
	t.Parallel()
	var st State
	for i := 0; i < MaxTurnRecords+10; i++ {
		st.addTurn(TurnRecord{TurnID: "t" + strconv.Itoa(i)})
	}
	require.Len(t, st.Turns, MaxTurnRecords)
	assert.Equal(t, "t10", st.Turns[0].TurnID)
	dir := t.TempDir()
	require.NoError(t, writeState(dir, &st))
	got, err := ReadState(dir)
	require.NoError(t, err)
	assert.Len(t, got.Turns, MaxTurnRecords)

	require.NoError(t, os.WriteFile(dir+"/"+StateFile, []byte(`{"schema":"`+StateSchema+`","pad":"`+strings.Repeat("x", MaxStateBytes)+`"}`), 0o600))
	_, err = ReadState(dir)
	assert.Equal(t, failure.RunnerHarnessStateMismatch, errCode(err))
	require.NoError(t, os.WriteFile(dir+"/"+StateFile, []byte(`{"schema":"other"}`), 0o600))
	_, err = ReadState(dir)
	assert.Equal(t, failure.RunnerHarnessStateMismatch, errCode(err))
	none, err := ReadState(t.TempDir())
	assert.NoError(t, err)
	assert.Nil(t, none)
}

// The agent's environment: the allow-listed one with its homes under acpx/
// (another agent's credential home removed), the offline switches unless
// set, and IS_SANDBOX=1 for Claude Code run as root; the operator's home
// template supplies the agent's launch-only files.
func TestR11_AgentEnvironmentAndHomeTemplate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := []string{"PATH=/bin", "HOME=/root", "CODEX_HOME=/elsewhere", "CLAUDE_CONFIG_DIR=/x", "DISABLE_TELEMETRY=0", "OPENAI_API_KEY=k"}
	codexEnv := Environment(in, dir, AgentCodex, true)
	assert.ElementsMatch(t, []string{"PATH=/bin", "DISABLE_TELEMETRY=0", "OPENAI_API_KEY=k", "HOME=" + dir + "/home",
		"CODEX_HOME=" + dir + "/codex-home", "NO_BROWSER=1"}, codexEnv)
	claudeEnv := Environment(in, dir, AgentClaude, true)
	assert.Contains(t, claudeEnv, "CLAUDE_CONFIG_DIR="+dir+"/claude")
	assert.Contains(t, claudeEnv, "IS_SANDBOX=1")
	assert.Contains(t, claudeEnv, "DISABLE_TELEMETRY=0", "a configured switch wins")
	assert.Contains(t, claudeEnv, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
	assert.NotContains(t, Environment(in, dir, AgentClaude, false), "IS_SANDBOX=1")
	for _, kv := range claudeEnv {
		assert.False(t, strings.HasPrefix(kv, "CODEX_HOME="), kv)
	}

	tmpl := t.TempDir()
	require.NoError(t, os.WriteFile(tmpl+"/config.toml", []byte("model = \"m\"\n"), 0o600))
	require.NoError(t, os.WriteFile(tmpl+"/unrelated.txt", []byte("x"), 0o600))
	require.NoError(t, MakeHomes(dir, AgentCodex))
	require.NoError(t, CopyTemplate(tmpl, dir, AgentCodex))
	b, err := os.ReadFile(dir + "/codex-home/config.toml")
	require.NoError(t, err)
	assert.Equal(t, "model = \"m\"\n", string(b))
	assert.NoFileExists(t, dir+"/codex-home/unrelated.txt")
	assert.NoFileExists(t, dir+"/codex-home/auth.json")
	require.NoError(t, CopyTemplate("", dir, AgentCodex))
}
