package fakeacp

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// turn is one session/prompt in progress.
type turn struct {
	a    *Agent
	s    *session
	text string
	out  []string // reply words sent, for usage
}

func (t *turn) update(u map[string]any) {
	t.a.notify("session/update", map[string]any{"sessionId": t.s.ID, "update": u})
}

// chunk sends one agent_message_chunk ("" messageId: a warning).
func (t *turn) chunk(messageID, text string) {
	u := map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}
	if messageID != "" {
		u["messageId"] = messageID
	}
	t.update(u)
}

func (t *turn) cancelled() bool {
	select {
	case <-t.s.cancel:
		return true
	default:
		return false
	}
}

// pause waits d or until the turn is cancelled (false then).
func (t *turn) pause(d time.Duration) bool {
	if d <= 0 {
		return !t.cancelled()
	}
	select {
	case <-t.s.cancel:
		return false
	case <-time.After(d):
		return true
	}
}

// reply streams text as one agent message; false when cancelled.
func (t *turn) reply(text string, chunks []string, delay time.Duration) bool {
	if chunks == nil {
		chunks = strings.SplitAfter(text, " ")
	}
	t.a.mu.Lock()
	t.s.Seq++
	msgID := fmt.Sprintf("msg-%s-%d", t.s.ID, t.s.Seq)
	t.a.mu.Unlock()
	sent := ""
	defer func() {
		if sent != "" {
			t.a.mu.Lock()
			t.s.History = append(t.s.History, histItem{Role: "assistant", Text: sent, MessageID: msgID})
			t.a.mu.Unlock()
			t.out = append(t.out, strings.Fields(sent)...)
		}
	}()
	for _, c := range chunks {
		if !t.pause(delay) {
			return false
		}
		t.chunk(msgID, c)
		sent += c
	}
	return true
}

func (t *turn) run(first bool, earlier []string) (map[string]any, *rpcError) {
	text := t.text
	if first {
		t.chunk("", WarningText)
	}
	stop := "end_turn"
	ok := true
	switch {
	case strings.Contains(text, "[die]"):
		die()
	case strings.Contains(text, "[fail]"):
		return nil, &rpcError{-32603, "Internal error: fake model failure requested"}
	case strings.Contains(text, "[history]"):
		ok = t.reply("HISTORY: "+strings.Join(earlier, " | "), nil, t.a.opts.DeltaDelay)
	case strings.Contains(text, "[hold]"):
		ok = t.reply("holding", nil, 0) && t.pause(time.Hour)
	case strings.Contains(text, "[slow]"):
		r := "ECHO: " + text
		ok = t.reply(r, mockmodel.SplitEven(r, SlowChunks), t.a.opts.SlowDelay)
	case strings.Contains(text, "[shell]"), strings.Contains(text, "[read]"):
		stop, ok = t.tool(text)
	default:
		if strings.Contains(text, "[plan]") {
			t.update(map[string]any{"sessionUpdate": "plan", "entries": []any{
				map[string]any{"content": "Read the code", "priority": "high", "status": "in_progress"},
				map[string]any{"content": "Make the change", "priority": "medium", "status": "pending"},
				map[string]any{"content": "Run the tests", "priority": "low", "status": "pending"},
			}})
		}
		ok = t.reply("ECHO: "+text, nil, t.a.opts.DeltaDelay)
	}
	if !ok {
		stop = "cancelled"
	}
	return t.result(stop), nil
}

