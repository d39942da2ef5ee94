package fakeacp

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/acp/acpwire"
	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// turn is one session/prompt in progress.
type turn struct {
	a    *Agent
	s    *session
	text string
	out  []string // reply words sent, for usage
}

func (t *turn) update(u acpwire.SessionUpdate) {
	t.a.notify(acpwire.MethodSessionUpdate, acpwire.SessionNotification{SessionID: t.s.ID, Update: u})
}

// chunk sends one agent_message_chunk ("" messageId: a warning).
func (t *turn) chunk(messageID, text string) {
	t.update(acpwire.MessageChunk(acpwire.UpdateAgentMessageChunk, messageID, text))
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

func (t *turn) run(first bool, earlier []string) (acpwire.PromptResponse, *rpcError) {
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
		return acpwire.PromptResponse{}, &rpcError{-32603, "Internal error: fake model failure requested"}
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
			t.update(acpwire.SessionUpdate{SessionUpdate: acpwire.UpdatePlan, Entries: []acpwire.PlanEntry{
				{Content: "Read the code", Priority: "high", Status: "in_progress"},
				{Content: "Make the change", Priority: "medium", Status: "pending"},
				{Content: "Run the tests", Priority: "low", Status: "pending"},
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
func (t *turn) result(stop string) acpwire.PromptResponse {
	in, out := int64(len(strings.Fields(t.text))*10), int64(len(t.out))
	if stop == "cancelled" && t.a.opts.Flavor == "claude" {
		in, out = 0, 0
	}
	if t.a.opts.Flavor == "claude" {
		t.a.mu.Lock()
		t.s.Cost += float64(in+out) / 1e6
		cost := t.s.Cost
		t.a.mu.Unlock()
		t.update(usageUpdate(in+out, 1000000, &acpwire.Cost{Amount: cost, Currency: "USD"}))
	} else {
		t.update(usageUpdate(in+out, 200000, nil))
	}
	return acpwire.PromptResponse{StopReason: stop, Usage: &acpwire.PromptUsage{
		InputTokens: in, OutputTokens: out, TotalTokens: in + out, CachedReadTokens: 2,
	}}
}

func usageUpdate(used, size int64, cost *acpwire.Cost) acpwire.SessionUpdate {
	return acpwire.SessionUpdate{SessionUpdate: acpwire.UpdateUsage, Used: &used, Size: &size, Cost: cost}
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
	input, _ := json.Marshal(struct {
		Command string `json:"command"`
	}{title})
	t.update(acpwire.SessionUpdate{SessionUpdate: acpwire.UpdateToolCall, ToolCallID: callID, Title: title, Kind: kind,
		Status: "pending", RawInput: input})

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
		t.update(acpwire.SessionUpdate{SessionUpdate: acpwire.UpdateToolCallUpdate, ToolCallID: callID, Status: "failed",
			RawOutput: json.RawMessage(`{"error":"rejected"}`)})
		if t.a.opts.Flavor == "codex" {
			return "cancelled", true
		}
		return "end_turn", t.reply("TOOL REJECTED", nil, t.a.opts.DeltaDelay)
	}
	output, _ := json.Marshal(struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitCode"`
	}{ToolOutput, 0})
	t.update(acpwire.SessionUpdate{SessionUpdate: acpwire.UpdateToolCallUpdate, ToolCallID: callID, Status: "in_progress"})
	t.update(acpwire.SessionUpdate{SessionUpdate: acpwire.UpdateToolCallUpdate, ToolCallID: callID, Status: "completed",
		RawOutput: output})
	return "end_turn", t.reply("TOOL RESULT: "+ToolOutput, nil, t.a.opts.DeltaDelay)
}

// askPermission sends session/request_permission with the flavour's
// options; answered is false when the turn was cancelled meanwhile.
func (t *turn) askPermission(callID, title, kind string) (allowed, answered bool) {
	opts := []acpwire.PermissionOption{
		{OptionID: "allow_once", Name: "Yes", Kind: "allow_once"},
		{OptionID: "accept_execpolicy_amendment", Name: "Yes, and don't ask again", Kind: "allow_always"},
		{OptionID: "cancel", Name: "No", Kind: "reject_once"},
	}
	if t.a.opts.Flavor == "claude" {
		opts = []acpwire.PermissionOption{
			{OptionID: "allow-once", Name: "Allow", Kind: "allow_once"},
			{OptionID: "reject", Name: "Reject", Kind: "reject_once"},
		}
	}
	ch := t.a.request(acpwire.MethodRequestPermission, acpwire.RequestPermissionParams{
		SessionID: t.s.ID,
		ToolCall:  acpwire.ToolCallRef{ToolCallID: callID, Title: title, Kind: kind, Status: "pending"},
		Options:   opts,
	})
	var raw json.RawMessage
	select {
	case raw = <-ch:
	case <-t.s.cancel:
		return false, false
	}
	var res acpwire.RequestPermissionResponse
	_ = json.Unmarshal(raw, &res)
	t.a.log("permission " + res.Outcome.Outcome + " " + res.Outcome.OptionID)
	if res.Outcome.Outcome != "selected" {
		return false, true
	}
	for _, o := range opts {
		if o.OptionID == res.Outcome.OptionID {
			return strings.HasPrefix(o.Kind, "allow"), true
		}
	}
	return false, true
}
