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

func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, raw []byte, body map[string]any) {
	msgs, _ := body["messages"].([]any)
	rec := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	var lastRole, lastUser, toolContent string
	for _, it := range msgs {
		m, _ := it.(map[string]any)
		role, _ := m["role"].(string)
		text := messageText(m)
		lastRole = role
		switch role {
		case "user":
			lastUser = text
		case "tool":
			toolContent = text
		}
		if role != "system" {
			rec.InputTexts = append(rec.InputTexts, role+": "+text)
		}
	}
	tools, _ := body["tools"].([]any)
	sideCall := len(tools) == 0
	if lastRole != "tool" && !sideCall {
		rec.LastUserText = lastUser
	}
	setReply := s.record(rec)
	model, _ := body["model"].(string)
	id := s.nextID("chatcmpl")
	usage := func(out string) map[string]any {
		p, c := len(raw)/4, len(strings.Fields(out))
		return map[string]any{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
	}
	if !sideCall && lastRole != "tool" && strings.Contains(lastUser, "[fail]") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": "mock failure requested", "type": "invalid_request_error", "code": "mock_failure"}})
		setReply("failed", false)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, ctx: r.Context()}
	chunk := func(delta map[string]any, finish any) {
		sse.data(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
	}
	finish := func(reason, out string) {
		chunk(map[string]any{}, reason)
		sse.data(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": model,
			"choices": []any{}, "usage": usage(out)})
		sse.done()
	}
	text := func(reply string, chunks []string, delay time.Duration) {
		chunk(map[string]any{"role": "assistant", "content": ""}, nil)
		if !sse.stream(reply, chunks, delay, func(c string) { chunk(map[string]any{"content": c}, nil) }) {
			setReply("text:"+reply, true)
			return
		}
		finish("stop", reply)
		setReply("text:"+reply, sse.err != nil)
	}
	call := func(command string) {
		args, _ := json.Marshal(map[string]any{"command": command, "description": "Run the mock command"})
		chunk(map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
			"index": 0, "id": s.nextID("call"), "type": "function",
			"function": map[string]any{"name": ChatToolName, "arguments": string(args)}}}}, nil)
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
