package fakeopencode

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/opencode/opencodewire"

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

// userMessage is a prompt's user message with its one text part (mu
// held: the part id is new).
func (s *Server) userMessage(sid, id, text, provider, model string) *message {
	now := time.Now().UnixMilli()
	return &message{
		Info: opencodewire.MessageInfo{ID: id, SessionID: sid, Role: "user", Time: opencodewire.MessageTime{Created: now},
			Model: &opencodewire.ModelRef{ProviderID: provider, ModelID: model}},
		Parts: []*opencodewire.Part{{ID: s.id("prt"), SessionID: sid, MessageID: id, Type: opencodewire.PartText, Text: &text}},
	}
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
	ses.Messages = append(ses.Messages, s.userMessage(sid, userID, text, provider, model))
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
			if p.Type == opencodewire.PartText && p.Text != nil {
				if m.Info.Role == "user" {
					history = append(history, *p.Text)
				}
				histChars += len(*p.Text)
			}
		}
	}
	uid := userID
	if uid == "" {
		uid = s.id("msg")
	}
	tr.user = s.userMessage(sid, uid, text, provider, model)
	tr.asst = &message{Info: opencodewire.MessageInfo{ID: s.id("msg"), SessionID: sid, Role: "assistant", ParentID: uid,
		ModelID: model, ProviderID: provider, Mode: "build", Time: opencodewire.MessageTime{Created: tr.user.Info.Time.Created}}}
	ses.Messages = append(ses.Messages, tr.user, tr.asst)
	s.save()
	userInfo, userPart, asstInfo := tr.user.Info, *tr.user.Parts[0], tr.asst.Info
	s.mu.Unlock()
	tr.tokensIn = (histChars + len(text)) / 4

	s.publish(opencodewire.EventMessageUpdated, opencodewire.MessageUpdated{SessionID: sid, Info: userInfo})
	s.publish(opencodewire.EventPartUpdated, opencodewire.PartUpdated{SessionID: sid, Part: userPart})
	s.publish(opencodewire.EventSessionStatus, opencodewire.SessionStatus{SessionID: sid, Status: opencodewire.Status{Type: "busy"}})
	s.publish(opencodewire.EventMessageUpdated, opencodewire.MessageUpdated{SessionID: sid, Info: asstInfo})
	tr.addPart(&opencodewire.Part{Type: opencodewire.PartStepStart})

	var errInfo *opencodewire.ErrorInfo
	switch {
	case strings.Contains(text, "[fail]"):
		retryable := false
		errInfo = &opencodewire.ErrorInfo{Name: opencodewire.ErrAPI, Data: opencodewire.ErrorData{Message: "mock failure requested", IsRetryable: &retryable}}
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
		aborted := opencodewire.NewError(opencodewire.ErrMessageAborted, "Aborted")
		errInfo = &aborted
	}
	tr.finish(errInfo)
}

// addPart adds a part to the assistant message and publishes it.
func (tr *turnRun) addPart(p *opencodewire.Part) *opencodewire.Part {
	s := tr.s
	s.mu.Lock()
	p.ID = s.id("prt")
	p.SessionID = tr.sid
	p.MessageID = tr.asst.Info.ID
	tr.asst.Parts = append(tr.asst.Parts, p)
	cp := *p
	s.mu.Unlock()
	s.publish(opencodewire.EventPartUpdated, opencodewire.PartUpdated{SessionID: tr.sid, Part: cp})
	return p
}

// updatePart republishes a part after changing it under the lock (change
// replaces the part's pointer fields rather than writing through them, so
// that the published copy stays as it was).
func (tr *turnRun) updatePart(p *opencodewire.Part, change func()) {
	s := tr.s
	s.mu.Lock()
	change()
	cp := *p
	s.mu.Unlock()
	s.publish(opencodewire.EventPartUpdated, opencodewire.PartUpdated{SessionID: tr.sid, Part: cp})
}

// stream streams reply as one text part (chunks, delay apart), stopping
// early when the turn is aborted.
func (tr *turnRun) stream(reply string, chunks []string, delay time.Duration) {
	if chunks == nil {
		chunks = strings.SplitAfter(reply, " ")
	}
	now := time.Now().UnixMilli()
	empty := ""
	p := tr.addPart(&opencodewire.Part{Type: opencodewire.PartText, Text: &empty, Time: &opencodewire.PartTime{Start: now}})
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
		tr.s.publish(opencodewire.EventPartDelta, opencodewire.PartDelta{SessionID: tr.sid, MessageID: p.MessageID,
			PartID: p.ID, Field: "text", Delta: c})
		if i == 0 {
			tr.s.dieAt(DieMidStream, tr.prompt)
		}
	}
	tr.updatePart(p, func() {
		p.Text = &sent
		p.Time = &opencodewire.PartTime{Start: now, End: time.Now().UnixMilli()}
	})
	tr.text += sent
	tr.tokensOut += len(strings.Fields(sent))
}

// bashInput is the input of a bash tool call.
type bashInput struct {
	Command     string `json:"command"`
	Description string `json:"description"`
}

