package fakecodex

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// The notification sequence of a plain turn after the turn/start response,
// as recorded from the real server (minus warning/rateLimits noise).
var plainTurnSequence = []string{
	"thread/status/changed",
	"turn/started",
	"item/started",
	"item/completed",
	"item/started",
	"item/agentMessage/delta*",
	"item/completed",
	"thread/tokenUsage/updated",
	"thread/status/changed",
}

func findMethod(t *testing.T, msgs []wireMsg, method string, nth int) wireMsg {
	t.Helper()
	for _, m := range msgs {
		if m.Method == method {
			if nth == 0 {
				return m
			}
			nth--
		}
	}
	t.Fatalf("no %s (#%d) in %v", method, nth, methods(msgs))
	return wireMsg{}
}

func statusType(t *testing.T, m wireMsg) string {
	t.Helper()
	p := decode[struct {
		Status struct {
			Type string `json:"type"`
		} `json:"status"`
	}](t, m.Params)
	return p.Status.Type
}

// waitDeltas reads until n deltas of any item have arrived and returns all
// messages read.
func (c *testClient) waitDeltas(n int) []wireMsg {
	c.t.Helper()
	var got []wireMsg
	for seen := 0; seen < n; {
		m := c.next()
		got = append(got, m)
		if m.Method == "item/agentMessage/delta" {
			seen++
		}
	}
	return got
}