// result is the prompt answer: ACP usage of this turn; the claude flavour
// also reports a usage_update with the session's cumulative cost (USD, a
// token costs 1e-6), like claude-agent-acp.
func (t *turn) result(stop string) map[string]any {
	in, out := int64(len(strings.Fields(t.text))*10), int64(len(t.out))
	if stop == "cancelled" && t.a.opts.Flavor == "claude" {
		in, out = 0, 0
	}
	if t.a.opts.Flavor == "claude" {
		t.a.mu.Lock()
		t.s.Cost += float64(in+out) / 1e6
		cost := t.s.Cost
		t.a.mu.Unlock()
		t.update(map[string]any{"sessionUpdate": "usage_update", "used": in + out, "size": 1000000,
			"cost": map[string]any{"amount": cost, "currency": "USD"}})
	} else {
		t.update(map[string]any{"sessionUpdate": "usage_update", "used": in + out, "size": 200000})
	}
	return map[string]any{"stopReason": stop, "usage": map[string]any{
		"inputTokens": in, "outputTokens": out, "totalTokens": in + out, "cachedReadTokens": int64(2),
	}}
}

// tool runs a [shell] or [read] tool call with the mode's permission rule.
func (t *turn) tool(text string) (stop string, ok bool) {
	kind, title := "execute", "echo "+ToolOutput
	if strings.Contains(text, "[read]") {
		kind, title = "read", "Read README.md"
	}
	t.a.mu.Lock()
	t.s.Seq++
	callID := fmt.Sprintf("call-%s-%d", t.s.ID, t.s.Seq)
	mode := t.s.Mode
	t.a.mu.Unlock()
	t.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": callID, "title": title, "kind": kind,
		"status": "pending", "rawInput": map[string]any{"command": title}})

	allowed := true
	switch {
	case mode == "agent-full-access" || mode == "bypassPermissions":
	case mode == "agent":
		allowed = false // the automatic review rejects it without asking
	case mode == "plan":
		allowed = false
	default:
		var answered bool
		allowed, answered = t.askPermission(callID, title, kind)
		if !answered {
			return "cancelled", false
		}
	}
	if !allowed {
		t.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": callID, "status": "failed",
			"rawOutput": map[string]any{"error": "rejected"}})
		if t.a.opts.Flavor == "codex" {
			return "cancelled", true
		}
		return "end_turn", t.reply("TOOL REJECTED", nil, t.a.opts.DeltaDelay)
	}
	t.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": callID, "status": "in_progress"})
	t.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": callID, "status": "completed",
		"rawOutput": map[string]any{"stdout": ToolOutput, "exitCode": 0}})
	return "end_turn", t.reply("TOOL RESULT: "+ToolOutput, nil, t.a.opts.DeltaDelay)
}

// askPermission sends session/request_permission with the flavour's
// options; answered is false when the turn was cancelled meanwhile.
func (t *turn) askPermission(callID, title, kind string) (allowed, answered bool) {
	opts := []any{
		map[string]any{"optionId": "allow_once", "name": "Yes", "kind": "allow_once"},
		map[string]any{"optionId": "accept_execpolicy_amendment", "name": "Yes, and don't ask again", "kind": "allow_always"},
		map[string]any{"optionId": "cancel", "name": "No", "kind": "reject_once"},
	}
	if t.a.opts.Flavor == "claude" {
		opts = []any{
			map[string]any{"optionId": "allow-once", "name": "Allow", "kind": "allow_once"},
			map[string]any{"optionId": "reject", "name": "Reject", "kind": "reject_once"},
		}
	}
	ch := t.a.request("session/request_permission", map[string]any{
		"sessionId": t.s.ID,
		"toolCall":  map[string]any{"toolCallId": callID, "title": title, "kind": kind, "status": "pending"},
		"options":   opts,
	})
	var raw json.RawMessage
	select {
	case raw = <-ch:
	case <-t.s.cancel:
		return false, false
	}
	var res struct {
		Outcome struct {
			Outcome  string `json:"outcome"`
			OptionID string `json:"optionId"`
		} `json:"outcome"`
	}
	_ = json.Unmarshal(raw, &res)
	t.a.log("permission " + res.Outcome.Outcome + " " + res.Outcome.OptionID)
	if res.Outcome.Outcome != "selected" {
		return false, true
	}
	for _, o := range opts {
		m := o.(map[string]any)
		if m["optionId"] == res.Outcome.OptionID {
			return strings.HasPrefix(m["kind"].(string), "allow"), true
		}
	}
	return false, true
}
