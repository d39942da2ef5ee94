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
	"strconv"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/failure"
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

func parseTotals(m map[string]any) (tokenTotals, bool) {
	if m == nil {
		return tokenTotals{}, false
	}
	in, ok1 := num(m, "inputTokens")
	out, ok2 := num(m, "outputTokens")
	cached, _ := num(m, "cachedInputTokens")
	total, ok3 := num(m, "totalTokens")
	if !ok3 {
		total = in + out
	}
	return tokenTotals{input: in, cached: cached, output: out, total: total}, ok1 || ok2 || ok3
}

// handleNotification maps one provider notification to events. It runs on
// the reader goroutine, so events keep the provider's order.
func (s *Session) handleNotification(method string, raw json.RawMessage) {
	switch method {
	case "turn/started", "turn/completed", "item/started", "item/completed",
		"item/agentMessage/delta", "item/commandExecution/outputDelta",
		"thread/tokenUsage/updated", "turn/plan/updated", "error", "warning", "configWarning", "deprecationNotice",
		"serverRequest/resolved":
	default:
		s.log.Debug("codex: notification ignored", "method", method)
		return
	}
	p, err := decodeObject(raw)
	if err != nil {
		s.diagnosticOnce(failure.ProviderProtocolError, method, "", "", method+" params are not a JSON object")
		return
	}
	switch method {
	case "warning", "configWarning", "deprecationNotice":
		if !s.threadOK(method, p, false) {
			return
		}
		s.onNotice(method, p)
		return
	case "error":
		if !s.threadOK(method, p, false) {
			return
		}
		s.onProviderError(p)
		return
	case "serverRequest/resolved":
		if !s.threadOK(method, p, false) {
			return
		}
		s.onServerRequestResolved(p)
		return
	}
	if !s.threadOK(method, p, true) {
		return
	}
	switch method {
	case "turn/started":
		s.onTurnStarted(p)
	case "turn/completed":
		s.onTurnCompleted(p)
	case "item/started":
		s.onItemStarted(p)
	case "item/completed":
		s.onItemCompleted(p)
	case "item/agentMessage/delta":
		s.onDelta(p, "agentMessage")
	case "item/commandExecution/outputDelta":
		s.onDelta(p, "commandExecution")
	case "thread/tokenUsage/updated":
		s.onTokenUsage(p)
	case "turn/plan/updated":
		s.onPlanUpdated(p)
	}
}

// threadOK checks that a notification names the open thread. With required,
// a missing threadId is a mismatch too.
func (s *Session) threadOK(method string, p map[string]any, required bool) bool {
	tid := str(p, "threadId")
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
	s.diagnosticOnce(failure.ProviderThreadMismatch, method, str(p, "turnId"), "", msg)
	return false
}