func TestR3_ThreeTurnsOnOneThreadGrowHistoryAndUsage(t *testing.T) {
	opts := fastOpts()
	opts.DeltaDelay = time.Millisecond
	c := startServer(t, opts)
	c.initialize()

	var tr threadResp
	before := c.mustCall("thread/start", map[string]any{
		"cwd": "/workspace", "approvalPolicy": "never", "sandbox": "read-only", "model": "mock-model",
	}, &tr)
	require.Empty(t, before, "thread/started must come after the response")
	threadID := tr.Thread.ID
	require.Equal(t, "codex-thread-1", threadID)
	require.Equal(t, threadID, tr.Thread.SessionID)
	require.JSONEq(t, `{"type":"idle"}`, string(tr.Thread.Status))
	require.Empty(t, tr.Thread.Turns)
	require.Equal(t, "mock-model", tr.Model)
	require.Equal(t, "/workspace", tr.Cwd)
	require.Equal(t, "never", tr.ApprovalPolicy)
	require.Equal(t, map[string]any{"type": "readOnly", "networkAccess": false}, tr.Sandbox)
	started := c.next()
	require.Equal(t, "thread/started", started.Method)
	require.Equal(t, threadID, decode[threadResp](t, started.Params).Thread.ID)

	prompts := []string{"hello mock, turn one", "second turn, do you remember?", "third turn"}
	var total codexwire.TokenCounts
	historyChars := 0
	var prevInput int64
	for i, prompt := range prompts {
		turnID := c.startTurn(threadID, prompt)
		tc, msgs := c.untilTurnCompleted(turnID)
		want := ReplyText(prompt, i+1, 2*i)
		require.Equal(t, plainTurnSequence, methods(msgs), "turn %d", i+1)

		require.Equal(t, "active", statusType(t, msgs[0]))
		require.Equal(t, "idle", statusType(t, msgs[len(msgs)-1]))
		require.Equal(t, turnID, decode[turnCompleted](t, msgs[1].Params).Turn.ID)

		user := decode[itemEvent](t, msgs[2].Params)
		require.Equal(t, itemUserMessage, user.Item.Type)
		require.Equal(t, threadID, user.ThreadID)
		require.Equal(t, turnID, user.TurnID)
		require.Equal(t, prompt, user.Item.Content[0].Text)
		require.Equal(t, user.Item.ID, decode[itemEvent](t, msgs[3].Params).Item.ID)

		agentStart := decode[itemEvent](t, msgs[4].Params)
		require.Equal(t, itemAgentMessage, agentStart.Item.Type)
		require.Empty(t, agentStart.Item.Text)
		text, n := deltasFor(t, msgs, agentStart.Item.ID)
		require.Equal(t, want, text)
		require.Equal(t, len(splitWords(want)), n)
		agentDone := decode[itemEvent](t, findMethod(t, msgs, "item/completed", 1).Params)
		require.Equal(t, agentStart.Item.ID, agentDone.Item.ID)
		require.Equal(t, want, agentDone.Item.Text)

		usage := decode[usageParams](t, findMethod(t, msgs, "thread/tokenUsage/updated", 0).Params)
		require.Equal(t, threadID, usage.ThreadID)
		require.Equal(t, turnID, usage.TurnID)
		require.Equal(t, modelContextWindow, usage.TokenUsage.ModelContextWindow)
		cached := int64(historyChars / 4)
		historyChars += utf8.RuneCountInString(prompt)
		wantLast := codexwire.TokenCounts{InputTokens: int64(historyChars/4 + 1), CachedInputTokens: cached, OutputTokens: int64(len(want)/4 + 1)}
		wantLast.TotalTokens = wantLast.InputTokens + wantLast.OutputTokens
		require.Equal(t, wantLast, usage.TokenUsage.Last)
		total.Add(wantLast)
		require.Equal(t, total, usage.TokenUsage.Total, "total is cumulative per thread")
		require.Greater(t, usage.TokenUsage.Last.InputTokens, prevInput, "input grows with history")
		prevInput = usage.TokenUsage.Last.InputTokens
		historyChars += utf8.RuneCountInString(want)

		require.Equal(t, threadID, tc.ThreadID)
		require.Equal(t, statusCompleted, tc.Turn.Status)
		require.Equal(t, "summary", tc.Turn.ItemsView)
		require.Nil(t, tc.Turn.Error)
		require.Len(t, tc.Turn.Items, 1, "turn/completed carries only the final agent message")
		require.Equal(t, want, tc.Turn.Items[0].Text)
	}

	var rr threadResp
	c.mustCall("thread/read", map[string]any{"threadId": threadID, "includeTurns": true}, &rr)
	require.JSONEq(t, `{"type":"idle"}`, string(rr.Thread.Status))
	require.Len(t, rr.Thread.Turns, 3)
	for i, turn := range rr.Thread.Turns {
		require.Equal(t, statusCompleted, turn.Status)
		require.Equal(t, "full", turn.ItemsView)
		require.Len(t, turn.Items, 2)
		require.Equal(t, prompts[i], turn.Items[0].Content[0].Text)
		require.Equal(t, ReplyText(prompts[i], i+1, 2*i), turn.Items[1].Text)
	}
	for _, m := range c.all {
		require.NotContains(t, m.Raw, `"jsonrpc"`, "server messages omit jsonrpc")
	}
}

