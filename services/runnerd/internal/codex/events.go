package codex

// Events emitted (Type, priority, payload). TurnID/ItemID are set from the
// provider's turnId/itemId when the notification carries them.
//
//	session.started          P0 {threadId, providerSessionId, resumed, model}
//	turn.started             P0 {providerTurnId}
//	item.started             P1 {kind, itemId[, status, tool, namespace, server]}
//	item.delta               P2 {kind:"agentMessage"|"commandExecution", delta}
//	item.completed           P1 {kind, itemId[, text (agentMessage), status, exitCode (commandExecution), tool, success]}
//	usage.reported           P1 {total:{inputTokens,cachedInputTokens,outputTokens,totalTokens}, last:{…}} (active turn only)
//	turn.completed           P0 {status, finalMessage, usage:{inputTokens,cachedInputTokens,outputTokens}}
//	turn.failed              P0 {…, error:{code, message[, providerErrorCode]}}
//	turn.interrupted         P0 {…}
//	harness.diagnostic       P1 provider `error`: {source:"provider", code:failure.ProviderError, message, willRetry[, providerErrorCode]}
//	                            driver notes: {code, method, message[, requestId, answer]}
//	run.plan_updated         P1 {source:"turn_plan", explanation?, steps:[{step,status}]} | {source:"plan_item", markdown} (plan.go)
//	provider.notice.recorded P2 {kind:"warning"|"configWarning"|"deprecationNotice", message[, details]}

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// turnState tracks the active turn.
type turnState struct {
	id           string
	started      bool
	finalMessage string // text of the last COMPLETED agentMessage
	usage        Usage
	planItem     string // text of the last completed plan item
}

// tokenTotals is one usage breakdown of thread/tokenUsage/updated.
type tokenTotals struct {
	input, cached, output, total int64
}

func (t tokenTotals) minus(o tokenTotals) (tokenTotals, bool) {
	d := tokenTotals{t.input - o.input, t.cached - o.cached, t.output - o.output, t.total - o.total}
	return d, d.input >= 0 && d.cached >= 0 && d.output >= 0 && d.total >= 0
}

func (t tokenTotals) payload() map[string]any {
	return map[string]any{
		"inputTokens":       t.input,
		"cachedInputTokens": t.cached,
		"outputTokens":      t.output,
		"totalTokens":       t.total,
	}
}

// usage is the thread total as a Usage; nil for no total.
func (t *tokenTotals) usage() *Usage {
	if t == nil {
		return nil
	}
	return &Usage{InputTokens: t.input, CachedInputTokens: t.cached, OutputTokens: t.output}
}

// totalsOf is one usage breakdown of thread/tokenUsage/updated; ok is
// false when the breakdown is missing. A total of 0 beside counts is taken
// as missing (input + output).
func totalsOf(c *codexwire.TokenCounts) (tokenTotals, bool) {
	if c == nil {
		return tokenTotals{}, false
	}
	total := c.TotalTokens
	if total == 0 {
		total = c.InputTokens + c.OutputTokens
	}
	return tokenTotals{input: c.InputTokens, cached: c.CachedInputTokens, output: c.OutputTokens, total: total}, true
}

// notificationHeader is what the driver reads of every notification
// before its own params: the thread and turn it names.
type notificationHeader struct {
	ThreadID string `json:"threadId"`
	TurnID   string `json:"turnId"`
}

// handleNotification maps one provider notification to events. It runs on
// the reader goroutine, so events keep the provider's order.
func (s *Session) handleNotification(method string, raw json.RawMessage) {
	switch method {
	case codexwire.NotifyTurnStarted, codexwire.NotifyTurnCompleted, codexwire.NotifyItemStarted, codexwire.NotifyItemCompleted,
		codexwire.NotifyAgentMessageDelta, codexwire.NotifyCommandOutputDelta,
		codexwire.NotifyTokenUsageUpdated, codexwire.NotifyPlanUpdated, codexwire.NotifyError, codexwire.NotifyWarning,
		codexwire.NotifyConfigWarning, codexwire.NotifyDeprecationNotice, codexwire.NotifyServerRequestResolved:
	default:
		s.log.Debug("codex: notification ignored", "method", method)
		return
	}
	var h notificationHeader
	if !isObject(raw) || decodeParams(raw, &h) != nil {
		s.diagnosticOnce(failure.ProviderProtocolError, method, "", "", method+" params are not a JSON object")
		return
	}
	switch method {
	case codexwire.NotifyWarning, codexwire.NotifyConfigWarning, codexwire.NotifyDeprecationNotice:
		if s.threadOK(method, h, false) {
			s.onNotice(method, h, raw)
		}
		return
	case codexwire.NotifyError:
		if s.threadOK(method, h, false) {
			s.onProviderError(h, raw)
		}
		return
	case codexwire.NotifyServerRequestResolved:
		if s.threadOK(method, h, false) {
			var p codexwire.ServerRequestResolved
			_ = decodeParams(raw, &p)
			s.onServerRequestResolved(p)
		}
		return
	}
	if !s.threadOK(method, h, true) {
		return
	}
	s.handleTurnNotification(method, h, raw)
}

