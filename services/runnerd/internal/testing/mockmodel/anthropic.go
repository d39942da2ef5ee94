package mockmodel

// The Anthropic Messages API (POST {base}/v1/messages, SSE event:/data:
// pairs), for Claude Code under claude-agent-acp (SPEC R11). The reply is
// keyed like the Responses API's, on the last user text (text blocks that
// start with "<", such as Claude Code's <system-reminder>, are skipped):
//
//	last user content is a tool_result   "TOOL RESULT: <its text>"
//	[shell] or [bash] <cmd>               tool_use of the request's bash tool (Bash) {command: <cmd> or ShellCommand}
//	[slow]                                "ECHO: <text>" in SlowChunks deltas
//	[fail]                                HTTP 500 {type:error, error:{type:api_error}}
//	anything else                         "ECHO: <text>"
//
// Claude Code's side calls are recognised by shape, not by order (SPEC
// traps in reference/opencode-acpx.md): a request without tools whose only
// message starts with "<session>" is a title request (ClaudeTitleReply); a last
// user text containing "SUGGESTION MODE" is a prompt-suggestion request
// (SuggestionReply). Neither is ever echoed into the conversation.
// POST …/messages/count_tokens is answered too (bytes / 4).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Replies to Claude Code's side calls.
const (
	ClaudeTitleReply = "Mock session"
	SuggestionReply  = "run the tests"
)

// AnthropicBaseURL is the base for ANTHROPIC_BASE_URL (no /v1: the client
// adds it).
func (s *Server) AnthropicBaseURL() string { return "http://" + s.ln.Addr().String() }

func init() {
	apis = append(apis, api{"/messages", (*Server).serveMessages}, api{"/messages/count_tokens", (*Server).serveCountTokens})
}

func (s *Server) serveCountTokens(w http.ResponseWriter, _ *http.Request, raw []byte, _ map[string]any) {
	writeJSON(w, http.StatusOK, map[string]any{"input_tokens": len(raw) / 4})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// messagesRequest is the part of a Messages request the mock reads.
type messagesRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

type contentBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"` // tool_result
}

func blocksOf(raw json.RawMessage) []contentBlock {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return []contentBlock{{Type: "text", Text: text}}
	}
	var blocks []contentBlock
	_ = json.Unmarshal(raw, &blocks)
	return blocks
}

// toolResultText is a tool_result's content as text.
func toolResultText(raw json.RawMessage) string {
	var parts []string
	for _, b := range blocksOf(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.TrimSpace(strings.Join(parts, "\n"))
}

// inspectMessages finds the last user text, whether the conversation ends
// with a tool result (and its text), and every message text in order.
func inspectMessages(req messagesRequest) (lastUser, toolOutput string, isToolOutput bool, texts []string) {
	for i, m := range req.Messages {
		var parts []string
		for _, b := range blocksOf(m.Content) {
			switch b.Type {
			case "text":
				parts = append(parts, b.Text)
				if m.Role == "user" && !strings.HasPrefix(strings.TrimSpace(b.Text), "<") {
					lastUser = b.Text
				}
			case "tool_result":
				if i == len(req.Messages)-1 {
					isToolOutput, toolOutput = true, toolResultText(b.Content)
				}
			}
		}
		texts = append(texts, m.Role+": "+strings.Join(parts, "\n"))
	}
	if n := len(req.Messages); n > 0 && req.Messages[n-1].Role != "user" {
		isToolOutput = false
	}
	return lastUser, toolOutput, isToolOutput, texts
}

// userBlocks are the user text blocks of the conversation as "user: text"
// lines (Claude Code adds context blocks to a user message; HistoryReply
// skips those starting with "<").
func userBlocks(req messagesRequest) []string {
	var out []string
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		for _, b := range blocksOf(m.Content) {
			if b.Type == "text" {
				out = append(out, "user: "+b.Text)
			}
		}
	}
	return out
}