func TestR3_InitializeOrderingErrors(t *testing.T) {
	c := startServer(t, fastOpts())

	require.Equal(t, "Not initialized", c.callErr("thread/start", map[string]any{"cwd": "/w"}))
	require.Equal(t, "Not initialized", c.callErr("turn/start", map[string]any{"threadId": "x"}))
	require.Equal(t, "Invalid request: missing field `clientInfo`", c.callErr("initialize", map[string]any{}))
	msg := c.callErr("no/such/method", map[string]any{})
	require.True(t, strings.HasPrefix(msg, "Invalid request: unknown variant `no/such/method`, expected one of `initialize`"), msg)

	var init struct {
		UserAgent      string `json:"userAgent"`
		CodexHome      string `json:"codexHome"`
		PlatformFamily string `json:"platformFamily"`
		PlatformOs     string `json:"platformOs"`
	}
	c.mustCall("initialize", map[string]any{"clientInfo": map[string]any{"name": "drv", "version": "1.2.3"}}, &init)
	require.Equal(t, "unix", init.PlatformFamily)
	require.Equal(t, "linux", init.PlatformOs)
	require.True(t, strings.HasPrefix(init.UserAgent, "drv/0.169.0 "), init.UserAgent)
	c.notifyServer("initialized") // accepted, no answer

	require.Equal(t, "Already initialized", c.callErr("initialize", map[string]any{"clientInfo": map[string]any{"name": "drv"}}))
	require.Equal(t, "thread/start.dynamicTools requires experimentalApi capability",
		c.callErr("thread/start", map[string]any{"dynamicTools": []any{map[string]any{"type": "function", "name": "x"}}}))
	require.Equal(t, "thread not found: nope", c.callErr("turn/start", map[string]any{"threadId": "nope", "input": textInput("x")}))
	require.Equal(t, "thread not found: nope", c.callErr("thread/read", map[string]any{"threadId": "nope"}))

	threadID := c.startThread()
	require.Equal(t, "Invalid request: missing field `input`", c.callErr("turn/start", map[string]any{"threadId": threadID}))
	require.Equal(t, "Invalid request: missing field `threadId`", c.callErr("turn/start", map[string]any{"input": textInput("x")}))
	require.Equal(t, "Invalid request: missing field `expectedTurnId`",
		c.callErr("turn/steer", map[string]any{"threadId": threadID, "input": textInput("x")}))
	require.Equal(t, "expected active turn id `t1` but found no active turn",
		c.callErr("turn/steer", map[string]any{"threadId": threadID, "expectedTurnId": "t1", "input": textInput("x")}))

	// Garbage lines are ignored (diagnostic on stderr only); the server keeps
	// answering.
	c.sendRaw("this is not json")
	var rr threadResp
	before := c.mustCall("thread/read", map[string]any{"threadId": threadID}, &rr)
	require.Empty(t, before)
	require.Equal(t, threadID, rr.Thread.ID)
	require.NoError(t, c.stop())
}

func TestR3_DynamicToolsWithExperimentalAPI(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	opts := fastOpts()
	opts.StateFile = state
	c := startServer(t, opts)
	c.initialize() // experimentalApi: true
	tools := []any{map[string]any{"type": "function", "name": "mock_lookup", "description": "d", "inputSchema": map[string]any{"type": "object"}}}
	var tr threadResp
	c.mustCall("thread/start", map[string]any{"cwd": "/w", "dynamicTools": tools}, &tr)
	require.NoError(t, c.stop())

	st, exists, err := loadState(state)
	require.NoError(t, err)
	require.True(t, exists)
	require.JSONEq(t, `[{"type":"function","name":"mock_lookup","description":"d","inputSchema":{"type":"object"}}]`,
		string(st.Threads[tr.Thread.ID].DynamicTools))
}