// tool runs one bash tool call under the permission rule and returns what
// the model would get back.
func (tr *turnRun) tool(command string) string {
	s := tr.s
	callID := "call_" + strings.TrimPrefix(tr.asst.Info.ID, "msg_")
	input, _ := json.Marshal(bashInput{Command: command, Description: "Run the mock command"})
	p := tr.addPart(&opencodewire.Part{Type: opencodewire.PartTool, Tool: "bash", CallID: callID, State: &opencodewire.ToolState{Status: "pending", Input: json.RawMessage("{}")}})
	tr.updatePart(p, func() {
		p.State = &opencodewire.ToolState{Status: "running", Input: input, Time: &opencodewire.PartTime{Start: time.Now().UnixMilli()}}
	})
	fail := func(msg string) string {
		tr.updatePart(p, func() { p.State = &opencodewire.ToolState{Status: "error", Input: input, Error: msg} })
		return msg
	}
	switch s.opts.Permission {
	case "deny":
		return fail("The user has specified a rule which prevents you from using this specific tool call.")
	case "ask":
		var reply [2]string
		if !tr.askPermission(command, callID, &reply) {
			return fail("Aborted")
		}
		if reply[0] == "reject" {
			msg := "The user rejected permission to use this specific tool call."
			if reply[1] != "" {
				msg = "The user rejected permission to use this specific tool call with the following feedback: " + reply[1]
			}
			return fail(msg)
		}
	}
	out, code := s.runShell(tr.t.ctx, command)
	meta, _ := json.Marshal(opencodewire.BashMetadata{Output: out, Exit: code})
	tr.updatePart(p, func() {
		p.State = &opencodewire.ToolState{Status: "completed", Input: input, Output: out, Metadata: meta, Title: command}
	})
	return out
}

// askPermission asks permission for a bash command and waits for the
// reply (reply, message); false when the turn was aborted first.
func (tr *turnRun) askPermission(command, callID string, reply *[2]string) bool {
	s := tr.s
	meta, _ := json.Marshal(struct {
		Command string `json:"command"`
	}{command})
	s.mu.Lock()
	pid := s.id("per")
	req := opencodewire.PermissionRequest{ID: pid, SessionID: tr.sid, Permission: "bash", Patterns: []string{command},
		Metadata: meta, Always: []string{strings.Fields(command)[0] + " *"},
		Tool: &opencodewire.PermissionTool{MessageID: tr.asst.Info.ID, CallID: callID}}
	perm := &permission{req: req, reply: make(chan [2]string, 1)}
	s.perms[pid] = perm
	s.mu.Unlock()
	s.publish(opencodewire.EventPermissionAsked, req)
	select {
	case *reply = <-perm.reply:
	case <-tr.t.ctx.Done():
		s.mu.Lock()
		delete(s.perms, pid)
		s.mu.Unlock()
		return false
	}
	s.publish(opencodewire.EventPermissionReplied, opencodewire.PermissionReplied{SessionID: tr.sid, RequestID: pid, Reply: reply[0]})
	return true
}

// AbortTailLimit bounds how long an aborted turn's last events wait for
// the session's next prompt.
const AbortTailLimit = 2 * time.Second

// finish records the step and message end, then reports the session idle.
func (tr *turnRun) finish(errInfo *opencodewire.ErrorInfo) {
	s := tr.s
	tokens := opencodewire.Tokens{Input: int64(tr.tokensIn), Output: int64(tr.tokensOut),
		Cache: opencodewire.CacheTokens{Read: int64(tr.tokensIn / 2)}}
	cost := float64(tr.tokensIn+tr.tokensOut) * 0.000001
	reason := "stop"
	if errInfo != nil {
		reason = "error"
	}
	stepTokens := tokens
	tr.addPart(&opencodewire.Part{Type: opencodewire.PartStepFinish, Reason: reason, Tokens: &stepTokens, Cost: &cost})
	s.mu.Lock()
	info := &tr.asst.Info
	info.Tokens, info.Cost = &tokens, &cost
	info.Time.Completed = time.Now().UnixMilli()
	if errInfo != nil {
		info.Error = errInfo
	} else {
		info.Finish = "stop"
	}
	ci := *info
	s.save()
	delete(s.running, tr.sid)
	var next chan struct{}
	if aborted := errInfo != nil && errInfo.Name == opencodewire.ErrMessageAborted; aborted {
		next = make(chan struct{})
		s.nextPrompt[tr.sid] = next
	}
	s.mu.Unlock()
	tr.t.cancel()
	if errInfo != nil {
		s.publish(opencodewire.EventSessionError, opencodewire.SessionError{SessionID: tr.sid, Error: *errInfo})
	}
	idle := func() {
		s.publish(opencodewire.EventSessionStatus, opencodewire.SessionStatus{SessionID: tr.sid, Status: opencodewire.Status{Type: "idle"}})
		s.publish(opencodewire.EventSessionIdle, opencodewire.SessionRef{SessionID: tr.sid})
	}
	if next != nil {
		// As OpenCode 1.18.17 does on an abort: the session is reported
		// idle at once, and again after the aborted message was written
		// (its late idle can follow the next prompt: held until one comes,
		// at most AbortTailLimit).
		idle()
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
	s.publish(opencodewire.EventMessageUpdated, opencodewire.MessageUpdated{SessionID: tr.sid, Info: ci})
	idle()
}