func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request, raw []byte, body map[string]any) {
	var req messagesRequest
	if json.Unmarshal(raw, &req) != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": "body is not a Messages request"}})
		return
	}
	lastUser, toolOutput, isToolOutput, texts := inspectMessages(req)
	rec := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, InputTexts: texts}
	if !isToolOutput {
		rec.LastUserText = lastUser
	}
	setReply := s.record(rec)

	first := ""
	if len(texts) > 0 {
		first = strings.TrimPrefix(texts[0], "user: ")
	}
	var (
		text   string
		chunks []string
		delay  time.Duration
		tool   string
		input  map[string]any
	)
	switch {
	case len(req.Tools) == 0 && len(req.Messages) == 1 && strings.HasPrefix(strings.TrimSpace(first), "<session>"):
		text = ClaudeTitleReply
	case strings.Contains(lastUser, "SUGGESTION MODE") && !isToolOutput:
		text = SuggestionReply
	case isToolOutput:
		text = "TOOL RESULT: " + toolOutput
	case strings.Contains(lastUser, "[fail]"):
		setReply("failed", false)
		writeJSON(w, http.StatusInternalServerError, map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": "mock failure requested"}})
		return
	case strings.Contains(lastUser, "[shell]") || strings.Contains(lastUser, "[bash]"):
		cmd := ShellCommand
		if _, after, ok := strings.Cut(lastUser, "[bash]"); ok && strings.TrimSpace(after) != "" {
			cmd = strings.TrimSpace(after)
		}
		tool, input = "Bash", map[string]any{"command": cmd, "description": "Run the mock command"}
		for _, t := range req.Tools {
			if strings.EqualFold(t.Name, "bash") {
				tool = t.Name
			}
		}
	case strings.Contains(lastUser, "[slow]"):
		text = "ECHO: " + lastUser
		chunks, delay = SplitEven(text, SlowChunks), s.SlowChunkDelay
	case strings.Contains(lastUser, "[history]"):
		text = HistoryReply(userBlocks(req))
	default:
		text = "ECHO: " + lastUser
	}
	model := req.Model
	if model == "" {
		model = "mock-model"
	}
	msgID := s.nextID("msg")
	usage := map[string]any{"input_tokens": len(raw) / 4, "output_tokens": len(strings.Fields(text)),
		"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
	if !req.Stream {
		content := []any{map[string]any{"type": "text", "text": text}}
		stop := "end_turn"
		if tool != "" {
			content = []any{map[string]any{"type": "tool_use", "id": s.nextID("toolu"), "name": tool, "input": input}}
			stop = "tool_use"
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": msgID, "type": "message", "role": "assistant", "model": model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		setReply(replyLabel(text, tool), false)
		return
	}
	s.streamMessage(w, r, anthropicReply{msgID: msgID, model: model, usage: usage, text: text, chunks: chunks, delay: delay, tool: tool, input: input}, setReply)
}

// anthropicReply is what serveMessages answers: the message's id, model
// and usage, and either text (streamed in chunks, delay apart) or a call
// of tool with input.
type anthropicReply struct {
	msgID, model string
	usage        map[string]any
	text         string
	chunks       []string
	delay        time.Duration
	tool         string
	input        map[string]any
}

// streamMessage streams reply as Messages server-sent events.
func (s *Server) streamMessage(w http.ResponseWriter, r *http.Request, reply anthropicReply, setReply func(reply string, aborted bool)) {
	msgID, model, usage, text, chunks, delay, tool, input := reply.msgID, reply.model, reply.usage, reply.text, reply.chunks, reply.delay, reply.tool, reply.input
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, ctx: r.Context()}
	start := map[string]any{"id": msgID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": usage["input_tokens"], "output_tokens": 1,
			"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
	sse.event("message_start", map[string]any{"type": "message_start", "message": start})
	stop := "end_turn"
	if tool != "" {
		b, _ := json.Marshal(input)
		sse.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": s.nextID("toolu"), "name": tool, "input": map[string]any{}}})
		sse.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(b)}})
		stop = "tool_use"
	} else {
		sse.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
		if !sse.stream(text, chunks, delay, func(c string) {
			sse.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "text_delta", "text": c}})
		}) {
			setReply(replyLabel(text, tool), true)
			return
		}
	}
	sse.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": usage["output_tokens"]}})
	sse.event("message_stop", map[string]any{"type": "message_stop"})
	setReply(replyLabel(text, tool), sse.err != nil)
}

func replyLabel(text, tool string) string {
	if tool != "" {
		return "call:" + tool
	}
	return fmt.Sprintf("text:%s", text)
}