func TestR3_ResumeFromStateFileContinuesHistory(t *testing.T) {
	state := filepath.Join(t.TempDir(), "sub", "state.json")
	opts := fastOpts()
	opts.StateFile = state

	a := startServer(t, opts)
	a.initialize()
	threadID := a.startThread()
	prompts := []string{"turn one", "turn two"}
	var lastTurn string
	var totalA codexwire.TokenCounts
	for _, p := range prompts {
		lastTurn = a.startTurn(threadID, p)
		_, msgs := a.untilTurnCompleted(lastTurn)
		totalA = decode[usageParams](t, findMethod(t, msgs, "thread/tokenUsage/updated", 0).Params).TokenUsage.Total
	}
	require.NoError(t, a.stop())
	require.FileExists(t, state)
	entries, err := os.ReadDir(filepath.Dir(state))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temp files left behind by atomic writes")

	b := startServer(t, opts)
	b.initialize()
	require.Equal(t, "thread not found: "+threadID,
		b.callErr("turn/start", map[string]any{"threadId": threadID, "input": textInput("x")}),
		"turn/start needs thread/resume in a new process")

	var rr threadResp
	before := b.mustCall("thread/resume", map[string]any{"threadId": threadID}, &rr)
	require.Equal(t, []string{"deprecationNotice", "thread/status/changed"}, methods(before))
	require.Equal(t, "idle", statusType(t, before[1]))
	require.Equal(t, threadID, rr.Thread.ID)
	require.Len(t, rr.Thread.Turns, 2)
	for i, turn := range rr.Thread.Turns {
		require.Equal(t, statusCompleted, turn.Status)
		require.Len(t, turn.Items, 2)
		require.Equal(t, prompts[i], turn.Items[0].Content[0].Text)
		require.Equal(t, ReplyText(prompts[i], i+1, 2*i), turn.Items[1].Text)
	}

	// The first turn/start after a resume replays the persisted totals,
	// tagged with the last stored turn, before its response.
	var ts struct {
		Turn struct {
			ID string `json:"id"`
		} `json:"turn"`
	}
	before = b.mustCall("turn/start", map[string]any{"threadId": threadID, "input": textInput("turn three")}, &ts)
	require.Equal(t, []string{"thread/tokenUsage/updated"}, methods(before))
	replay := decode[usageParams](t, before[0].Params)
	require.Equal(t, lastTurn, replay.TurnID)
	require.Equal(t, totalA, replay.TokenUsage.Total)

	tc, msgs := b.untilTurnCompleted(ts.Turn.ID)
	require.Equal(t, plainTurnSequence, methods(msgs))
	require.Equal(t, ReplyText("turn three", 3, 4), tc.Turn.Items[0].Text)
	usage := decode[usageParams](t, findMethod(t, msgs, "thread/tokenUsage/updated", 0).Params)
	want := totalA
	want.Add(usage.TokenUsage.Last)
	require.Equal(t, want, usage.TokenUsage.Total, "totals continue across processes")
	for _, m := range b.all {
		require.NotEqual(t, "thread/started", m.Method, "no thread/started on resume")
	}

	// Thread counter is persisted too.
	require.Equal(t, "codex-thread-2", b.startThread())
	require.NoError(t, b.stop())
}

func TestR3_ResumeUnknownThreadErrors(t *testing.T) {
	dir := t.TempDir()

	opts := fastOpts()
	opts.StateFile = filepath.Join(dir, "missing.json")
	opts.RequireExistingResumeState = true
	c := startServer(t, opts)
	c.initialize()
	require.Equal(t, "no rollout found for thread id codex-thread-7",
		c.callErr("thread/resume", map[string]any{"threadId": "codex-thread-7"}))
	require.NoError(t, c.stop())
	require.NoFileExists(t, opts.StateFile)

	opts.RequireExistingResumeState = false
	c = startServer(t, opts)
	c.initialize()
	require.Equal(t, "thread not found: codex-thread-7",
		c.callErr("thread/resume", map[string]any{"threadId": "codex-thread-7"}))
	require.NoError(t, c.stop())
}

func TestR3_StateFileInCodexHome(t *testing.T) {
	home := t.TempDir()
	opts := fastOpts()
	opts.StateFileInCodexHome = true
	opts.CodexHome = home
	srv, err := New(opts)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(home, StateFileName), srv.StatePath())

	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()
	turnID := c.startTurn(threadID, "kept in codex home")
	c.untilTurnCompleted(turnID)
	require.NoError(t, c.stop())

	// The history moves with the codex home directory.
	moved := filepath.Join(t.TempDir(), "restored-home")
	require.NoError(t, os.Rename(home, moved))
	opts.CodexHome = moved
	c = startServer(t, opts)
	c.initialize()
	var rr threadResp
	c.mustCall("thread/resume", map[string]any{"threadId": threadID, "excludeTurns": true}, &rr)
	require.Empty(t, rr.Thread.Turns, "excludeTurns")
	c.mustCall("thread/read", map[string]any{"threadId": threadID, "includeTurns": true}, &rr)
	require.Len(t, rr.Thread.Turns, 1)
	require.NoError(t, c.stop())

	opts.CodexHome = ""
	_, err = New(opts)
	require.Error(t, err)
}