func (s *Session) onTurnStarted(p map[string]any) {
	id := str(obj(p, "turn"), "id")
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

func (s *Session) onTurnCompleted(p map[string]any) {
	turn := obj(p, "turn")
	id := str(turn, "id")
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
		final = lastAgentMessage(turn)
	}
	res := TurnResult{TurnID: id, FinalMessage: final, Usage: t.usage, Total: total, Artifacts: t.artifacts()}
	status := str(turn, "status")
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
	if e := obj(turn, "error"); e != nil {
		perr := map[string]any{"message": truncate(str(e, "message"), 4096)}
		if info := errorInfoCode(e["codexErrorInfo"]); info != "" {
			perr["providerErrorCode"] = info
		}
		if res.Status == TurnFailed {
			perr["code"] = res.ErrorCode
			if m := str(e, "message"); m != "" {
				res.ErrorMessage = truncate(m, 4096)
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

func lastAgentMessage(turn map[string]any) string {
	items, _ := turn["items"].([]any)
	for i := len(items) - 1; i >= 0; i-- {
		it, _ := items[i].(map[string]any)
		if str(it, "type") == "agentMessage" {
			return str(it, "text")
		}
	}
	return ""
}

// errorInfoCode reduces codexErrorInfo ("other" or {"httpConnectionFailed":{…}})
// to a name.
func errorInfoCode(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		for k := range x {
			return k
		}
	}
	return ""
}

func (s *Session) onItemStarted(p map[string]any) {
	item := obj(p, "item")
	kind, itemID := str(item, "type"), str(item, "id")
	payload := map[string]any{"kind": kind, "itemId": itemID}
	switch kind {
	case "commandExecution", "fileChange":
		putStr(payload, item, "status")
	case "dynamicToolCall", "mcpToolCall":
		putStr(payload, item, "tool")
		putStr(payload, item, "namespace")
		putStr(payload, item, "server")
		putStr(payload, item, "status")
	}
	s.emitFromReader(Event{Type: "item.started", TurnID: str(p, "turnId"), ItemID: itemID, Priority: PriorityP1, Payload: payload})
}

func (s *Session) onItemCompleted(p map[string]any) {
	item := obj(p, "item")
	kind, itemID, turnID := str(item, "type"), str(item, "id"), str(p, "turnId")
	payload := map[string]any{"kind": kind, "itemId": itemID}
	switch kind {
	case "agentMessage":
		text := str(item, "text")
		payload["text"] = text
		s.mu.Lock()
		if s.turn != nil && s.turn.id == turnID {
			s.turn.finalMessage = text
		}
		s.mu.Unlock()
	case "commandExecution":
		putStr(payload, item, "status")
		if code, ok := num(item, "exitCode"); ok {
			payload["exitCode"] = code
		}
	case "dynamicToolCall", "mcpToolCall":
		putStr(payload, item, "tool")
		putStr(payload, item, "status")
		if b, ok := item["success"].(bool); ok {
			payload["success"] = b
		}
	default:
		putStr(payload, item, "status")
	}
	s.emitFromReader(Event{Type: "item.completed", TurnID: turnID, ItemID: itemID, Priority: PriorityP1, Payload: payload})
	if kind == "plan" {
		s.onPlanItem(turnID, itemID, str(item, "text"))
	}
}

func (s *Session) onDelta(p map[string]any, kind string) {
	itemID := str(p, "itemId")
	s.emitFromReader(Event{Type: "item.delta", TurnID: str(p, "turnId"), ItemID: itemID, Priority: PriorityP2, Payload: map[string]any{
		"kind": kind, "delta": str(p, "delta"),
	}})
}

// onTokenUsage accounts usage per turn as the growth of the thread's
// cumulative total. (Summing `last` would double count: codex re-emits the
// previous update unchanged after an aborted stream, and replays the persisted
// total after a resume.) Without a known earlier total, `last` is the growth.
func (s *Session) onTokenUsage(p map[string]any) {
	tu := obj(p, "tokenUsage")
	total, ok := parseTotals(obj(tu, "total"))
	if !ok {
		s.diagnosticOnce(failure.ProviderProtocolError, "thread/tokenUsage/updated", str(p, "turnId"), "", "tokenUsage.total missing")
		return
	}
	last, _ := parseTotals(obj(tu, "last"))
	turnID := str(p, "turnId")
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

func (s *Session) onProviderError(p map[string]any) {
	e := obj(p, "error")
	msg := str(e, "message")
	if msg == "" {
		msg = str(p, "message")
	}
	willRetry, _ := p["willRetry"].(bool)
	payload := map[string]any{
		"source":    "provider",
		"code":      failure.ProviderError,
		"message":   truncate(msg, 4096),
		"willRetry": willRetry,
	}
	if info := errorInfoCode(e["codexErrorInfo"]); info != "" {
		payload["providerErrorCode"] = info
	}
	s.emitFromReader(Event{Type: "harness.diagnostic", TurnID: str(p, "turnId"), Priority: PriorityP1, Payload: payload})
}

func (s *Session) onNotice(method string, p map[string]any) {
	msg := str(p, "message")
	if msg == "" {
		msg = str(p, "summary")
	}
	payload := map[string]any{"kind": method, "message": truncate(msg, 4096)}
	if d := str(p, "details"); d != "" {
		payload["details"] = truncate(d, 4096)
	}
	s.emitFromReader(Event{Type: "provider.notice.recorded", TurnID: str(p, "turnId"), Priority: PriorityP2, Payload: payload})
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

func decodeObject(raw json.RawMessage) (map[string]any, error) {
	if !present(raw) {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]any{}
	}
	return m, nil
}

func str(m map[string]any, k string) string {
	v, _ := m[k].(string)
	return v
}

func obj(m map[string]any, k string) map[string]any {
	v, _ := m[k].(map[string]any)
	return v
}

func num(m map[string]any, k string) (int64, bool) {
	n, ok := m[k].(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := n.Int64(); err == nil {
		return i, true
	}
	if f, err := n.Float64(); err == nil {
		return int64(f), true
	}
	return 0, false
}

func putStr(dst, src map[string]any, k string) {
	if v := str(src, k); v != "" {
		dst[k] = v
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

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
