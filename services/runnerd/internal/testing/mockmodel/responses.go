package mockmodel

// The OpenAI Responses API (POST {base}/responses, server-sent events) as
// codex calls it: the part of the request the mock reads, and the events
// it streams back.

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// responsesRequest is the part of a Responses request the mock reads.
type responsesRequest struct {
	// Input is a list of items; kept raw because the API also allows a
	// plain string (the mock then sees no items).
	Input json.RawMessage `json:"input"`
}

// inputItem is one item of a request's input: a message (role and
// content) or a tool output (type "*_call_output", output).
type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or a list of parts
	Output  json.RawMessage `json:"output"`  // a string or a list of parts
}

// textPart is a content part; only its text matters to the mock.
type textPart struct {
	Text *string `json:"text"`
}

// Streamed objects.
type (
	responseUsage struct {
		InputTokens         int                 `json:"input_tokens"`
		InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
		OutputTokens        int                 `json:"output_tokens"`
		OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
		TotalTokens         int                 `json:"total_tokens"`
	}
	inputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	outputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	}
	responseError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	// responseObject is the response of response.created, .completed and
	// .failed.
	responseObject struct {
		ID    string         `json:"id"`
		Usage *responseUsage `json:"usage,omitempty"`
		Error *responseError `json:"error,omitempty"`
	}
	responseEvent struct {
		Type     string         `json:"type"`
		Response responseObject `json:"response"`
	}
	// outputItemEvent is response.output_item.added or .done.
	outputItemEvent[I functionCallItem | messageItem] struct {
		Type        string `json:"type"`
		OutputIndex int    `json:"output_index"`
		Item        I      `json:"item"`
	}
	functionCallItem struct {
		Type      string `json:"type"` // function_call
		ID        string `json:"id"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON text
	}
	messageItem struct {
		Type    string           `json:"type"` // message
		Role    string           `json:"role"`
		ID      string           `json:"id"`
		Content []outputTextPart `json:"content"`
	}
	outputTextPart struct {
		Type string `json:"type"` // output_text
		Text string `json:"text"`
	}
	textDeltaEvent struct {
		Type         string `json:"type"` // response.output_text.delta
		ItemID       string `json:"item_id"`
		OutputIndex  int    `json:"output_index"`
		ContentIndex int    `json:"content_index"`
		Delta        string `json:"delta"`
	}
)

// Arguments of the function calls the mock makes.
type (
	execCommandArgs struct {
		Cmd                string `json:"cmd"`
		YieldTimeMs        int    `json:"yield_time_ms"`
		SandboxPermissions string `json:"sandbox_permissions,omitempty"`
		Justification      string `json:"justification,omitempty"`
	}
	lookupArgs struct {
		Key string `json:"key"`
	}
	askArgs struct {
		Questions []askQuestion `json:"questions"`
	}
	askQuestion struct {
		ID       string      `json:"id"`
		Header   string      `json:"header"`
		Question string      `json:"question"`
		Options  []askOption `json:"options"`
	}
	askOption struct {
		Label       string `json:"label"`
		Description string `json:"description"`
	}
	planArgs struct {
		Explanation string     `json:"explanation"`
		Plan        []planStep `json:"plan"`
	}
	planStep struct {
		Step   string `json:"step"`
		Status string `json:"status"`
	}
)

// askColorArgs is the request_user_input call of an [ask] prompt.
func askColorArgs() askArgs {
	return askArgs{Questions: []askQuestion{{
		ID: "color", Header: "Color", Question: "Which color should I use?",
		Options: []askOption{{Label: "red", Description: "a warm color"}, {Label: "blue", Description: "a cold color"}},
	}}}
}

// planCallArgs is the update_plan call of a [plan] prompt: PlanSteps, the
// first in progress.
func planCallArgs() planArgs {
	steps := make([]planStep, len(PlanSteps))
	for i, st := range PlanSteps {
		steps[i] = planStep{Step: st, Status: "pending"}
	}
	steps[0].Status = "in_progress"
	return planArgs{Explanation: PlanExplanation, Plan: steps}
}

// serveResponses implements the Responses endpoint.
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request, raw []byte) {
	rec := newRequest(r, raw)
	lastUser, toolOutput, isToolOutput, texts := inspectInput(raw)
	rec.InputTexts = texts
	if !isToolOutput {
		rec.LastUserText = lastUser
	}
	setReply := s.record(rec)

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, ctx: r.Context()}
	respID := s.nextID("resp")
	sse.event("response.created", responseEvent{Type: "response.created", Response: responseObject{ID: respID}})
	completed := func(out string) {
		in, words := len(raw)/4, len(strings.Fields(out))
		sse.event("response.completed", responseEvent{Type: "response.completed", Response: responseObject{ID: respID,
			Usage: &responseUsage{InputTokens: in, OutputTokens: words, TotalTokens: in + words}}})
	}
	call := func(name string, args any) {
		b, _ := json.Marshal(args)
		item := functionCallItem{Type: "function_call", ID: s.nextID("fc"), CallID: s.nextID("call"), Name: name, Arguments: string(b)}
		sse.event("response.output_item.added", outputItemEvent[functionCallItem]{Type: "response.output_item.added", Item: item})
		sse.event("response.output_item.done", outputItemEvent[functionCallItem]{Type: "response.output_item.done", Item: item})
		completed("")
		setReply("call:"+name, sse.err != nil)
	}

	switch {
	case isToolOutput:
		s.streamText(sse, "TOOL RESULT: "+toolOutput, nil, 0, completed, setReply)
	case strings.Contains(lastUser, "[fail]"):
		sse.event("response.failed", responseEvent{Type: "response.failed", Response: responseObject{ID: respID,
			Error: &responseError{Code: "server_error", Message: "mock failure requested"}}})
		setReply("failed", sse.err != nil)
	case strings.Contains(lastUser, "[escalate]"):
		call("exec_command", execCommandArgs{Cmd: ShellCommand, YieldTimeMs: 5000,
			SandboxPermissions: "require_escalated", Justification: "the mock asks to run outside the sandbox"})
	case strings.Contains(lastUser, "[shell]"):
		call("exec_command", execCommandArgs{Cmd: ShellCommand, YieldTimeMs: 5000})
	case strings.Contains(lastUser, "[dyn]"):
		call("mock_lookup", lookupArgs{Key: "alpha"})
	case strings.Contains(lastUser, "[ask]"):
		call("request_user_input", askColorArgs())
	case strings.Contains(lastUser, "[plan]"):
		call("update_plan", planCallArgs())
	case strings.Contains(lastUser, "[slow]"):
		text := "ECHO: " + lastUser
		s.streamText(sse, text, SplitEven(text, SlowChunks), s.SlowChunkDelay, completed, setReply)
	case strings.Contains(lastUser, "[history]"):
		s.streamText(sse, HistoryReply(texts), nil, 0, completed, setReply)
	default:
		s.streamText(sse, "ECHO: "+lastUser, nil, 0, completed, setReply)
	}
}

func (s *Server) streamText(sse *sseWriter, text string, chunks []string, delay time.Duration, completed func(string), setReply func(string, bool)) {
	msgID := s.nextID("msg")
	sse.event("response.output_item.added", outputItemEvent[messageItem]{Type: "response.output_item.added",
		Item: messageItem{Type: "message", Role: "assistant", ID: msgID, Content: []outputTextPart{}}})
	if !sse.stream(text, chunks, delay, func(c string) {
		sse.event("response.output_text.delta", textDeltaEvent{Type: "response.output_text.delta", ItemID: msgID, Delta: c})
	}) {
		setReply("text:"+text, true)
		return
	}
	sse.event("response.output_item.done", outputItemEvent[messageItem]{Type: "response.output_item.done",
		Item: messageItem{Type: "message", Role: "assistant", ID: msgID, Content: []outputTextPart{{Type: "output_text", Text: text}}}})
	completed(text)
	setReply("text:"+text, sse.err != nil)
}

// inspectInput finds the last user text (skipping "<…>" context messages),
// whether the input ends with a tool output (and its text), and every
// message text in order.
func inspectInput(raw []byte) (lastUser, toolOutput string, isToolOutput bool, texts []string) {
	var req responsesRequest
	var items []inputItem
	if json.Unmarshal(raw, &req) == nil {
		_ = json.Unmarshal(req.Input, &items)
	}
	for i, it := range items {
		if strings.HasSuffix(it.Type, "_call_output") {
			if i == len(items)-1 {
				isToolOutput = true
				toolOutput = toolOutputText(it.Output)
			}
			continue
		}
		if it.Type != "message" && it.Type != "" {
			continue
		}
		text, _ := partsText(it.Content)
		texts = append(texts, it.Role+": "+text)
		if it.Role == "user" && !strings.HasPrefix(strings.TrimSpace(text), "<") {
			lastUser = text
		}
	}
	return lastUser, toolOutput, isToolOutput, texts
}

// partsText is the text of a content that is a string or a list of parts
// (their texts joined by newlines); ok is false for anything else.
func partsText(raw json.RawMessage) (text string, ok bool) {
	if json.Unmarshal(raw, &text) == nil {
		return text, true
	}
	var parts []textPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", false
	}
	var texts []string
	for _, p := range parts {
		if p.Text != nil {
			texts = append(texts, *p.Text)
		}
	}
	return strings.Join(texts, "\n"), true
}

// toolOutputText is the text a tool output carries: for exec_command the
// part after "Output:\n".
func toolOutputText(raw json.RawMessage) string {
	s, ok := partsText(raw)
	if !ok {
		s = string(raw)
	}
	if i := strings.Index(s, "Output:\n"); i >= 0 {
		s = s[i+len("Output:\n"):]
	}
	return strings.TrimSpace(s)
}