func TestR3_SteerRestartsActiveTurn(t *testing.T) {
	opts := fastOpts()
	opts.HoldTurn = true
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()

	turnID := c.startTurn(threadID, "first prompt")
	held := c.waitDeltas(len(splitWords(ReplyText("first prompt", 1, 0))))
	firstAgent := decode[itemEvent](t, findMethod(t, held, "item/started", 1).Params).Item.ID

	var rr threadResp
	before := c.mustCall("thread/read", map[string]any{"threadId": threadID}, &rr)
	require.Empty(t, before, "a held turn emits nothing more")
	require.Equal(t, "active", decode[struct {
		Type string `json:"type"`
	}](t, rr.Thread.Status).Type)
	require.Len(t, rr.Thread.Turns, 1)
	require.Equal(t, turnID, rr.Thread.Turns[0].ID)
	require.Equal(t, statusInProgress, rr.Thread.Turns[0].Status)

	require.Equal(t, "expected active turn id `not-the-active-turn` but found `"+turnID+"`",
		c.callErr("turn/steer", map[string]any{"threadId": threadID, "expectedTurnId": "not-the-active-turn", "input": textInput("x")}))

	var steer struct {
		TurnID string `json:"turnId"`
	}
	before = c.mustCall("turn/steer", map[string]any{"threadId": threadID, "expectedTurnId": turnID, "input": textInput("steer: also mention bananas")}, &steer)
	require.Empty(t, before)
	require.Equal(t, turnID, steer.TurnID)

	tc, msgs := c.untilTurnCompleted(turnID)
	// No usage yet on this thread, so no re-emitted totals before the new
	// user message.
	require.Equal(t, []string{
		"item/started", "item/completed", // steer userMessage
		"item/started", "item/agentMessage/delta*", "item/completed", // fresh reply
		"thread/tokenUsage/updated", "thread/status/changed",
	}, methods(msgs))
	steerItem := decode[itemEvent](t, msgs[0].Params)
	require.Equal(t, itemUserMessage, steerItem.Item.Type)
	require.Equal(t, "steer: also mention bananas", steerItem.Item.Content[0].Text)
	want := ReplyText("first prompt | steer: also mention bananas", 1, 0)
	require.Equal(t, statusCompleted, tc.Turn.Status)
	require.Len(t, tc.Turn.Items, 1)
	require.Equal(t, want, tc.Turn.Items[0].Text)
	require.NotEqual(t, firstAgent, tc.Turn.Items[0].ID)
	for _, m := range c.all {
		if m.Method == "item/completed" {
			require.NotEqual(t, firstAgent, decode[itemEvent](t, m.Params).Item.ID, "the partial reply never completes")
		}
	}

	c.mustCall("thread/read", map[string]any{"threadId": threadID, "includeTurns": true}, &rr)
	require.Len(t, rr.Thread.Turns[0].Items, 3, "user, steer user, final agent; the partial reply is dropped")
	require.Equal(t, want, rr.Thread.Turns[0].Items[2].Text)

	// turn/start while a turn is active joins it like a steer; now that the
	// thread has usage, the unchanged totals are re-emitted first.
	turn2 := c.startTurn(threadID, "second")
	c.waitDeltas(len(splitWords(ReplyText("second", 2, 3))))
	var joined struct {
		Turn struct {
			ID string `json:"id"`
		} `json:"turn"`
	}
	c.mustCall("turn/start", map[string]any{"threadId": threadID, "input": textInput("more input")}, &joined)
	require.Equal(t, turn2, joined.Turn.ID)
	tc, msgs = c.untilTurnCompleted(turn2)
	require.Equal(t, "thread/tokenUsage/updated", msgs[0].Method)
	reemit := decode[usageParams](t, msgs[0].Params)
	final := decode[usageParams](t, findMethod(t, msgs, "thread/tokenUsage/updated", 1).Params)
	require.Equal(t, reemit.TokenUsage.Total.TotalTokens+final.TokenUsage.Last.TotalTokens, final.TokenUsage.Total.TotalTokens)
	require.Equal(t, ReplyText("second | more input", 2, 3), tc.Turn.Items[0].Text)
	require.NoError(t, c.stop())
}

