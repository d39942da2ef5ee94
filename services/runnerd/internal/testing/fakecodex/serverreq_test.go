package fakecodex

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func isServerRequest(method string) func(wireMsg) bool {
	return func(m wireMsg) bool { return m.Method == method && len(m.ID) > 0 }
}

func readCallLog(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func itemOf(t *testing.T, m wireMsg) map[string]any {
	t.Helper()
	p := decode[struct {
		Item map[string]any `json:"item"`
	}](t, m.Params)
	return p.Item
}

func TestR3_CommandApprovalAcceptDeclineCancel(t *testing.T) {
	dir := t.TempDir()
	opts := fastOpts()
	opts.CallLog = filepath.Join(dir, "calls.log")
	opts.EmitCommandApproval = true
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()

	// accept: the command runs and the reply names the decision.
	turn1 := c.startTurn(threadID, "make a dir")
	req, before := c.until(isServerRequest("item/commandExecution/requestApproval"))
	assert.Equal(t, "0", string(req.ID), "server request ids start at 0")
	started := findMethod(t, before, "item/started", 1)
	assert.Equal(t, "commandExecution", itemOf(t, started)["type"])
	p := decode[map[string]any](t, req.Params)
	assert.Equal(t, turn1, p["turnId"])
	assert.Equal(t, FakeShellCommand, p["command"])
	c.send(map[string]any{"id": 0, "result": map[string]any{"decision": "accept"}})
	tc, msgs := c.untilTurnCompleted(turn1)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
	assert.Contains(t, tc.Turn.Items[0].Text, "[approval: accept]")
	done := findMethod(t, msgs, "item/completed", 0)
	assert.Equal(t, "completed", itemOf(t, done)["status"])
	findMethod(t, msgs, "serverRequest/resolved", 0)
	findMethod(t, msgs, "item/commandExecution/outputDelta", 0)

	// decline: the item is declined and the turn goes on.
	turn2 := c.startTurn(threadID, "again")
	req, _ = c.until(isServerRequest("item/commandExecution/requestApproval"))
	assert.Equal(t, "1", string(req.ID))
	c.send(map[string]any{"id": 1, "result": map[string]any{"decision": "decline"}})
	tc, msgs = c.untilTurnCompleted(turn2)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
	assert.Equal(t, "declined", itemOf(t, findMethod(t, msgs, "item/completed", 0))["status"])

	// cancel: the turn is interrupted.
	turn3 := c.startTurn(threadID, "third")
	c.until(isServerRequest("item/commandExecution/requestApproval"))
	c.send(map[string]any{"id": 2, "result": map[string]any{"decision": "cancel"}})
	tc, _ = c.untilTurnCompleted(turn3)
	assert.Equal(t, statusInterrupted, tc.Turn.Status)
	require.NoError(t, c.stop())

	assert.Equal(t, []string{
		"initialize", "initialized", "thread/start",
		"turn/start", "approval-response:accept",
		"turn/start", "approval-response:decline",
		"turn/start", "approval-response:cancel",
	}, readCallLog(t, opts.CallLog))
}

func TestR3_UserInputRequestAnswered(t *testing.T) {
	dir := t.TempDir()
	opts := fastOpts()
	opts.CallLog = filepath.Join(dir, "calls.log")
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()
	turnID := c.startTurn(threadID, "[ask] which color?")
	req, _ := c.until(isServerRequest("item/tool/requestUserInput"))
	p := decode[struct {
		TurnID    string `json:"turnId"`
		ItemID    string `json:"itemId"`
		Questions []struct {
			ID      string `json:"id"`
			Options []struct {
				Label string `json:"label"`
			} `json:"options"`
		} `json:"questions"`
	}](t, req.Params)
	assert.Equal(t, turnID, p.TurnID)
	require.Len(t, p.Questions, 1)
	assert.Equal(t, "color", p.Questions[0].ID)
	assert.Equal(t, "red", p.Questions[0].Options[0].Label)
	c.send(map[string]any{"id": json.RawMessage(req.ID), "result": map[string]any{"answers": map[string]any{"color": map[string]any{"answers": []string{"blue"}}}}})
	tc, _ := c.untilTurnCompleted(turnID)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
	assert.Contains(t, tc.Turn.Items[0].Text, "[input: color=blue]")
	require.NoError(t, c.stop())
	assert.Contains(t, readCallLog(t, opts.CallLog), "user-input-response:color=blue")
}

func TestR3_DynamicToolCallAnswered(t *testing.T) {
	dir := t.TempDir()
	opts := fastOpts()
	opts.CallLog = filepath.Join(dir, "calls.log")
	opts.EmitToolCall = true
	c := startServer(t, opts)
	c.initialize()
	var r threadResp
	c.mustCall("thread/start", map[string]any{"dynamicTools": []any{map[string]any{"type": "function", "name": "lookup_thing"}}}, &r)
	threadID := r.Thread.ID
	turnID := c.startTurn(threadID, "look it up")
	req, before := c.until(isServerRequest("item/tool/call"))
	p := decode[map[string]any](t, req.Params)
	assert.Equal(t, "lookup_thing", p["tool"])
	assert.Equal(t, map[string]any{"key": "alpha"}, p["arguments"])
	assert.Equal(t, turnID, p["turnId"])
	assert.Equal(t, "dynamicToolCall", itemOf(t, findMethod(t, before, "item/started", 1))["type"])
	c.send(map[string]any{"id": json.RawMessage(req.ID), "result": map[string]any{"success": true, "contentItems": []any{map[string]any{"type": "inputText", "text": "lookup(alpha) = 42"}}}})
	tc, msgs := c.untilTurnCompleted(turnID)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
	assert.Contains(t, tc.Turn.Items[0].Text, "[tool: lookup(alpha) = 42]")
	item := itemOf(t, findMethod(t, msgs, "item/completed", 0))
	assert.Equal(t, "completed", item["status"])
	assert.Equal(t, true, item["success"])
	require.NoError(t, c.stop())
	assert.Contains(t, readCallLog(t, opts.CallLog), "tool-response:lookup(alpha) = 42")
}

func TestR3_ToolCallOnResumeNamesTheOldTurn(t *testing.T) {
	dir := t.TempDir()
	opts := fastOpts()
	opts.StateFile = filepath.Join(dir, "state.json")
	opts.CallLog = filepath.Join(dir, "calls.log")
	opts.DurableTurnIDs = true
	a := startServer(t, opts)
	a.initialize()
	threadID := a.startThread()
	turnID := a.startTurn(threadID, "first")
	a.untilTurnCompleted(turnID)
	require.NoError(t, a.stop())

	opts.EmitToolCallOnResume = true
	opts.RecordProcessStart = true
	b := startServer(t, opts)
	b.initialize()
	b.mustCall("thread/resume", map[string]any{"threadId": threadID, "excludeTurns": true}, nil)
	req, _ := b.until(isServerRequest("item/tool/call"))
	p := decode[map[string]any](t, req.Params)
	assert.Equal(t, turnID, p["turnId"], "the stale call names the last stored turn")
	b.send(map[string]any{"id": json.RawMessage(req.ID), "result": map[string]any{"success": false, "contentItems": []any{map[string]any{"type": "inputText", "text": "native_tool_authority_epoch_revoked: stale"}}}})
	// A new turn still works.
	t2 := b.startTurn(threadID, "second")
	tc, _ := b.untilTurnCompleted(t2)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
	require.NoError(t, b.stop())
	log := readCallLog(t, opts.CallLog)
	assert.Equal(t, []string{"process-start", "initialize", "initialized", "thread/resume", "tool-response:failure", "turn/start"}, log[len(log)-6:])
}

func TestR3_InterruptWithdrawsOpenApproval(t *testing.T) {
	opts := fastOpts()
	c := startServer(t, opts)
	c.initialize()
	threadID := c.startThread()
	turnID := c.startTurn(threadID, "[shell] do it")
	req, _ := c.until(isServerRequest("item/commandExecution/requestApproval"))
	resp, msgs := c.call("turn/interrupt", map[string]any{"threadId": threadID, "turnId": turnID})
	require.Nil(t, resp.Error)
	_ = msgs
	tc, after := c.untilTurnCompleted(turnID)
	assert.Equal(t, statusInterrupted, tc.Turn.Status)
	res := findMethod(t, after, "serverRequest/resolved", 0)
	assert.Equal(t, string(req.ID), string(decode[map[string]json.RawMessage](t, res.Params)["requestId"]))
	// A late answer is only logged.
	c.send(map[string]any{"id": json.RawMessage(req.ID), "result": map[string]any{"decision": "accept"}})
	t2 := c.startTurn(threadID, "next")
	tc, _ = c.untilTurnCompleted(t2)
	assert.Equal(t, statusCompleted, tc.Turn.Status)
}
