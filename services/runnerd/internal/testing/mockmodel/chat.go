package mockmodel

// The OpenAI Chat Completions API (POST {base}/chat/completions), as the
// OpenAI-compatible provider of OpenCode calls it: stream:true with
// stream_options.include_usage, SSE "data:" chunks, then "data: [DONE]".
//
// The reply is keyed on the messages (see chatReply):
//
//	no tools offered                     a side call (OpenCode's session title or summary): "Mock title"
//	last message has role "tool"         "TOOL RESULT: <its content>"
//	last user text contains [fail]       HTTP 400 {"error":{…}} (no stream)
//	[bash] <command>                     tool call bash {command, description}
//	[shell]                              tool call bash {command: ShellCommand, description}
//	[slow]                               "ECHO: <text>" in 12 deltas, SlowChunkDelay apart
//	[history]                            HistoryReply: "HISTORY: <earlier user texts joined by " | ">"
//	anything else                        "ECHO: <text>", one delta per word
//
// Usage (the last chunk, choices empty): prompt_tokens = body bytes / 4,
// completion_tokens = words of the reply.

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// TitleReply is the answer to a side call offered no tools.
const TitleReply = "Mock title"

// ChatToolName is the tool [bash] and [shell] call (OpenCode's shell tool).
const ChatToolName = "bash"

func init() { apis = append(apis, api{"/chat/completions", (*Server).serveChat}) }

// chatRequest is the part of a Chat Completions request the mock reads.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"` // a string, a list of parts or null
	} `json:"messages"`
	Tools []json.RawMessage `json:"tools"` // only counted
}

// Streamed chunks and the error body.
type (
	chatChunk struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"` // chat.completion.chunk
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		Usage   *chatUsage   `json:"usage,omitempty"` // the last chunk only
	}
	chatChoice struct {
		Index        int       `json:"index"`
		Delta        chatDelta `json:"delta"`
		FinishReason *string   `json:"finish_reason"`
	}
	chatDelta struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content,omitempty"`
		ToolCalls []chatToolCall `json:"tool_calls,omitempty"`
	}
	chatToolCall struct {
		Index    int          `json:"index"`
		ID       string       `json:"id"`
		Type     string       `json:"type"` // function
		Function chatFunction `json:"function"`
	}
	chatFunction struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON text
	}
	chatUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	chatErrorBody struct {
		Error chatError `json:"error"`
	}
	chatError struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	// bashArgs are the arguments of a call of OpenCode's (and Claude
	// Code's) shell tool.
	bashArgs struct {
		Command     string `json:"command"`
		Description string `json:"description"`
	}
)

func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, raw []byte) {
	var req chatRequest
	_ = json.Unmarshal(raw, &req) // what does not decode stays empty
	rec := newRequest(r, raw)
	var lastRole, lastUser, toolContent string
	for _, m := range req.Messages {
		text, _ := partsText(m.Content)
		lastRole = m.Role
		switch m.Role {
		case "user":
			lastUser = text
		case "tool":
			toolContent = text
		}
		if m.Role != "system" {
			rec.InputTexts = append(rec.InputTexts, m.Role+": "+text)
		}
	}
	sideCall := len(req.Tools) == 0
	if lastRole != "tool" && !sideCall {
		rec.LastUserText = lastUser
	}
	setReply := s.record(rec)
	id := s.nextID("chatcmpl")
	if !sideCall && lastRole != "tool" && strings.Contains(lastUser, "[fail]") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(chatErrorBody{Error: chatError{
			Message: "mock failure requested", Type: "invalid_request_error", Code: "mock_failure"}})
		setReply("failed", false)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, ctx: r.Context()}
	chunk := func(delta chatDelta, finish *string) {
		sse.data(chatChunk{ID: id, Object: "chat.completion.chunk", Created: 1700000000, Model: req.Model,
			Choices: []chatChoice{{Delta: delta, FinishReason: finish}}})
	}
	finish := func(reason, out string) {
		chunk(chatDelta{}, &reason)
		p, c := len(raw)/4, len(strings.Fields(out))
		sse.data(chatChunk{ID: id, Object: "chat.completion.chunk", Created: 1700000000, Model: req.Model,
			Choices: []chatChoice{}, Usage: &chatUsage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}})
		sse.done()
	}
	text := func(reply string, chunks []string, delay time.Duration) {
		empty := ""
		chunk(chatDelta{Role: "assistant", Content: &empty}, nil)
		if !sse.stream(reply, chunks, delay, func(c string) { chunk(chatDelta{Content: &c}, nil) }) {
			setReply("text:"+reply, true)
			return
		}
		finish("stop", reply)
		setReply("text:"+reply, sse.err != nil)
	}
	call := func(command string) {
		args, _ := json.Marshal(bashArgs{Command: command, Description: "Run the mock command"})
		chunk(chatDelta{Role: "assistant", ToolCalls: []chatToolCall{{ID: s.nextID("call"), Type: "function",
			Function: chatFunction{Name: ChatToolName, Arguments: string(args)}}}}, nil)
		finish("tool_calls", "")
		setReply("call:"+ChatToolName, sse.err != nil)
	}
	switch {
	case sideCall:
		text(TitleReply, nil, 0)
	case lastRole == "tool":
		text("TOOL RESULT: "+strings.TrimSpace(toolContent), nil, 0)
	case strings.Contains(lastUser, "[bash]"):
		_, cmd, _ := strings.Cut(lastUser, "[bash]")
		call(strings.TrimSpace(cmd))
	case strings.Contains(lastUser, "[shell]"):
		call(ShellCommand)
	case strings.Contains(lastUser, "[slow]"):
		reply := "ECHO: " + lastUser
		text(reply, SplitEven(reply, SlowChunks), s.SlowChunkDelay)
	case strings.Contains(lastUser, "[history]"):
		text(HistoryReply(rec.InputTexts), nil, 0)
	default:
		text("ECHO: "+lastUser, nil, 0)
	}
}

// data writes one "data:" chunk (Chat Completions SSE has no event names).
func (e *sseWriter) data(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	e.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// done ends a Chat Completions stream.
func (e *sseWriter) done() {
	if e.err == nil {
		e.write([]byte("data: [DONE]\n\n"))
	}
}
