package fakeopencode

import (
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// turnRun is one prompt being answered.
type turnRun struct {
	s         *Server
	t         *turn
	sid       string
	user      *message
	asst      *message
	prompt    string // the user's text
	text      string // the assistant's text so far
	tokensIn  int
	tokensOut int
}

// recordUser records (and saves) the user message of a prompt without
// answering it ([die:prompt-recorded]).
func (s *Server) recordUser(sid, userID, text, provider, model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ses := s.st.Sessions[sid]
	if ses == nil || userID == "" {
		return
	}
	m := &message{Info: map[string]any{"id": userID, "sessionID": sid, "role": "user", "time": map[string]any{"created": time.Now().UnixMilli()},
		"model": map[string]any{"providerID": provider, "modelID": model}}}
	m.Parts = []map[string]any{{"id": s.id("prt"), "sessionID": sid, "messageID": userID, "type": "text", "text": text}}
	ses.Messages = append(ses.Messages, m)
	s.save()
}

func (s *Server) runTurn(t *turn, sid, userID, text, provider, model string) {
	tr := &turnRun{s: s, t: t, sid: sid, prompt: text}
	s.mu.Lock()
	ses := s.st.Sessions[sid]
	var history []string
	histChars := 0
	for _, m := range ses.Messages {
		for _, p := range m.Parts {
			if p["type"] == "text" {
				if m.Info["role"] == "user" {
					history = append(history, p["text"].(string))
				}
				histChars += len(p["text"].(string))
			}
		}
	}
	now := time.Now().UnixMilli()
	uid := userID
	if uid == "" {
		uid = s.id("msg")
	}
	tr.user = &message{Info: map[string]any{"id": uid, "sessionID": sid, "role": "user", "time": map[string]any{"created": now},
		"model": map[string]any{"providerID": provider, "modelID": model}}}
	tr.user.Parts = []map[string]any{{"id": s.id("prt"), "sessionID": sid, "messageID": uid, "type": "text", "text": text}}
	aid := s.id("msg")
	tr.asst = &message{Info: map[string]any{"id": aid, "sessionID": sid, "role": "assistant", "parentID": uid,
		"modelID": model, "providerID": provider, "mode": "build", "time": map[string]any{"created": now}}}
	ses.Messages = append(ses.Messages, tr.user, tr.asst)
	s.save()
	s.mu.Unlock()
	tr.tokensIn = (histChars + len(text)) / 4

	s.publish("message.updated", map[string]any{"sessionID": sid, "info": tr.user.Info})
	s.publish("message.part.updated", map[string]any{"sessionID": sid, "part": tr.user.Parts[0]})
	s.publish("session.status", map[string]any{"sessionID": sid, "status": map[string]any{"type": "busy"}})
	s.publish("message.updated", map[string]any{"sessionID": sid, "info": tr.asst.Info})
	tr.addPart(map[string]any{"type": "step-start"})

	var errInfo map[string]any
	switch {
	case strings.Contains(text, "[fail]"):
		errInfo = map[string]any{"name": "APIError", "data": map[string]any{"message": "mock failure requested", "isRetryable": false}}
	case strings.Contains(text, "[bash]"), strings.Contains(text, "[shell]"):
		command := ShellCommand
		if _, c, ok := strings.Cut(text, "[bash]"); ok {
			command = strings.TrimSpace(c)
		}
		result := tr.tool(command)
		if t.ctx.Err() == nil {
			tr.stream("TOOL RESULT: "+strings.TrimSpace(result), nil, s.opts.DeltaDelay)
		}
	case strings.Contains(text, "[slow]"):
		reply := "ECHO: " + text
		tr.stream(reply, mockmodel.SplitEven(reply, mockmodel.SlowChunks), s.opts.SlowDelay)
	case strings.Contains(text, "[hold]"):
		tr.stream("holding", nil, 0)
		<-t.ctx.Done()
	case strings.Contains(text, "[history]"):
		tr.stream("HISTORY: "+strings.Join(history, " | "), nil, s.opts.DeltaDelay)
	default:
		tr.stream("ECHO: "+text, nil, s.opts.DeltaDelay)
	}
	if t.ctx.Err() != nil {
		errInfo = map[string]any{"name": "MessageAbortedError", "data": map[string]any{"message": "Aborted"}}
	}
	tr.finish(errInfo)
}

// addPart adds a part to the assistant message and publishes it.
func (tr *turnRun) addPart(p map[string]any) map[string]any {
	s := tr.s
	s.mu.Lock()
	p["id"] = s.id("prt")
	p["sessionID"] = tr.sid
	p["messageID"] = tr.asst.Info["id"]
	tr.asst.Parts = append(tr.asst.Parts, p)
	cp := clone(p)
	s.mu.Unlock()
	s.publish("message.part.updated", map[string]any{"sessionID": tr.sid, "part": cp})
	return p
}

// updatePart republishes a part after changing it under the lock.
func (tr *turnRun) updatePart(p map[string]any, change func()) {
	s := tr.s
	s.mu.Lock()
	change()
	cp := clone(p)
	s.mu.Unlock()
	s.publish("message.part.updated", map[string]any{"sessionID": tr.sid, "part": cp})
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			v = clone(sub)
		}
		out[k] = v
	}
	return out
}

