package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// Events emitted (Type, priority, payload):
//
//	session.started          P0 {threadId (= record id), providerSessionId, agentSessionId, resumed, model, agent, agentMode, permissionMode}
//	turn.started             P0 {providerTurnId}
//	item.started             P1 {kind:"agentMessage"|"toolCall", itemId[, tool, toolKind, status]}
//	item.delta               P2 {kind:"agentMessage", delta}
//	item.completed           P1 {kind:"agentMessage", itemId, text} | {kind:"toolCall", itemId, status, success}
//	tool.receipt             P1 {toolCallId, tool, toolKind, status, success[, exitCode][, permission]}
//	permission.decided       P1 {requestId, toolCallId, toolKind, title, permissionMode, decision:"allow"|"reject"|"cancelled", optionId, optionKind}
//	usage.reported           P1 {used, size[, cost:{amount, currency}]}
//	run.plan_updated         P1 {source:"turn_plan", steps:[{step, status}]}
//	provider.notice.recorded P2 {kind:"warning", message} (agent text without a messageId)
//	turn.completed|turn.interrupted|turn.failed P0 {status, stopReason, finalMessage, usage[, error][, reconciled:true]}
//	harness.diagnostic       P1 {code, method, message}

// Reconciliation outcomes (package provider).
const (
	ReconcileRetained     = provider.ReconcileRetained
	ReconcileTerminalized = provider.ReconcileTerminalized
	ReconcileMissing      = provider.ReconcileMissing
)

// turn is the active prompt.
type turn struct {
	id          string
	interrupted bool // the client sent session/cancel
	declined    bool // a permission request was declined
	msgID       string
	msgText     strings.Builder
	final       string
	cost        *provider.Cost // the session's cumulative cost, newest report
	tools       map[string]*toolCall
}

type toolCall struct {
	title, kind string
	decision    string
	done        bool
}

// StartTurn sends session/prompt with text and returns the turn id at once;
// the turn's events follow and its result arrives on TurnDone. The turn is
// recorded in the durable state before the prompt is sent.
func (s *Session) StartTurn(ctx context.Context, text string) (string, error) {
	s.mu.Lock()
	switch {
	case s.exitErr != nil:
		err := s.exitErr
		s.mu.Unlock()
		return "", err
	case s.st == nil:
		s.mu.Unlock()
		return "", &Error{Code: failure.ProviderThreadNotOpen, Message: "no ACP session is open"}
	case s.active != nil:
		id := s.active.id
		s.mu.Unlock()
		return "", &Error{Code: failure.ProviderTurnActive, Message: "turn " + id + " is active"}
	}
	s.st.TurnSeq++
	t := &turn{id: fmt.Sprintf("acp-turn-%d", s.st.TurnSeq), tools: map[string]*toolCall{}}
	s.st.addTurn(TurnRecord{TurnID: t.id, Status: "started", StartedAt: time.Now().UTC()})
	if err := writeState(s.cfg.StateDir, s.st); err != nil {
		s.mu.Unlock()
		return "", &Error{Code: failure.RunnerStateWriteFailed, Message: "ACP state: " + err.Error()}
	}
	s.active = t
	sid := s.st.Identity.AgentSessionID
	s.mu.Unlock()

	// turn.started goes out before any update of the prompt: the reader
	// emits under the same lock.
	s.emitMu.Lock()
	_, err := s.conn.Send("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": text}}},
		func(r *jsonrpc.Reply) { s.finishTurn(t, r) })
	if err == nil {
		s.emit(Event{Type: "turn.started", TurnID: t.id, Priority: P0, Payload: map[string]any{"providerTurnId": t.id}})
	}
	s.emitMu.Unlock()
	if err != nil {
		s.mu.Lock()
		s.active = nil
		s.mu.Unlock()
		return "", err
	}
	return t.id, nil
}

// Interrupt cancels the active turn (session/cancel); the prompt then ends
// with stopReason cancelled, reported as interrupted.
func (s *Session) Interrupt(_ context.Context, turnID string) error {
	s.mu.Lock()
	t := s.active
	if t == nil || t.id != turnID {
		s.mu.Unlock()
		return &Error{Code: failure.ProviderUnknownTurn, Message: "turn " + turnID + " is not active"}
	}
	t.interrupted = true
	sid := s.st.Identity.AgentSessionID
	s.mu.Unlock()
	return s.conn.Notify("session/cancel", map[string]any{"sessionId": sid})
}