func TestR3_SteerSlowTurnMidStream(t *testing.T) {
	opts := fastOpts()
	opts.SlowDeltaDelay = 40 * time.Millisecond
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()

	turnID := c.startTurn(threadID, "[slow] please answer slowly")
	first := c.waitDeltas(1)
	partial := decode[deltaEvent](t, first[len(first)-1].Params).ItemID
	c.mustCall("turn/steer", map[string]any{"threadId": threadID, "expectedTurnId": turnID, "input": textInput("steer: faster")}, nil)
	tc, msgs := c.untilTurnCompleted(turnID)

	_, partialDeltas := deltasFor(t, c.all, partial)
	require.Less(t, partialDeltas, SlowChunks, "the slow reply was cut short")
	want := ReplyText("[slow] please answer slowly | steer: faster", 1, 0)
	require.Equal(t, want, tc.Turn.Items[0].Text)
	text, n := deltasFor(t, msgs, tc.Turn.Items[0].ID)
	require.Equal(t, want, text)
	require.Equal(t, len(splitWords(want)), n, "the latest input has no [slow], so the new reply is fast")
	require.NoError(t, c.stop())
}

func TestR3_InterruptEndsTurnInterrupted(t *testing.T) {
	opts := fastOpts()
	opts.HoldTurn = true
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()

	turnID := c.startTurn(threadID, "this will be interrupted")
	c.waitDeltas(1)
	require.Equal(t, "expected active turn id `other` but found `"+turnID+"`",
		c.callErr("turn/interrupt", map[string]any{"threadId": threadID, "turnId": "other"}))

	resp, before := c.call("turn/interrupt", map[string]any{"threadId": threadID, "turnId": turnID})
	require.Nil(t, resp.Error)
	require.JSONEq(t, `{}`, string(resp.Result))
	for _, m := range before {
		require.Equal(t, "item/agentMessage/delta", m.Method, "only leftover deltas before the ack")
	}
	tc, msgs := c.untilTurnCompleted(turnID)
	require.Equal(t, []string{"thread/status/changed"}, methods(msgs))
	require.Equal(t, "idle", statusType(t, msgs[0]))
	require.Equal(t, statusInterrupted, tc.Turn.Status)
	require.Empty(t, tc.Turn.Items)
	require.Equal(t, "notLoaded", tc.Turn.ItemsView)

	// Interrupting again is a no-op.
	resp, before = c.call("turn/interrupt", map[string]any{"threadId": threadID, "turnId": turnID})
	require.Nil(t, resp.Error)
	require.Empty(t, before)

	var rr threadResp
	c.mustCall("thread/read", map[string]any{"threadId": threadID, "includeTurns": true}, &rr)
	require.Len(t, rr.Thread.Turns, 1)
	require.Equal(t, statusInterrupted, rr.Thread.Turns[0].Status)
	require.Len(t, rr.Thread.Turns[0].Items, 1, "the interrupted prompt stays in history, the partial reply does not")

	// The next turn sees the interrupted prompt as an earlier message.
	turn2 := c.startTurn(threadID, "after interrupt")
	c.waitDeltas(len(splitWords(ReplyText("after interrupt", 2, 1))))
	c.mustCall("turn/steer", map[string]any{"threadId": threadID, "expectedTurnId": turn2, "input": textInput("go")}, nil)
	tc, _ = c.untilTurnCompleted(turn2)
	require.Equal(t, ReplyText("after interrupt | go", 2, 1), tc.Turn.Items[0].Text)
	require.NoError(t, c.stop())
}