// handleTurnNotification maps a notification of the open thread's turns.
func (s *Session) handleTurnNotification(method string, h notificationHeader, raw json.RawMessage) {
	switch method {
	case codexwire.NotifyTurnStarted, codexwire.NotifyTurnCompleted:
		var p codexwire.TurnNotification
		_ = decodeParams(raw, &p)
		if method == codexwire.NotifyTurnStarted {
			s.onTurnStarted(p.Turn)
		} else {
			s.onTurnCompleted(p.Turn)
		}
	case codexwire.NotifyItemStarted, codexwire.NotifyItemCompleted:
		var p struct {
			Item codexwire.Item `json:"item"`
		}
		_ = decodeParams(raw, &p)
		if method == codexwire.NotifyItemStarted {
			s.onItemStarted(h.TurnID, p.Item)
		} else {
			s.onItemCompleted(h.TurnID, p.Item)
		}
	case codexwire.NotifyAgentMessageDelta, codexwire.NotifyCommandOutputDelta:
		var p codexwire.Delta
		_ = decodeParams(raw, &p)
		kind := codexwire.ItemAgentMessage
		if method == codexwire.NotifyCommandOutputDelta {
			kind = codexwire.ItemCommandExecution
		}
		s.onDelta(p, kind)
	case codexwire.NotifyTokenUsageUpdated:
		var p struct {
			TokenUsage struct {
				Total *codexwire.TokenCounts `json:"total"`
				Last  *codexwire.TokenCounts `json:"last"`
			} `json:"tokenUsage"`
		}
		_ = decodeParams(raw, &p)
		s.onTokenUsage(h.TurnID, p.TokenUsage.Total, p.TokenUsage.Last)
	case codexwire.NotifyPlanUpdated:
		var p codexwire.PlanUpdated
		_ = decodeParams(raw, &p)
		s.onPlanUpdated(p)
	}
}

// threadOK checks that a notification names the open thread. With required,
// a missing threadId is a mismatch too.
func (s *Session) threadOK(method string, h notificationHeader, required bool) bool {
	tid := h.ThreadID
	s.mu.Lock()
	open := s.threadID
	s.mu.Unlock()
	if tid == "" && !required {
		return true
	}
	if tid != "" && tid == open {
		return true
	}
	msg := method + " names thread " + strconv.Quote(tid) + " but the open thread is " + strconv.Quote(open)
	s.diagnosticOnce(failure.ProviderThreadMismatch, method, h.TurnID, "", msg)
	return false
}

func (s *Session) onTurnStarted(turn codexwire.Turn) {
	id := turn.ID
	if id == "" {
		s.diagnosticOnce(failure.ProviderProtocolError, "turn/started", "", "", "turn/started has no turn.id")
		return
	}
	s.mu.Lock()
	if s.turn == nil {
		s.turn = &turnState{id: id}
	}
	t := s.turn
	match := t.id == id
	first := match && !t.started
	if match {
		t.started = true
	}
	s.mu.Unlock()
	if !match {
		s.diagnosticOnce(failure.ProviderUnknownTurn, "turn/started", id, "", "turn/started for "+id+" while turn "+t.id+" is active")
		return
	}
	if first {
		s.emitFromReader(Event{Type: "turn.started", TurnID: id, Priority: PriorityP0, Payload: map[string]any{"providerTurnId": id}})
	}
}