// finishTurn settles the prompt's answer (on the reader goroutine, after
// every update that preceded it). A prompt that failed with the connection
// (the agent process is gone) gets no result: the runner reconciles it.
func (s *Session) finishTurn(t *turn, r *jsonrpc.Reply) {
	if r.Err != nil {
		return
	}
	s.closeMessage(t)
	res := TurnResult{TurnID: t.id, Status: provider.TurnCompleted}
	var ans struct {
		StopReason string         `json:"stopReason"`
		Usage      map[string]any `json:"usage"`
	}
	switch {
	case r.RPCErr != nil:
		res.Status, res.ErrorCode, res.ErrorMessage = provider.TurnFailed, failure.ProviderTurnFailed, "session/prompt: "+r.RPCErr.String()
	case json.Unmarshal(r.Result, &ans) != nil:
		res.Status, res.ErrorCode, res.ErrorMessage = provider.TurnFailed, failure.ProviderProtocolError, "session/prompt answered with no stopReason"
	}
	switch ans.StopReason {
	case "cancelled":
		res.Status = provider.TurnInterrupted
		if !t.interrupted && t.declined {
			res.ErrorMessage = "the agent ended the turn after a declined permission request"
		}
	case "refusal":
		res.Status, res.ErrorCode, res.ErrorMessage = provider.TurnFailed, failure.ProviderTurnFailed, "the agent refused the prompt"
	}
	res.FinalMessage = t.final
	res.Usage = promptUsage(ans.Usage)

	s.mu.Lock()
	st := s.st
	st.Cumulative = Usage{InputTokens: st.Cumulative.InputTokens + res.Usage.InputTokens,
		CachedInputTokens: st.Cumulative.CachedInputTokens + res.Usage.CachedInputTokens,
		OutputTokens:      st.Cumulative.OutputTokens + res.Usage.OutputTokens}
	total := st.Cumulative
	res.Total = &total
	if c := t.cost; c != nil {
		delta := c.Amount
		if st.Currency == c.Currency {
			delta -= st.CostAmount
		}
		if delta >= 0 {
			res.Cost = &provider.Cost{Amount: delta, Currency: c.Currency}
		}
		st.CostAmount, st.Currency = c.Amount, c.Currency
	}
	if rec := st.turn(t.id); rec != nil {
		u := res.Usage
		rec.Status, rec.StopReason, rec.Usage, rec.Total = res.Status, ans.StopReason, &u, &total
		if res.Cost != nil {
			rec.Cost = &TurnCost{Amount: res.Cost.Amount, Currency: res.Cost.Currency}
		}
		rec.FinalMessage = truncate(res.FinalMessage, MaxRecordedMessage)
		rec.ErrorCode, rec.ErrorMessage = res.ErrorCode, res.ErrorMessage
	}
	werr := writeState(s.cfg.StateDir, st)
	s.active = nil
	s.mu.Unlock()
	if werr != nil {
		s.log.Error("acp: state not saved after a turn", "turn_id", t.id, "err", werr)
	}

	// The state is saved before the event is emitted. The event is durable
	// only once the runner journaled it (at the latest with the turn's
	// run.terminal); a runnerd lost before that finds the turn recorded as
	// finished, and its reconciliation emits the event (ReconcileTurn).
	// Saved after the event, a loss in between would read back as a turn
	// that never finished, and the retry would run it a second time.
	s.send(Event{Type: "turn." + res.Status, TurnID: t.id, Priority: P0, Payload: turnPayload(res, ans.StopReason, false)})
	s.deliver(res)
}

// turnPayload is the turn.<status> payload of a finished turn; reconciled
// marks one whose result was read back from the durable state.
func turnPayload(res TurnResult, stopReason string, reconciled bool) map[string]any {
	payload := map[string]any{"status": res.Status, "stopReason": stopReason, "finalMessage": res.FinalMessage,
		"usage": map[string]any{"inputTokens": res.Usage.InputTokens, "cachedInputTokens": res.Usage.CachedInputTokens, "outputTokens": res.Usage.OutputTokens}}
	if res.ErrorCode != "" || res.ErrorMessage != "" {
		payload["error"] = map[string]any{"code": res.ErrorCode, "message": res.ErrorMessage}
	}
	if reconciled {
		payload["reconciled"] = true
	}
	return payload
}