func TestR3_CallLogLines(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "calls.log")
	opts := fastOpts()
	opts.StateFile = filepath.Join(dir, "state.json")
	opts.CallLog = logPath
	opts.RecordProcessStart = true

	a := startServer(t, opts)
	a.initialize()
	threadID := a.startThread()
	turnID := a.startTurn(threadID, "hi")
	a.untilTurnCompleted(turnID)
	// Responses to server requests (id, no method) are logged as outcomes.
	a.sendRaw(`{"id":0,"result":{"contentItems":[{"type":"inputText","text":"lookup(alpha) = 42"}],"success":true}}`)
	a.sendRaw(`{"id":1,"result":{"contentItems":[],"success":false}}`)
	a.sendRaw(`{"id":2,"error":{"code":-1,"message":"no"}}`)
	a.sendRaw(`{"id":3,"result":{"decision":"accept"}}`)
	a.mustCall("thread/read", map[string]any{"threadId": threadID}, nil)
	require.NoError(t, a.stop())

	b := startServer(t, opts)
	b.initialize()
	b.mustCall("thread/resume", map[string]any{"threadId": threadID}, nil)
	require.NoError(t, b.stop())

	data, err := os.ReadFile(logPath)
	require.NoError(t, err)
	require.Equal(t, []string{
		"process-start",
		"initialize",
		"initialized",
		"thread/start",
		"turn/start",
		"tool-response:lookup(alpha) = 42",
		"tool-response:failure",
		"tool-response:failure",
		`tool-response:{"decision":"accept"}`,
		"thread/read",
		"process-start",
		"initialize",
		"initialized",
		"thread/resume",
	}, strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"))
}

func TestR3_DurableTurnIDsUniqueAcrossRestarts(t *testing.T) {
	run := func(durable bool) []string {
		opts := fastOpts()
		opts.StateFile = filepath.Join(t.TempDir(), "state.json")
		opts.DurableTurnIDs = durable
		var ids []string
		threadID := ""
		for proc := 0; proc < 3; proc++ {
			c := startServer(t, opts)
			c.initialize()
			if threadID == "" {
				threadID = c.startThread()
			} else {
				c.mustCall("thread/resume", map[string]any{"threadId": threadID}, nil)
			}
			for i := 0; i < 2; i++ {
				id := c.startTurn(threadID, "turn")
				c.untilTurnCompleted(id)
				ids = append(ids, id)
			}
			require.NoError(t, c.stop())
		}
		return ids
	}

	durable := run(true)
	require.Equal(t, []string{
		"provider-turn-1", "provider-turn-2", "provider-turn-3",
		"provider-turn-4", "provider-turn-5", "provider-turn-6",
	}, durable)

	perProcess := run(false)
	require.Equal(t, []string{
		"codex-turn-1", "codex-turn-2", "codex-turn-1",
		"codex-turn-2", "codex-turn-1", "codex-turn-2",
	}, perProcess, "without --durable-turn-ids ids restart with each process")
}

func TestR3_ExitAfterTurnStart(t *testing.T) {
	opts := fastOpts()
	opts.StateFile = filepath.Join(t.TempDir(), "state.json")
	opts.ExitAfterTurnStart = true
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()
	turnID := c.startTurn(threadID, "doomed")
	_, open := <-c.msgs
	require.False(t, open, "nothing is written after the turn/start response")
	require.ErrorIs(t, c.stop(), ErrExitAfterTurnStart)

	opts.ExitAfterTurnStart = false
	c = startServer(t, opts)
	c.initialize()
	var rr threadResp
	c.mustCall("thread/resume", map[string]any{"threadId": threadID}, &rr)
	require.Len(t, rr.Thread.Turns, 1)
	require.Equal(t, turnID, rr.Thread.Turns[0].ID)
	require.Equal(t, statusInterrupted, rr.Thread.Turns[0].Status, "a turn cut off by a crash resumes as interrupted")
	require.Len(t, rr.Thread.Turns[0].Items, 1)
	require.NoError(t, c.stop())
}

func TestR3_EOFExitsCleanlyMidTurn(t *testing.T) {
	opts := fastOpts()
	opts.HoldTurn = true
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()
	c.startTurn(threadID, "never finishes")
	c.waitDeltas(1)
	require.NoError(t, c.stop())
}

