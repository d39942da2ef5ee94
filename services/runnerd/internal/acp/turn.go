package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/acp/acpwire"
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
	_, err := s.conn.Send(acpwire.MethodSessionPrompt, acpwire.PromptParams{SessionID: sid, Prompt: []acpwire.ContentBlock{acpwire.TextBlock(text)}},
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
	return s.conn.Notify(acpwire.MethodSessionCancel, acpwire.SessionRef{SessionID: sid})
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
	var ans acpwire.PromptResponse
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
func promptUsage(u *acpwire.PromptUsage) Usage {
	if u == nil {
		return Usage{}
	}
	n := func(v int64) int64 { return max(v, 0) }
	return Usage{InputTokens: n(u.InputTokens), CachedInputTokens: n(u.CachedReadTokens), OutputTokens: n(u.OutputTokens)}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// onNotify handles session/update (other notifications are ignored).
func (s *Session) onNotify(method string, raw json.RawMessage) {
	if method != acpwire.MethodSessionUpdate {
		s.log.Debug("acp: notification ignored", "method", method)
		return
	}
	var p struct {
		SessionID string                 `json:"sessionId"`
		Update    *acpwire.SessionUpdate `json:"update"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Update == nil {
		var te *json.UnmarshalTypeError
		if p.Update == nil || !errors.As(err, &te) {
			s.diagnostic(failure.ProviderProtocolError, method, "session/update params are not an update")
			return
		}
	}
	s.mu.Lock()
	loading, t := s.loading, s.active
	ours := s.st != nil && p.SessionID == s.st.Identity.AgentSessionID
	s.mu.Unlock()
	if loading || !ours || t == nil {
		return // a replayed history, another session, or between turns
	}
	u := *p.Update
	switch u.SessionUpdate {
	case acpwire.UpdateAgentMessageChunk:
		s.onChunk(t, u.MessageID, u.Text())
	case acpwire.UpdateToolCall:
		s.onToolCall(t, u, true)
	case acpwire.UpdateToolCallUpdate:
		s.onToolCall(t, u, false)
	case acpwire.UpdatePlan:
		steps := make([]any, 0, len(u.Entries))
		for _, e := range u.Entries {
			steps = append(steps, map[string]any{"step": e.Content, "status": e.Status})
		}
		s.send(Event{Type: "run.plan_updated", TurnID: t.id, Priority: P1, Payload: map[string]any{"source": "turn_plan", "steps": steps}})
	case acpwire.UpdateUsage:
		payload := map[string]any{"used": optional(u.Used), "size": optional(u.Size)}
		if c := u.Cost; c != nil {
			s.mu.Lock()
			t.cost = &provider.Cost{Amount: c.Amount, Currency: c.Currency}
			s.mu.Unlock()
			payload["cost"] = map[string]any{"amount": c.Amount, "currency": c.Currency}
		}
		s.send(Event{Type: "usage.reported", TurnID: t.id, Priority: P1, Payload: payload})
	}
}

// optional is *v, or nil.
func optional(v *int64) any {
	if v == nil {
		return nil
	}
	return *v
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
func (s *Session) onToolCall(t *turn, u acpwire.SessionUpdate, first bool) {
	id := u.ToolCallID
	if id == "" {
		return
	}
	s.mu.Lock()
	tc := t.tools[id]
	if tc == nil {
		tc = &toolCall{}
		t.tools[id] = tc
	}
	if u.Title != "" {
		tc.title = u.Title
	}
	if u.Kind != "" {
		tc.kind = u.Kind
	}
	status := u.Status
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
// exit_code), or codex-acp's _meta.terminal_exit.exit_code. Both are the
// agent's own objects.
func exitCode(u acpwire.SessionUpdate) (float64, bool) {
	var out struct {
		ExitCode  *float64 `json:"exitCode"`
		ExitCode2 *float64 `json:"exit_code"`
	}
	_ = json.Unmarshal(u.RawOutput, &out) // a field of another type stays nil
	if out.ExitCode != nil {
		return *out.ExitCode, true
	}
	if out.ExitCode2 != nil {
		return *out.ExitCode2, true
	}
	var meta struct {
		TerminalExit struct {
			ExitCode *float64 `json:"exit_code"`
		} `json:"terminal_exit"`
	}
	_ = json.Unmarshal(u.Meta, &meta)
	if meta.TerminalExit.ExitCode != nil {
		return *meta.TerminalExit.ExitCode, true
	}
	return 0, false
}

// onRequest answers the agent's requests: session/request_permission by
// the permission mode (policy.go); anything else is refused (the client
// offers no file system or terminal).
func (s *Session) onRequest(id json.RawMessage, method string, raw json.RawMessage) {
	if method != acpwire.MethodRequestPermission {
		s.diagnostic(failure.ProviderServerRequestUnsupported, method, "the agent asked for "+method+", which tether does not offer")
		_ = s.conn.RespondError(id, -32601, "method not supported by this client: "+method)
		return
	}
	var p struct {
		SessionID string              `json:"sessionId"`
		ToolCall  acpwire.ToolCallRef `json:"toolCall"`
		Options   []Option            `json:"options"`
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
	outcome := acpwire.PermissionOutcome{Outcome: "cancelled"}
	decision := "cancelled"
	if d.OptionID != "" {
		outcome = acpwire.PermissionOutcome{Outcome: "selected", OptionID: d.OptionID}
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
	_ = s.conn.Respond(id, acpwire.RequestPermissionResponse{Outcome: outcome})
}

func (s *Session) diagnostic(code, method, msg string) {
	s.send(Event{Type: "harness.diagnostic", Priority: P1, Payload: map[string]any{"code": code, "method": method, "message": msg}})
}
