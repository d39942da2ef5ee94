package opencode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/opencode/opencodewire"
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
		var info opencodewire.Session
		if err := s.call(ctx, http.MethodGet, "/session/"+threadID, nil, &info); err != nil {
			if isNotFound(err) {
				return "", false, perr(failure.ProviderThreadResumeFailed, "OpenCode session %s not found", threadID)
			}
			return "", false, perr(failure.ProviderThreadResumeFailed, "reading OpenCode session %s: %v", threadID, err)
		}
		if info.ID != threadID {
			return "", false, perr(failure.ProviderThreadResumeMismatch, "asked for OpenCode session %s, got %q", threadID, info.ID)
		}
	} else {
		var info opencodewire.Session
		// A title spares the model OpenCode's title-generation call.
		if err := s.call(ctx, http.MethodPost, "/session", opencodewire.CreateSessionRequest{Title: "tether session"}, &info); err != nil {
			return "", false, perr(failure.ProviderThreadStartFailed, "creating an OpenCode session: %v", err)
		}
		threadID = info.ID
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

func (s *Session) modelRef() *opencodewire.ModelRef {
	p, m, ok := strings.Cut(s.cfg.Model, "/")
	if !ok || p == "" || m == "" {
		return nil
	}
	return &opencodewire.ModelRef{ProviderID: p, ModelID: m}
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
	body := opencodewire.PromptRequest{MessageID: t.id, Parts: []opencodewire.TextInput{{Type: "text", Text: text}}, Model: s.modelRef()}
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
func (s *Session) retryPrompt(ctx context.Context, sid, id string, body opencodewire.PromptRequest, cause error) error {
	msgs, err := s.history(ctx, sid)
	if err != nil {
		return fmt.Errorf("%v; reading the session's history after it: %v", cause, err)
	}
	for _, m := range msgs {
		if m.Info.ID == id {
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

// history reads session sid's messages.
func (s *Session) history(ctx context.Context, sid string) ([]opencodewire.Message, error) {
	var msgs []opencodewire.Message
	err := s.call(ctx, http.MethodGet, "/session/"+sid+"/message", nil, &msgs)
	return msgs, err
}

// eventProps holds the properties of the events the driver reads; each
// event fills the fields of its type (opencodewire's property types).
type eventProps struct {
	SessionID string                    `json:"sessionID"`
	Info      *opencodewire.MessageInfo `json:"info"`
	Part      *opencodewire.Part        `json:"part"`
	Error     *opencodewire.ErrorInfo   `json:"error"`
	// message.part.delta
	MessageID, PartID, Field, Delta string
	// permission.asked (a PermissionRequest) and permission.replied
	opencodewire.PermissionRequest
	RequestID string `json:"requestID"`
}

// sessionOf finds the session an event is about.
func (p *eventProps) sessionOf() string {
	switch {
	case p.SessionID != "":
		return p.SessionID
	case p.Info != nil && p.Info.SessionID != "":
		return p.Info.SessionID
	case p.Part != nil:
		return p.Part.SessionID
	}
	return ""
}

// onEvent maps one OpenCode event of our session. Properties that do not
// decode (a field of another type) leave their field empty.
func (s *Session) onEvent(typ string, raw json.RawMessage) {
	var p eventProps
	if err := json.Unmarshal(raw, &p); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return
		}
	}
	p.PermissionRequest.SessionID = p.SessionID
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	mine := s.sesID != "" && p.sessionOf() == s.sesID
	t := s.turn
	s.mu.Unlock()
	if !mine {
		return
	}
	switch typ {
	case opencodewire.EventPermissionAsked:
		s.onPermissionAsked(p.PermissionRequest, false)
	case opencodewire.EventPermissionReplied:
		s.onPermissionReplied(p.RequestID)
	}
	if t == nil {
		return
	}
	switch typ {
	case opencodewire.EventMessageUpdated:
		if p.Info != nil {
			s.onMessage(t, *p.Info)
		}
	case opencodewire.EventPartDelta:
		if p.Field == "text" && s.turnMessage(t, p.MessageID) {
			s.emitEv("item.delta", t.id, p.PartID, provider.P2, map[string]any{"kind": "agentMessage", "delta": p.Delta})
		}
	case opencodewire.EventPartUpdated:
		if p.Part != nil {
			s.onPart(t, *p.Part)
		}
	case opencodewire.EventSessionError:
		var e opencodewire.ErrorInfo
		if p.Error != nil {
			e = *p.Error
		}
		s.mu.Lock()
		t.errName, t.errMsg = e.Name, e.Data.Message
		s.mu.Unlock()
	case opencodewire.EventSessionIdle:
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

func (s *Session) onMessage(t *turnState, info opencodewire.MessageInfo) {
	if info.Role != "assistant" || info.ParentID != t.id {
		return
	}
	id := info.ID
	s.mu.Lock()
	t.asst[id] = true
	done := info.Time.Completed != 0
	e := info.Error
	t.open = !done
	t.ended = done && (e != nil || info.Finish != "tool-calls")
	if e != nil {
		t.errName, t.errMsg = e.Name, e.Data.Message
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
	msgs, err := s.history(ctx, sid)
	if err != nil {
		return total, seen, err
	}
	for _, m := range msgs {
		if m.Info.Role != "assistant" || m.Info.Time.Completed == 0 {
			continue
		}
		u, _ := usageOf(m.Info)
		seen[m.Info.ID] = true
		total.InputTokens += u.InputTokens
		total.CachedInputTokens += u.CachedInputTokens
		total.OutputTokens += u.OutputTokens
	}
	return total, seen, nil
}

// usageOf reads an assistant message's tokens: input counts the cached
// reads too (as codex reports it), output counts reasoning.
func usageOf(info opencodewire.MessageInfo) (provider.Usage, float64) {
	var tk opencodewire.Tokens
	if info.Tokens != nil {
		tk = *info.Tokens
	}
	cost := 0.0
	if info.Cost != nil {
		cost = *info.Cost
	}
	return provider.Usage{
		InputTokens:       tk.Input + tk.Cache.Read,
		CachedInputTokens: tk.Cache.Read,
		OutputTokens:      tk.Output + tk.Reasoning,
	}, cost
}

func usagePayload(u provider.Usage) map[string]any {
	return map[string]any{"inputTokens": u.InputTokens, "cachedInputTokens": u.CachedInputTokens, "outputTokens": u.OutputTokens,
		"totalTokens": u.InputTokens + u.OutputTokens}
}

func (s *Session) onPart(t *turnState, part opencodewire.Part) {
	if !s.turnMessage(t, part.MessageID) {
		return
	}
	id := part.ID
	switch part.Type {
	case opencodewire.PartText:
		s.mu.Lock()
		first := !t.items[id]
		t.items[id] = true
		s.mu.Unlock()
		if first {
			s.emitEv("item.started", t.id, id, provider.P1, map[string]any{"kind": "agentMessage", "itemId": id})
		}
		if part.Time != nil && part.Time.End != 0 {
			text := ""
			if part.Text != nil {
				text = *part.Text
			}
			s.mu.Lock()
			t.final = text
			s.mu.Unlock()
			s.emitEv("item.completed", t.id, id, provider.P1, map[string]any{"kind": "agentMessage", "itemId": id, "text": text})
		}
	case opencodewire.PartTool:
		var st opencodewire.ToolState
		if part.State != nil {
			st = *part.State
		}
		tool, callID := part.Tool, part.CallID
		kind := "toolCall"
		if tool == "bash" {
			kind = "commandExecution"
		}
		payload := map[string]any{"kind": kind, "itemId": callID, "tool": tool}
		switch st.Status {
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
			var meta struct {
				Exit *float64 `json:"exit"`
			}
			if json.Unmarshal(st.Metadata, &meta) == nil && meta.Exit != nil {
				payload["exitCode"] = *meta.Exit
			}
			s.emitEv("item.completed", t.id, callID, provider.P1, payload)
		case "error":
			payload["status"] = "failed"
			payload["error"] = truncate(st.Error, 4096)
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
	var status map[string]opencodewire.Status
	if err := s.call(ctx, http.MethodGet, "/session/status", nil, &status); err != nil {
		clear()
		return "", "", perr(failure.ProviderReconcileFailed, "OpenCode session status: %v", err)
	}
	msgs, err := s.history(ctx, sid)
	if err != nil {
		clear()
		return "", "", perr(failure.ProviderReconcileFailed, "OpenCode session history: %v", err)
	}
	found := false
	for _, m := range msgs {
		if m.Info.ID == turnID && m.Info.Role == "user" {
			found = true
		}
	}
	if !found {
		clear()
		return provider.ReconcileMissing, "", perr(failure.ProviderTurnMissing, "OpenCode session %s has no message %s", sid, turnID)
	}
	if status[sid].Type == "busy" {
		// Usage and text of the answer so far are read from the history.
		for _, m := range msgs {
			if m.Info.ParentID == turnID {
				s.mu.Lock()
				t.asst[m.Info.ID] = true
				s.mu.Unlock()
			}
		}
		// Requests the lost runnerd announced were expired by the new
		// one; those still open are announced afresh.
		s.announcePending(ctx)
		return provider.ReconcileRetained, "inProgress", nil
	}
	var last *opencodewire.MessageInfo
	for _, m := range msgs {
		if m.Info.Role == "assistant" && m.Info.ParentID == turnID {
			s.mu.Lock()
			t.asst[m.Info.ID] = true
			s.mu.Unlock()
			s.onMessage(t, m.Info)
			for _, p := range m.Parts {
				if p.Type == opencodewire.PartText {
					s.mu.Lock()
					t.final = ""
					if p.Text != nil {
						t.final = *p.Text
					}
					s.mu.Unlock()
				}
			}
			last = &m.Info
		}
	}
	switch {
	case last == nil || last.Time.Completed == 0:
		// Recorded, but its answer was cut off by the loss.
		t.errName, t.errMsg = opencodewire.ErrMessageAborted, "cut off"
	case last.Error != nil:
		t.errName, t.errMsg = last.Error.Name, last.Error.Data.Message
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
	msgs, err := s.history(ctx, sid)
	if err != nil {
		return "", perr(failure.ProviderReconcileFailed, "OpenCode session history: %v", err)
	}
	last := ""
	for _, m := range msgs {
		if m.Info.Role == "user" {
			last = m.Info.ID
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