func TestR3_CorruptStateFileIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o644))
	_, err := New(Options{StateFile: path})
	require.Error(t, err)

	raw, err := json.Marshal(map[string]any{"version": 99})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	_, err = New(Options{StateFile: path})
	require.ErrorContains(t, err, "unsupported version")
}

func TestR3_TwoProcessesShareStateFile(t *testing.T) {
	opts := fastOpts()
	opts.StateFile = filepath.Join(t.TempDir(), "state.json")
	opts.DurableTurnIDs = true
	a := startServer(t, opts)
	b := startServer(t, opts)
	a.initialize()
	b.initialize()
	threadA := a.startThread()
	threadB := b.startThread()
	require.NotEqual(t, threadA, threadB)

	turnA := a.startTurn(threadA, "from a")
	a.untilTurnCompleted(turnA)
	turnB := b.startTurn(threadB, "from b")
	b.untilTurnCompleted(turnB)
	require.NotEqual(t, turnA, turnB)

	// Each process sees the other's thread through the state file.
	var rr threadResp
	b.mustCall("thread/read", map[string]any{"threadId": threadA, "includeTurns": true}, &rr)
	require.Len(t, rr.Thread.Turns, 1)
	require.NoError(t, a.stop())
	require.NoError(t, b.stop())

	st, _, err := loadState(opts.StateFile)
	require.NoError(t, err)
	require.Len(t, st.Threads, 2, "neither process dropped the other's thread")
	require.Len(t, st.Threads[threadA].Turns, 1)
	require.Len(t, st.Threads[threadB].Turns, 1)
}

func TestR3_StallMidStreamHoldsTheTurnUntilReleasedWhileTheServerAnswers(t *testing.T) {
	dir := t.TempDir()
	opts := fastOpts()
	opts.DieOnceDir = dir
	opts.CallLog = filepath.Join(dir, "calls.log")
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()

	const prompt = "[stall:mid-stream] hold this turn after its first delta"
	turnID := c.startTurn(threadID, prompt)
	c.waitDeltas(1)
	// Held: the server answers a request, and no further delta came first.
	var rr threadResp
	before := c.mustCall("thread/read", map[string]any{"threadId": threadID, "includeTurns": true}, &rr)
	for _, m := range before {
		require.NotEqual(t, "item/agentMessage/delta", m.Method, "the turn is held after its first delta")
	}
	require.Equal(t, statusInProgress, rr.Thread.Turns[0].Status)
	log, err := os.ReadFile(opts.CallLog)
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(log), "\n"), "stall:"+StallMidStream)

	require.NoError(t, os.WriteFile(filepath.Join(dir, ReleaseFile(StallMidStream)), nil, 0o600))
	tc, _ := c.untilTurnCompleted(turnID)
	require.Equal(t, statusCompleted, tc.Turn.Status)
	require.Equal(t, ReplyText(prompt, 1, 0), tc.Turn.Items[0].Text)

	// Once per prompt: the same prompt again is not held (no release file).
	require.NoError(t, os.Remove(filepath.Join(dir, ReleaseFile(StallMidStream))))
	turn2 := c.startTurn(threadID, prompt)
	tc, _ = c.untilTurnCompleted(turn2)
	require.Equal(t, statusCompleted, tc.Turn.Status)
	require.NoError(t, c.stop())
}

// TestP4_TheFakeSavesItsStateOnOneLine counts the lines of the state file
// after a turn: the save (and every refresh that parses the file again) no
// longer carries an indentation that doubled the file.
func TestP4_TheFakeSavesItsStateOnOneLine(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	opts := fastOpts()
	opts.StateFile = state
	c := startServer(t, opts)
	c.initialize()
	var tr threadResp
	c.mustCall("thread/start", map[string]any{"cwd": "/w"}, &tr)
	require.NoError(t, c.stop())

	raw, err := os.ReadFile(state)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(raw), "\n"), "the state file is one line and its newline")
	st, exists, err := loadState(state)
	require.NoError(t, err)
	require.True(t, exists)
	require.Contains(t, st.Threads, tr.Thread.ID)
}
