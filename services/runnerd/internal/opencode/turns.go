package opencode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// turnState is the active turn: the user message tether sent (its id is
// the turn id) and what its assistant messages reported so far.
type turnState struct {
	id        string
	final     string
	usage     provider.Usage
	cost      float64
	errName   string
	errMsg    string
	asst      map[string]bool // assistant message ids of the turn
	counted   map[string]bool // assistant messages whose usage was added
	items     map[string]bool // items announced started
	interrupt bool
	// ended: the turn's newest assistant message is finished for good
	// (completed with a finish other than "tool-calls", or with an
	// error): OpenCode's prompt loop is over for this turn.
	ended bool
	// open: an assistant message of the turn is not completed yet.
	open bool
}

func newTurn(id string) *turnState {
	return &turnState{id: id, asst: map[string]bool{}, counted: map[string]bool{}, items: map[string]bool{}}
}

var idMu sync.Mutex
var idLast, idCounter int64

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newMessageID returns an OpenCode ascending message id ("msg_" + 12 hex
// digits of ms*4096+counter + 14 base62 characters), which sorts after the
// server's earlier ids as the server's own do.
func newMessageID(now time.Time) string {
	idMu.Lock()
	ms := now.UnixMilli()
	if ms != idLast {
		idLast, idCounter = ms, 0
	}
	idCounter++
	v := ms*0x1000 + idCounter
	idMu.Unlock()
	b := make([]byte, 6)
	for i := range 6 {
		b[i] = byte(v >> (40 - 8*i))
	}
	var sb strings.Builder
	sb.WriteString("msg_")
	sb.WriteString(hex.EncodeToString(b))
	for range 14 {
		n, _ := rand.Int(rand.Reader, big.NewInt(62))
		sb.WriteByte(base62[n.Int64()])
	}
	return sb.String()
}

// OpenThread opens the OpenCode session: the persisted one (resumed; its
// history is the server's) or a new one.
func (s *Session) OpenThread(ctx context.Context, threadID string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resumed := threadID != ""
	if resumed {
		var info map[string]any
		if err := s.call(ctx, http.MethodGet, "/session/"+threadID, nil, &info); err != nil {
			if isNotFound(err) {
				return "", false, perr(failure.ProviderThreadResumeFailed, "OpenCode session %s not found", threadID)
			}
			return "", false, perr(failure.ProviderThreadResumeFailed, "reading OpenCode session %s: %v", threadID, err)
		}
		if id, _ := info["id"].(string); id != threadID {
			return "", false, perr(failure.ProviderThreadResumeMismatch, "asked for OpenCode session %s, got %q", threadID, id)
		}
	} else {
		var info map[string]any
		// A title spares the model OpenCode's title-generation call.
		if err := s.call(ctx, http.MethodPost, "/session", map[string]any{"title": "tether session"}, &info); err != nil {
			return "", false, perr(failure.ProviderThreadStartFailed, "creating an OpenCode session: %v", err)
		}
		threadID, _ = info["id"].(string)
		if threadID == "" {
			return "", false, perr(failure.ProviderThreadStartFailed, "OpenCode returned a session without an id")
		}
	}
	total, seen, err := s.historyUsage(ctx, threadID)
	if err != nil {
		return "", false, perr(failure.ProviderThreadResumeFailed, "reading the usage of OpenCode session %s: %v", threadID, err)
	}
	s.mu.Lock()
	s.sesID = threadID
	s.total, s.seen = total, seen
	s.mu.Unlock()
	s.emitEv("session.started", "", "", provider.P0, map[string]any{
		"threadId": threadID, "providerSessionId": threadID, "resumed": resumed, "model": s.cfg.Model,
	})
	return threadID, resumed, nil
}

func (s *Session) modelRef() map[string]any {
	p, m, ok := strings.Cut(s.cfg.Model, "/")
	if !ok || p == "" || m == "" {
		return nil
	}
	return map[string]any{"providerID": p, "modelID": m}
}

// StartTurn sends the prompt (prompt_async) under a message id tether
// chose, which is the turn id.
//
// A server lost before or during the prompt call (its process exited, the
// connection refused or cut: SPEC R7) does not fail the turn: the prompt
// may or may not have reached it, and the message id tells which after the
// restart. StartTurn then answers provider.TurnStartLost with the turn id;
// runnerd records the turn, restarts the server and reconciles the turn
// from the session's history (found: its recorded result, or cut off and
// dropped; missing: lost), so the run succeeds once, at its next attempt
// or reconciled. A server that is still there after a failed call is
// asked whether it took the prompt; if not, the prompt is sent once more.
func (s *Session) StartTurn(ctx context.Context, text string) (string, error) {
	s.mu.Lock()
	switch {
	case s.exitErr != nil:
		err := s.exitErr
		s.mu.Unlock()
		// Nothing was sent: runnerd restarts the server and sends it.
		return "", err
	case s.sesID == "":
		s.mu.Unlock()
		return "", perr(failure.ProviderThreadNotOpen, "no OpenCode session is open")
	case s.turn != nil:
		id := s.turn.id
		s.mu.Unlock()
		return "", perr(failure.ProviderTurnActive, "turn %s is active", id)
	}
	t := newTurn(newMessageID(time.Now()))
	s.turn = t
	sid := s.sesID
	s.mu.Unlock()
	body := map[string]any{"messageID": t.id, "parts": []any{map[string]any{"type": "text", "text": text}}}
	if m := s.modelRef(); m != nil {
		body["model"] = m
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.emitMu.Lock()
	err := s.call(ctx, http.MethodPost, "/session/"+sid+"/prompt_async", body, nil)
	if err != nil && !isHTTPError(err) {
		// Released while the server's fate is settled: a lost server's
		// end (fail) takes emitMu.
		s.emitMu.Unlock()
		if s.lostDuring(ctx) {
			s.log.Warn("opencode: the server was lost during prompt_async; the turn is reconciled after its restart", "turn", t.id, "err", err)
			return "", &provider.TurnStartLost{TurnID: t.id, Err: perr(failure.ProviderProcessLost, "OpenCode server lost during prompt_async: %v", err)}
		}
		s.emitMu.Lock()
		err = s.retryPrompt(ctx, sid, t.id, body, err)
	}
	defer s.emitMu.Unlock()
	if err != nil {
		s.mu.Lock()
		if s.turn == t {
			s.turn = nil
		}
		s.mu.Unlock()
		return "", perr(failure.ProviderTurnStartFailed, "OpenCode prompt_async: %v", err)
	}
	s.emitEv("turn.started", t.id, "", provider.P0, map[string]any{"providerTurnId": t.id})
	return t.id, nil
}

// startLossWait bounds the wait for a server's end after a failed prompt
// call: its exit watcher sees a killed child at once, a re-attached
// server's within 250 ms, an event stream cut without an exit within 2 s.
const startLossWait = 5 * time.Second

// lostDuring reports whether the server ended (Exited) within
// startLossWait after a prompt call failed on the transport.
func (s *Session) lostDuring(ctx context.Context) bool {
	t := time.NewTimer(startLossWait)
	defer t.Stop()
	select {
	case <-s.exited:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// retryPrompt settles a prompt call that failed on the transport (cause)
// while the server lives on (emitMu held): the prompt is in the session's
// history under id (taken: nil), or it is sent once more.
func (s *Session) retryPrompt(ctx context.Context, sid, id string, body map[string]any, cause error) error {
	var msgs []struct {
		Info map[string]any `json:"info"`
	}
	if err := s.call(ctx, http.MethodGet, "/session/"+sid+"/message", nil, &msgs); err != nil {
		return fmt.Errorf("%v; reading the session's history after it: %v", cause, err)
	}
	for _, m := range msgs {
		if str(m.Info, "id") == id {
			s.log.Info("opencode: prompt_async failed but the server took the prompt", "turn", id, "err", cause)
			return nil
		}
	}
	s.log.Warn("opencode: prompt_async failed and the server has no such prompt; sending it once more", "turn", id, "err", cause)
	if err := s.call(ctx, http.MethodPost, "/session/"+sid+"/prompt_async", body, nil); err != nil {
		return fmt.Errorf("%v; sent again: %v", cause, err)
	}
	return nil
}

// Steer is not offered: OpenCode cannot deliver a message into a running
// prompt (a second prompt waits for the first); SPEC R10.
func (s *Session) Steer(context.Context, string, string) error {
	return perr(failure.SteeringUnsupported, "OpenCode cannot deliver a message into an active turn")
}

// Interrupt aborts the active turn (POST /session/{id}/abort).
func (s *Session) Interrupt(ctx context.Context, turnID string) error {
	s.mu.Lock()
	t, sid := s.turn, s.sesID
	if t != nil && t.id == turnID {
		t.interrupt = true
	}
	s.mu.Unlock()
	if t == nil || t.id != turnID {
		return perr(failure.ProviderUnknownTurn, "turn %s is not active", turnID)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if err := s.call(ctx, http.MethodPost, "/session/"+sid+"/abort", nil, nil); err != nil {
		return perr(failure.ProviderInterruptFailed, "OpenCode abort: %v", err)
	}
	return nil
}

// ---- events ----

func str(m map[string]any, k string) string { v, _ := m[k].(string); return v }

func obj(m map[string]any, k string) map[string]any { v, _ := m[k].(map[string]any); return v }

func num(m map[string]any, k string) float64 { v, _ := m[k].(float64); return v }

// sessionOf finds the session an event is about.
func sessionOf(p map[string]any) string {
	if id := str(p, "sessionID"); id != "" {
		return id
	}
	if id := str(obj(p, "info"), "sessionID"); id != "" {
		return id
	}
	return str(obj(p, "part"), "sessionID")
}

// onEvent maps one OpenCode event of our session.
func (s *Session) onEvent(typ string, p map[string]any) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	mine := s.sesID != "" && sessionOf(p) == s.sesID
	t := s.turn
	s.mu.Unlock()
	if !mine {
		return
	}
	switch typ {
	case "permission.asked":
		s.onPermissionAsked(p, false)
	case "permission.replied":
		s.onPermissionReplied(p)
	}
	if t == nil {
		return
	}
	switch typ {
	case "message.updated":
		s.onMessage(t, obj(p, "info"))
	case "message.part.delta":
		if str(p, "field") == "text" && s.turnMessage(t, str(p, "messageID")) {
			s.emitEv("item.delta", t.id, str(p, "partID"), provider.P2, map[string]any{"kind": "agentMessage", "delta": str(p, "delta")})
		}
	case "message.part.updated":
		s.onPart(t, obj(p, "part"))
	case "session.error":
		e := obj(p, "error")
		s.mu.Lock()
		t.errName, t.errMsg = str(e, "name"), str(obj(e, "data"), "message")
		s.mu.Unlock()
	case "session.idle":
		if !s.idleEnds(t) {
			// An idle this turn gave no cause for: OpenCode reports a
			// session idle more than once around an abort, and a late one
			// of the previous (aborted) turn arrives after the next
			// prompt started. It is not this turn's end.
			s.log.Debug("opencode: session.idle before the turn's end; ignored", "turn", t.id)
			return
		}
		s.finishTurn(t, false)
	}
}

// idleEnds reports whether a session.idle ends t: its newest assistant
// message finished (for good, or after tool calls when OpenCode stops
// there), or, before any assistant message of it, it was aborted or
// OpenCode reported an error for it. A stale idle of the previous turn
// comes before the turn's first assistant message ends.
func (s *Session) idleEnds(t *turnState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case t.ended:
		return true
	case t.open:
		return false
	case len(t.asst) > 0:
		return true
	default:
		return t.interrupt || t.errName != ""
	}
}

// turnMessage reports whether an assistant message belongs to the turn.
func (s *Session) turnMessage(t *turnState, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.asst[id]
}

func (s *Session) onMessage(t *turnState, info map[string]any) {
	if str(info, "role") != "assistant" || str(info, "parentID") != t.id {
		return
	}
	id := str(info, "id")
	s.mu.Lock()
	t.asst[id] = true
	done := obj(info, "time")["completed"] != nil
	e := obj(info, "error")
	t.open = !done
	t.ended = done && (e != nil || str(info, "finish") != "tool-calls")
	if e != nil {
		t.errName, t.errMsg = str(e, "name"), str(obj(e, "data"), "message")
	}
	add := done && !t.counted[id]
	var u provider.Usage
	var cost float64
	if add {
		t.counted[id] = true
		u, cost = usageOf(info)
		t.usage.InputTokens += u.InputTokens
		t.usage.CachedInputTokens += u.CachedInputTokens
		t.usage.OutputTokens += u.OutputTokens
		t.cost += cost
		s.countTotal(id, u)
	}
	total := s.total
	s.mu.Unlock()
	if add {
		s.emitEv("usage.reported", t.id, "", provider.P1, map[string]any{
			"total": usagePayload(total), "last": usagePayload(u), "costUsd": cost,
		})
	}
}

// Usage is durable (SPEC R12): the session's total is not kept by the
// driver but read back from the session's history at every OpenThread (a
// restarted or re-attached server, a restored checkpoint: the history is in
// the backed-up database) — the tokens of every finished assistant message
// — plus what tether deleted from the history with a dropped turn
// (usageFile). Each finished assistant message counts once (seen).

// countTotal adds u of assistant message id to the session's total once
// (mu held).
func (s *Session) countTotal(id string, u provider.Usage) {
	if s.seen[id] {
		return
	}
	s.seen[id] = true
	s.total.InputTokens += u.InputTokens
	s.total.CachedInputTokens += u.CachedInputTokens
	s.total.OutputTokens += u.OutputTokens
}

// historyUsage is the total of session sid: its finished assistant
// messages and its dropped usage.
func (s *Session) historyUsage(ctx context.Context, sid string) (provider.Usage, map[string]bool, error) {
	seen := map[string]bool{}
	total := s.droppedUsage(sid)
	var msgs []struct {
		Info map[string]any `json:"info"`
	}
	if err := s.call(ctx, http.MethodGet, "/session/"+sid+"/message", nil, &msgs); err != nil {
		return total, seen, err
	}
	for _, m := range msgs {
		if str(m.Info, "role") != "assistant" || obj(m.Info, "time")["completed"] == nil {
			continue
		}
		u, _ := usageOf(m.Info)
		seen[str(m.Info, "id")] = true
		total.InputTokens += u.InputTokens
		total.CachedInputTokens += u.CachedInputTokens
		total.OutputTokens += u.OutputTokens
	}
	return total, seen, nil
}

// usageOf reads an assistant message's tokens: input counts the cached
// reads too (as codex reports it), output counts reasoning.
func usageOf(info map[string]any) (provider.Usage, float64) {
	tk := obj(info, "tokens")
	cached := int64(num(obj(tk, "cache"), "read"))
	return provider.Usage{
		InputTokens:       int64(num(tk, "input")) + cached,
		CachedInputTokens: cached,
		OutputTokens:      int64(num(tk, "output")) + int64(num(tk, "reasoning")),
	}, num(info, "cost")
}

func usagePayload(u provider.Usage) map[string]any {
	return map[string]any{"inputTokens": u.InputTokens, "cachedInputTokens": u.CachedInputTokens, "outputTokens": u.OutputTokens,
		"totalTokens": u.InputTokens + u.OutputTokens}
}

func (s *Session) onPart(t *turnState, part map[string]any) {
	if !s.turnMessage(t, str(part, "messageID")) {
		return
	}
	id := str(part, "id")
	switch str(part, "type") {
	case "text":
		s.mu.Lock()
		first := !t.items[id]
		t.items[id] = true
		s.mu.Unlock()
		if first {
			s.emitEv("item.started", t.id, id, provider.P1, map[string]any{"kind": "agentMessage", "itemId": id})
		}
		if obj(part, "time")["end"] != nil {
			text := str(part, "text")
			s.mu.Lock()
			t.final = text
			s.mu.Unlock()
			s.emitEv("item.completed", t.id, id, provider.P1, map[string]any{"kind": "agentMessage", "itemId": id, "text": text})
		}
	case "tool":
		st := obj(part, "state")
		tool, callID := str(part, "tool"), str(part, "callID")
		kind := "toolCall"
		if tool == "bash" {
			kind = "commandExecution"
		}
		payload := map[string]any{"kind": kind, "itemId": callID, "tool": tool}
		switch str(st, "status") {
		case "running":
			s.mu.Lock()
			first := !t.items[callID]
			t.items[callID] = true
			s.mu.Unlock()
			if first {
				payload["status"] = "inProgress"
				s.emitEv("item.started", t.id, callID, provider.P1, payload)
			}
		case "completed":
			payload["status"] = "completed"
			if code, ok := obj(st, "metadata")["exit"].(float64); ok {
				payload["exitCode"] = code
			}
			s.emitEv("item.completed", t.id, callID, provider.P1, payload)
		case "error":
			payload["status"] = "failed"
			payload["error"] = truncate(str(st, "error"), 4096)
			s.emitEv("item.completed", t.id, callID, provider.P1, payload)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// finishTurn ends t once (emitMu held): interrupted when aborted, failed
// on a session error, completed otherwise.
func (s *Session) finishTurn(t *turnState, reconciled bool) {
	s.mu.Lock()
	if s.turn != t {
		s.mu.Unlock()
		return
	}
	s.turn = nil
	res := provider.TurnResult{TurnID: t.id, FinalMessage: t.final, Usage: t.usage}
	total := s.total
	res.Total = &total
	errName, errMsg, cost := t.errName, t.errMsg, t.cost
	s.mu.Unlock()
	s.expireRequests(failure.TurnEnded)
	payload := map[string]any{"finalMessage": res.FinalMessage, "costUsd": cost, "usage": map[string]any{
		"inputTokens": res.Usage.InputTokens, "cachedInputTokens": res.Usage.CachedInputTokens, "outputTokens": res.Usage.OutputTokens}}
	var evType string
	switch {
	case errName == "MessageAbortedError":
		res.Status, evType = "interrupted", "turn.interrupted"
	case errName != "":
		res.Status, evType = "failed", "turn.failed"
		res.ErrorCode = failure.ProviderTurnFailed
		res.ErrorMessage = truncate(firstNonEmpty(errMsg, errName), 4096)
		payload["error"] = map[string]any{"code": res.ErrorCode, "message": res.ErrorMessage, "providerErrorCode": errName}
	default:
		res.Status, evType = "completed", "turn.completed"
	}
	payload["status"] = res.Status
	if reconciled {
		payload["reconciled"] = true
	}
	s.emitEv(evType, t.id, "", provider.P0, payload)
	s.deliver(res)
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

// ---- reconciliation (SPEC R7, R8) ----

// ReconcileTurn settles a turn that was active when the server or runnerd
// was lost, from the session's history: the server still runs it
// (retained), it has a finished answer (terminalized: its result arrives
// on TurnDone; an answer cut off by the loss reads back interrupted), or
// the server never recorded the prompt (missing).
func (s *Session) ReconcileTurn(ctx context.Context, turnID string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	sid := s.sesID
	t := newTurn(turnID)
	s.turn = t // events from now on are the turn's
	s.mu.Unlock()
	clear := func() {
		s.mu.Lock()
		if s.turn == t {
			s.turn = nil
		}
		s.mu.Unlock()
	}
	var status map[string]map[string]any
	if err := s.call(ctx, http.MethodGet, "/session/status", nil, &status); err != nil {
		clear()
		return "", "", perr(failure.ProviderReconcileFailed, "OpenCode session status: %v", err)
	}
	var msgs []struct {
		Info  map[string]any   `json:"info"`
		Parts []map[string]any `json:"parts"`
	}
	if err := s.call(ctx, http.MethodGet, "/session/"+sid+"/message", nil, &msgs); err != nil {
		clear()
		return "", "", perr(failure.ProviderReconcileFailed, "OpenCode session history: %v", err)
	}
	found := false
	for _, m := range msgs {
		if str(m.Info, "id") == turnID && str(m.Info, "role") == "user" {
			found = true
		}
	}
	if !found {
		clear()
		return provider.ReconcileMissing, "", perr(failure.ProviderTurnMissing, "OpenCode session %s has no message %s", sid, turnID)
	}
	if str(status[sid], "type") == "busy" {
		// Usage and text of the answer so far are read from the history.
		for _, m := range msgs {
			if str(m.Info, "parentID") == turnID {
				s.mu.Lock()
				t.asst[str(m.Info, "id")] = true
				s.mu.Unlock()
			}
		}
		// Requests the lost runnerd announced were expired by the new
		// one; those still open are announced afresh.
		s.announcePending(ctx)
		return provider.ReconcileRetained, "inProgress", nil
	}
	var last map[string]any
	for _, m := range msgs {
		if str(m.Info, "role") == "assistant" && str(m.Info, "parentID") == turnID {
			s.mu.Lock()
			t.asst[str(m.Info, "id")] = true
			s.mu.Unlock()
			s.onMessage(t, m.Info)
			for _, p := range m.Parts {
				if str(p, "type") == "text" {
					s.mu.Lock()
					t.final = str(p, "text")
					s.mu.Unlock()
				}
			}
			last = m.Info
		}
	}
	switch {
	case last == nil || obj(last, "time")["completed"] == nil:
		// Recorded, but its answer was cut off by the loss.
		t.errName, t.errMsg = "MessageAbortedError", "cut off"
	case obj(last, "error") != nil:
		e := obj(last, "error")
		t.errName, t.errMsg = str(e, "name"), str(obj(e, "data"), "message")
	}
	s.finishTurn(t, true)
	st := "completed"
	switch {
	case t.errName == "MessageAbortedError":
		st = "interrupted"
	case t.errName != "":
		st = "failed"
	}
	return provider.ReconcileTerminalized, st, nil
}

// LastTurn is the session's newest user message (the newest turn).
func (s *Session) LastTurn(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	sid := s.sesID
	s.mu.Unlock()
	var msgs []struct {
		Info map[string]any `json:"info"`
	}
	if err := s.call(ctx, http.MethodGet, "/session/"+sid+"/message", nil, &msgs); err != nil {
		return "", perr(failure.ProviderReconcileFailed, "OpenCode session history: %v", err)
	}
	last := ""
	for _, m := range msgs {
		if str(m.Info, "role") == "user" {
			last = str(m.Info, "id")
		}
	}
	return last, nil
}

// ReconcileOnReattach reports true: the event stream does not replay what happened
// while runnerd was down, so runnerd reconciles the active turn after a
// re-attach (provider.ReattachReconciler).
func (s *Session) ReconcileOnReattach() bool { return true }

var (
	_ provider.Provider               = (*Session)(nil)
	_ provider.TurnReconciler         = (*Session)(nil)
	_ provider.RuntimeRequestProvider = (*Session)(nil)
	_ provider.ReattachReconciler     = (*Session)(nil)
	_ provider.TurnDropper            = (*Session)(nil)
)