func (s *Session) onTurnCompleted(turn codexwire.Turn) {
	id := turn.ID
	// emitMu is held from taking the turn to delivering its result, so a
	// concurrent failure (which takes emitMu too) either sees the turn still
	// active or finds its result already delivered before Exited closes.
	s.emitMu.Lock()
	s.mu.Lock()
	failed := s.failErr != nil
	t := s.turn
	known := !failed && t != nil && t.id == id && id != ""
	if known {
		s.turn = nil
	}
	total := s.usageBaseline.usage()
	s.mu.Unlock()
	if !known {
		s.emitMu.Unlock()
		if !failed {
			s.diagnostic(failure.ProviderUnknownTurn, "turn/completed", id, "", "turn/completed for unknown turn "+strconv.Quote(id)+" ignored")
		}
		return
	}
	defer s.emitMu.Unlock()
	// Requests of the finished turn can no longer be answered.
	s.expireRequests(id, failure.TurnEnded, true)

	final := t.finalMessage
	if final == "" {
		final = lastAgentText(turn.Items)
	}
	res := TurnResult{TurnID: id, FinalMessage: final, Usage: t.usage, Total: total, Artifacts: t.artifacts()}
	status := turn.Status
	payload := map[string]any{"finalMessage": final}
	var evType string
	switch status {
	case TurnCompleted:
		res.Status, evType = TurnCompleted, "turn.completed"
	case TurnInterrupted:
		res.Status, evType = TurnInterrupted, "turn.interrupted"
	default:
		res.Status, evType = TurnFailed, "turn.failed"
		res.ErrorCode = failure.ProviderTurnFailed
		res.ErrorMessage = "provider reported turn status " + strconv.Quote(status)
		if status == TurnFailed {
			res.ErrorMessage = "turn failed"
		}
	}
	payload["status"] = res.Status
	if e := turn.Error; e != nil {
		perr := map[string]any{"message": truncate(e.Message, 4096)}
		if info := errorInfoCode(e.CodexErrorInfo); info != "" {
			perr["providerErrorCode"] = info
		}
		if res.Status == TurnFailed {
			perr["code"] = res.ErrorCode
			if e.Message != "" {
				res.ErrorMessage = truncate(e.Message, 4096)
			}
		}
		payload["error"] = perr
	} else if res.Status == TurnFailed {
		payload["error"] = map[string]any{"code": res.ErrorCode, "message": res.ErrorMessage}
	}
	payload["usage"] = map[string]any{
		"inputTokens": res.Usage.InputTokens, "cachedInputTokens": res.Usage.CachedInputTokens, "outputTokens": res.Usage.OutputTokens,
	}
	s.emitFn(Event{Type: evType, TurnID: id, Priority: PriorityP0, Payload: payload})
	s.deliverTurn(res)
}

// lastAgentText is the text of the last agentMessage among a turn's items.
func lastAgentText(items []json.RawMessage) string {
	for i := len(items) - 1; i >= 0; i-- {
		var it codexwire.Item
		if decodeParams(items[i], &it) == nil && it.Type == codexwire.ItemAgentMessage {
			return it.Text
		}
	}
	return ""
}