// stream streams reply as one text part (chunks, delay apart), stopping
// early when the turn is aborted.
func (tr *turnRun) stream(reply string, chunks []string, delay time.Duration) {
	if chunks == nil {
		chunks = strings.SplitAfter(reply, " ")
	}
	now := time.Now().UnixMilli()
	p := tr.addPart(map[string]any{"type": "text", "text": "", "time": map[string]any{"start": now}})
	sent := ""
	for i, c := range chunks {
		if i > 0 && delay > 0 {
			select {
			case <-time.After(delay):
			case <-tr.t.ctx.Done():
			}
		}
		if tr.t.ctx.Err() != nil {
			break
		}
		sent += c
		tr.s.publish("message.part.delta", map[string]any{"sessionID": tr.sid, "messageID": tr.asst.Info["id"],
			"partID": p["id"], "field": "text", "delta": c})
		if i == 0 {
			tr.s.dieAt(DieMidStream, tr.prompt)
		}
	}
	tr.updatePart(p, func() {
		p["text"] = sent
		p["time"] = map[string]any{"start": now, "end": time.Now().UnixMilli()}
	})
	tr.text += sent
	tr.tokensOut += len(strings.Fields(sent))
}

// tool runs one bash tool call under the permission rule and returns what
// the model would get back.
func (tr *turnRun) tool(command string) string {
	s := tr.s
	callID := "call_" + strings.TrimPrefix(tr.asst.Info["id"].(string), "msg_")
	input := map[string]any{"command": command, "description": "Run the mock command"}
	p := tr.addPart(map[string]any{"type": "tool", "tool": "bash", "callID": callID, "state": map[string]any{"status": "pending", "input": map[string]any{}}})
	tr.updatePart(p, func() {
		p["state"] = map[string]any{"status": "running", "input": input, "time": map[string]any{"start": time.Now().UnixMilli()}}
	})
	fail := func(msg string) string {
		tr.updatePart(p, func() { p["state"] = map[string]any{"status": "error", "input": input, "error": msg} })
		return msg
	}
	switch s.opts.Permission {
	case "deny":
		return fail("The user has specified a rule which prevents you from using this specific tool call.")
	case "ask":
		s.mu.Lock()
		pid := s.id("per")
		req := map[string]any{"id": pid, "sessionID": tr.sid, "permission": "bash", "patterns": []any{command},
			"metadata": map[string]any{"command": command}, "always": []any{strings.Fields(command)[0] + " *"},
			"tool": map[string]any{"messageID": tr.asst.Info["id"], "callID": callID}}
		perm := &permission{req: req, reply: make(chan [2]string, 1)}
		s.perms[pid] = perm
		s.mu.Unlock()
		s.publish("permission.asked", req)
		var reply [2]string
		select {
		case reply = <-perm.reply:
		case <-tr.t.ctx.Done():
			s.mu.Lock()
			delete(s.perms, pid)
			s.mu.Unlock()
			return fail("Aborted")
		}
		s.publish("permission.replied", map[string]any{"sessionID": tr.sid, "requestID": pid, "reply": reply[0]})
		if reply[0] == "reject" {
			msg := "The user rejected permission to use this specific tool call."
			if reply[1] != "" {
				msg = "The user rejected permission to use this specific tool call with the following feedback: " + reply[1]
			}
			return fail(msg)
		}
	}
	out, code := s.runShell(tr.t.ctx, command)
	tr.updatePart(p, func() {
		p["state"] = map[string]any{"status": "completed", "input": input, "output": out,
			"metadata": map[string]any{"output": out, "exit": code}, "title": command}
	})
	return out
}

// AbortTailLimit bounds how long an aborted turn's last events wait for
// the session's next prompt.
const AbortTailLimit = 2 * time.Second

// finish records the step and message end, then reports the session idle.
func (tr *turnRun) finish(errInfo map[string]any) {
	s := tr.s
	tokens := map[string]any{"input": tr.tokensIn, "output": tr.tokensOut, "reasoning": 0,
		"cache": map[string]any{"read": tr.tokensIn / 2, "write": 0}}
	cost := float64(tr.tokensIn+tr.tokensOut) * 0.000001
	reason := "stop"
	if errInfo != nil {
		reason = "error"
	}
	tr.addPart(map[string]any{"type": "step-finish", "reason": reason, "tokens": tokens, "cost": cost})
	s.mu.Lock()
	info := tr.asst.Info
	info["tokens"], info["cost"] = tokens, cost
	info["time"] = map[string]any{"created": info["time"].(map[string]any)["created"], "completed": time.Now().UnixMilli()}
	if errInfo != nil {
		info["error"] = errInfo
	} else {
		info["finish"] = "stop"
	}
	ci := clone(info)
	s.save()
	delete(s.running, tr.sid)
	var next chan struct{}
	if aborted := errInfo != nil && errInfo["name"] == "MessageAbortedError"; aborted {
		next = make(chan struct{})
		s.nextPrompt[tr.sid] = next
	}
	s.mu.Unlock()
	tr.t.cancel()
	if errInfo != nil {
		s.publish("session.error", map[string]any{"sessionID": tr.sid, "error": errInfo})
	}
	if next != nil {
		// As OpenCode 1.18.17 does on an abort: the session is reported
		// idle at once, and again after the aborted message was written
		// (its late idle can follow the next prompt: held until one comes,
		// at most AbortTailLimit).
		s.publish("session.status", map[string]any{"sessionID": tr.sid, "status": map[string]any{"type": "idle"}})
		s.publish("session.idle", map[string]any{"sessionID": tr.sid})
		select {
		case <-next:
		case <-time.After(AbortTailLimit):
		}
		s.mu.Lock()
		if s.nextPrompt[tr.sid] == next {
			delete(s.nextPrompt, tr.sid)
		}
		s.mu.Unlock()
	}
	s.publish("message.updated", map[string]any{"sessionID": tr.sid, "info": ci})
	s.publish("session.status", map[string]any{"sessionID": tr.sid, "status": map[string]any{"type": "idle"}})
	s.publish("session.idle", map[string]any{"sessionID": tr.sid})
}