// promptUsage reads the ACP PromptResponse usage of one turn.
func promptUsage(u map[string]any) Usage {
	n := func(k string) int64 {
		f, _ := u[k].(float64)
		if f < 0 {
			return 0
		}
		return int64(f)
	}
	return Usage{InputTokens: n("inputTokens"), CachedInputTokens: n("cachedReadTokens"), OutputTokens: n("outputTokens")}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// onNotify handles session/update (other notifications are ignored).
func (s *Session) onNotify(method string, raw json.RawMessage) {
	if method != "session/update" {
		s.log.Debug("acp: notification ignored", "method", method)
		return
	}
	var p struct {
		SessionID string         `json:"sessionId"`
		Update    map[string]any `json:"update"`
	}
	if json.Unmarshal(raw, &p) != nil || p.Update == nil {
		s.diagnostic(failure.ProviderProtocolError, method, "session/update params are not an update")
		return
	}
	s.mu.Lock()
	loading, t := s.loading, s.active
	ours := s.st != nil && p.SessionID == s.st.Identity.AgentSessionID
	s.mu.Unlock()
	if loading || !ours || t == nil {
		return // a replayed history, another session, or between turns
	}
	u := p.Update
	str := func(k string) string { v, _ := u[k].(string); return v }
	switch str("sessionUpdate") {
	case "agent_message_chunk":
		s.onChunk(t, str("messageId"), contentText(u["content"]))
	case "tool_call":
		s.onToolCall(t, u, true)
	case "tool_call_update":
		s.onToolCall(t, u, false)
	case "plan":
		entries, _ := u["entries"].([]any)
		steps := make([]any, 0, len(entries))
		for _, e := range entries {
			m, _ := e.(map[string]any)
			steps = append(steps, map[string]any{"step": m["content"], "status": m["status"]})
		}
		s.send(Event{Type: "run.plan_updated", TurnID: t.id, Priority: P1, Payload: map[string]any{"source": "turn_plan", "steps": steps}})
	case "usage_update":
		payload := map[string]any{"used": u["used"], "size": u["size"]}
		if c, ok := u["cost"].(map[string]any); ok {
			amount, _ := c["amount"].(float64)
			cur, _ := c["currency"].(string)
			s.mu.Lock()
			t.cost = &provider.Cost{Amount: amount, Currency: cur}
			s.mu.Unlock()
			payload["cost"] = map[string]any{"amount": amount, "currency": cur}
		}
		s.send(Event{Type: "usage.reported", TurnID: t.id, Priority: P1, Payload: payload})
	}
}

// onChunk maps an agent_message_chunk. Text without a messageId is not the
// answer: both real agents send their product warnings that way.
func (s *Session) onChunk(t *turn, msgID, text string) {
	if msgID == "" {
		if strings.TrimSpace(text) != "" {
			s.send(Event{Type: "provider.notice.recorded", TurnID: t.id, Priority: P2, Payload: map[string]any{"kind": "warning", "message": text}})
		}
		return
	}
	if msgID != t.msgID {
		s.closeMessage(t)
		t.msgID = msgID
		s.send(Event{Type: "item.started", TurnID: t.id, ItemID: msgID, Priority: P1, Payload: map[string]any{"kind": "agentMessage", "itemId": msgID}})
	}
	t.msgText.WriteString(text)
	s.send(Event{Type: "item.delta", TurnID: t.id, ItemID: msgID, Priority: P2, Payload: map[string]any{"kind": "agentMessage", "delta": text}})
}

func (s *Session) closeMessage(t *turn) {
	if t.msgID == "" {
		return
	}
	text := t.msgText.String()
	s.send(Event{Type: "item.completed", TurnID: t.id, ItemID: t.msgID, Priority: P1, Payload: map[string]any{"kind": "agentMessage", "itemId": t.msgID, "text": text}})
	t.final = text
	t.msgID = ""
	t.msgText.Reset()
}

// onToolCall maps tool_call and tool_call_update; a terminal status
// (completed, failed) completes the item and records the tool receipt.
func (s *Session) onToolCall(t *turn, u map[string]any, first bool) {
	id, _ := u["toolCallId"].(string)
	if id == "" {
		return
	}
	s.mu.Lock()
	tc := t.tools[id]
	if tc == nil {
		tc = &toolCall{}
		t.tools[id] = tc
	}
	if v, ok := u["title"].(string); ok && v != "" {
		tc.title = v
	}
	if v, ok := u["kind"].(string); ok && v != "" {
		tc.kind = v
	}
	status, _ := u["status"].(string)
	terminal := (status == "completed" || status == "failed") && !tc.done
	if terminal {
		tc.done = true
	}
	title, kind, decision := tc.title, tc.kind, tc.decision
	s.mu.Unlock()
	if first {
		s.send(Event{Type: "item.started", TurnID: t.id, ItemID: id, Priority: P1, Payload: map[string]any{
			"kind": "toolCall", "itemId": id, "tool": title, "toolKind": kind, "status": status}})
	}
	if !terminal {
		return
	}
	ok := status == "completed"
	s.send(Event{Type: "item.completed", TurnID: t.id, ItemID: id, Priority: P1, Payload: map[string]any{
		"kind": "toolCall", "itemId": id, "status": status, "success": ok}})
	receipt := map[string]any{"toolCallId": id, "tool": title, "toolKind": kind, "status": status, "success": ok}
	if decision != "" {
		receipt["permission"] = decision
	}
	if code, found := exitCode(u); found {
		receipt["exitCode"] = code
	}
	s.send(Event{Type: "tool.receipt", TurnID: t.id, ItemID: id, Priority: P1, Payload: receipt})
}

// exitCode finds a command's exit code: rawOutput.exitCode (and
// exit_code), or codex-acp's _meta.terminal_exit.exit_code.
func exitCode(u map[string]any) (float64, bool) {
	if ro, ok := u["rawOutput"].(map[string]any); ok {
		for _, k := range []string{"exitCode", "exit_code"} {
			if v, ok := ro[k].(float64); ok {
				return v, true
			}
		}
	}
	if meta, ok := u["_meta"].(map[string]any); ok {
		if te, ok := meta["terminal_exit"].(map[string]any); ok {
			if v, ok := te["exit_code"].(float64); ok {
				return v, true
			}
		}
	}
	return 0, false
}

func contentText(c any) string {
	m, _ := c.(map[string]any)
	if m["type"] != "text" {
		return ""
	}
	s, _ := m["text"].(string)
	return s
}

// onRequest answers the agent's requests: session/request_permission by
// the permission mode (policy.go); anything else is refused (the client
// offers no file system or terminal).
func (s *Session) onRequest(id json.RawMessage, method string, raw json.RawMessage) {
	if method != "session/request_permission" {
		s.diagnostic(failure.ProviderServerRequestUnsupported, method, "the agent asked for "+method+", which tether does not offer")
		_ = s.conn.RespondError(id, -32601, "method not supported by this client: "+method)
		return
	}
	var p struct {
		SessionID string `json:"sessionId"`
		ToolCall  struct {
			ToolCallID string `json:"toolCallId"`
			Title      string `json:"title"`
			Kind       string `json:"kind"`
		} `json:"toolCall"`
		Options []Option `json:"options"`
	}
	_ = json.Unmarshal(raw, &p)
	s.mu.Lock()
	t := s.active
	kind, title := p.ToolCall.Kind, p.ToolCall.Title
	if t != nil {
		if tc := t.tools[p.ToolCall.ToolCallID]; tc != nil {
			if kind == "" {
				kind = tc.kind
			}
			if title == "" {
				title = tc.title
			}
		}
	}
	s.mu.Unlock()
	d := Decide(s.cfg.PermissionMode, kind, p.Options)
	outcome := map[string]any{"outcome": "cancelled"}
	decision := "cancelled"
	if d.OptionID != "" {
		outcome = map[string]any{"outcome": "selected", "optionId": d.OptionID}
		decision = "reject"
		if d.Allow {
			decision = "allow"
		}
	}
	turnID := ""
	if t != nil {
		turnID = t.id
		s.mu.Lock()
		if !d.Allow {
			t.declined = true
		}
		if tc := t.tools[p.ToolCall.ToolCallID]; tc != nil {
			tc.decision = decision
		}
		s.mu.Unlock()
	}
	s.send(Event{Type: "permission.decided", TurnID: turnID, ItemID: p.ToolCall.ToolCallID, Priority: P1, Payload: map[string]any{
		"requestId": string(id), "toolCallId": p.ToolCall.ToolCallID, "toolKind": kind, "title": title,
		"permissionMode": s.cfg.PermissionMode, "decision": decision, "optionId": d.OptionID, "optionKind": d.OptionKind,
	}})
	_ = s.conn.Respond(id, map[string]any{"outcome": outcome})
}

func (s *Session) diagnostic(code, method, msg string) {
	s.send(Event{Type: "harness.diagnostic", Priority: P1, Payload: map[string]any{"code": code, "method": method, "message": msg}})
}