// errorInfoCode reduces codexErrorInfo ("other" or {"httpConnectionFailed":{…}})
// to a name.
func errorInfoCode(raw json.RawMessage) string {
	var name string
	if json.Unmarshal(raw, &name) == nil {
		return name
	}
	var kinds map[string]json.RawMessage
	if json.Unmarshal(raw, &kinds) != nil {
		return ""
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

func (s *Session) onItemStarted(turnID string, item codexwire.Item) {
	payload := map[string]any{"kind": item.Type, "itemId": item.ID}
	switch item.Type {
	case codexwire.ItemCommandExecution, "fileChange":
		putNonEmpty(payload, "status", item.Status)
	case codexwire.ItemDynamicToolCall, "mcpToolCall":
		putNonEmpty(payload, "tool", item.Tool)
		if item.Namespace != nil {
			putNonEmpty(payload, "namespace", *item.Namespace)
		}
		putNonEmpty(payload, "server", item.Server)
		putNonEmpty(payload, "status", item.Status)
	}
	s.emitFromReader(Event{Type: "item.started", TurnID: turnID, ItemID: item.ID, Priority: PriorityP1, Payload: payload})
}

func (s *Session) onItemCompleted(turnID string, item codexwire.Item) {
	payload := map[string]any{"kind": item.Type, "itemId": item.ID}
	switch item.Type {
	case codexwire.ItemAgentMessage:
		payload["text"] = item.Text
		s.mu.Lock()
		if s.turn != nil && s.turn.id == turnID {
			s.turn.finalMessage = item.Text
		}
		s.mu.Unlock()
	case codexwire.ItemCommandExecution:
		putNonEmpty(payload, "status", item.Status)
		if item.ExitCode != nil {
			payload["exitCode"] = *item.ExitCode
		}
	case codexwire.ItemDynamicToolCall, "mcpToolCall":
		putNonEmpty(payload, "tool", item.Tool)
		putNonEmpty(payload, "status", item.Status)
		if item.Success != nil {
			payload["success"] = *item.Success
		}
	default:
		putNonEmpty(payload, "status", item.Status)
	}
	s.emitFromReader(Event{Type: "item.completed", TurnID: turnID, ItemID: item.ID, Priority: PriorityP1, Payload: payload})
	if item.Type == codexwire.ItemPlan {
		s.onPlanItem(turnID, item.ID, item.Text)
	}
}

func (s *Session) onDelta(p codexwire.Delta, kind string) {
	s.emitFromReader(Event{Type: "item.delta", TurnID: p.TurnID, ItemID: p.ItemID, Priority: PriorityP2, Payload: map[string]any{
		"kind": kind, "delta": p.Delta,
	}})
}

// onTokenUsage accounts usage per turn as the growth of the thread's
// cumulative total. (Summing `last` would double count: codex re-emits the
// previous update unchanged after an aborted stream, and replays the persisted
// total after a resume.) Without a known earlier total, `last` is the growth.
func (s *Session) onTokenUsage(turnID string, totalCounts, lastCounts *codexwire.TokenCounts) {
	total, ok := totalsOf(totalCounts)
	if !ok {
		s.diagnosticOnce(failure.ProviderProtocolError, "thread/tokenUsage/updated", turnID, "", "tokenUsage.total missing")
		return
	}
	last, _ := totalsOf(lastCounts)
	s.mu.Lock()
	growth := last
	if s.usageBaseline != nil {
		if d, ok := total.minus(*s.usageBaseline); ok {
			growth = d
		}
	}
	s.usageBaseline = &total
	active := s.turn != nil && s.turn.id == turnID
	if active {
		s.turn.usage.InputTokens += growth.input
		s.turn.usage.CachedInputTokens += growth.cached
		s.turn.usage.OutputTokens += growth.output
	}
	s.mu.Unlock()
	if !active {
		s.log.Debug("codex: token usage of a non-active turn recorded as baseline", "turn", turnID)
		return
	}
	s.emitFromReader(Event{Type: "usage.reported", TurnID: turnID, Priority: PriorityP1, Payload: map[string]any{
		"total": total.payload(),
		"last":  last.payload(),
	}})
}

func (s *Session) onProviderError(h notificationHeader, raw json.RawMessage) {
	var p struct {
		codexwire.ErrorNotification
		Message string `json:"message"` // older servers: the message at the top
	}
	_ = decodeParams(raw, &p)
	msg := p.Error.Message
	if msg == "" {
		msg = p.Message
	}
	payload := map[string]any{
		"source":    "provider",
		"code":      failure.ProviderError,
		"message":   truncate(msg, 4096),
		"willRetry": p.WillRetry,
	}
	if info := errorInfoCode(p.Error.CodexErrorInfo); info != "" {
		payload["providerErrorCode"] = info
	}
	s.emitFromReader(Event{Type: "harness.diagnostic", TurnID: h.TurnID, Priority: PriorityP1, Payload: payload})
}

// noticeParams is the params of warning, configWarning and deprecationNotice.
type noticeParams struct {
	Message string          `json:"message"`
	Summary string          `json:"summary"`
	Details json.RawMessage `json:"details"` // a string, or null
}

func (s *Session) onNotice(method string, h notificationHeader, raw json.RawMessage) {
	var p noticeParams
	_ = decodeParams(raw, &p)
	msg := p.Message
	if msg == "" {
		msg = p.Summary
	}
	payload := map[string]any{"kind": method, "message": truncate(msg, 4096)}
	var details string
	if json.Unmarshal(p.Details, &details) == nil && details != "" {
		payload["details"] = truncate(details, 4096)
	}
	s.emitFromReader(Event{Type: "provider.notice.recorded", TurnID: h.TurnID, Priority: PriorityP2, Payload: payload})
}

// ---- emission ----

// emitFromReader emits unless the session already failed (so turn.failed
// from the failure path is the last word).
func (s *Session) emitFromReader(ev Event) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	failed := s.failErr != nil
	s.mu.Unlock()
	if failed {
		return
	}
	s.emitFn(ev)
}

func (s *Session) diagnostic(code, method, turnID, itemID, message string) {
	s.log.Warn("codex: "+message, "code", code, "method", method)
	s.emitFromReader(Event{Type: "harness.diagnostic", TurnID: turnID, ItemID: itemID, Priority: PriorityP1, Payload: map[string]any{
		"code": code, "method": method, "message": truncate(message, 4096),
	}})
}

// diagnosticOnce emits a diagnostic the first time code+method occurs in this
// session; repeats are only logged (a misbehaving provider cannot flood).
func (s *Session) diagnosticOnce(code, method, turnID, itemID, message string) {
	key := code + "|" + method
	s.mu.Lock()
	seen := s.reported[key]
	s.reported[key] = true
	s.mu.Unlock()
	if seen {
		s.log.Debug("codex: "+message, "code", code, "method", method)
		return
	}
	s.diagnostic(code, method, turnID, itemID, message)
}

// ---- JSON helpers ----

// decodeParams decodes a message's params into v. A field of another type
// than codexwire says is left empty, not an error: the driver reads what
// it understands of a newer or odd server.
func decodeParams(raw json.RawMessage, v any) error {
	if !present(raw) {
		return nil
	}
	err := json.Unmarshal(raw, v)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return nil
	}
	return err
}

// isObject reports whether raw is absent, null or a JSON object.
func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return !present(t) || t[0] == '{'
}

// truncate cuts s to at most n bytes on a UTF-8 boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
