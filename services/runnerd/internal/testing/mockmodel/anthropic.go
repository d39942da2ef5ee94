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

func (s *Server) serveCountTokens(w http.ResponseWriter, _ *http.Request, raw []byte) {
	writeJSON(w, http.StatusOK, countTokensResponse{InputTokens: len(raw) / 4})
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

// Answered objects and streamed events.
type (
	countTokensResponse struct {
		InputTokens int `json:"input_tokens"`
	}
	anthropicErrorBody struct {
		Type  string         `json:"type"` // error
		Error anthropicError `json:"error"`
	}
	anthropicError struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	anthropicUsage struct {
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	}
	// message is a Messages response, and the message of message_start.
	message struct {
		ID           string         `json:"id"`
		Type         string         `json:"type"` // message
		Role         string         `json:"role"`
		Model        string         `json:"model"`
		Content      []outputBlock  `json:"content"`
		StopReason   *string        `json:"stop_reason"`
		StopSequence *string        `json:"stop_sequence"`
		Usage        anthropicUsage `json:"usage"`
	}
	// outputBlock is a text block (Text) or a tool_use block (ID, Name,
	// Input: the tool's own arguments).
	outputBlock struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text,omitempty"`
		ID    string          `json:"id,omitempty"`
		Name  string          `json:"name,omitempty"`
		Input json.RawMessage `json:"input,omitempty"`
	}
	messageStartEvent struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}
	blockStartEvent struct {
		Type         string      `json:"type"` // content_block_start
		Index        int         `json:"index"`
		ContentBlock outputBlock `json:"content_block"`
	}
	blockDeltaEvent[D textDelta | inputJSONDelta] struct {
		Type  string `json:"type"` // content_block_delta
		Index int    `json:"index"`
		Delta D      `json:"delta"`
	}
	textDelta struct {
		Type string `json:"type"` // text_delta
		Text string `json:"text"`
	}
	inputJSONDelta struct {
		Type        string `json:"type"` // input_json_delta
		PartialJSON string `json:"partial_json"`
	}
	blockStopEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	messageDeltaEvent struct {
		Type  string            `json:"type"`
		Delta messageDelta      `json:"delta"`
		Usage outputTokensUsage `json:"usage"`
	}
	messageDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	outputTokensUsage struct {
		OutputTokens int `json:"output_tokens"`
	}
	typeOnly struct {
		Type string `json:"type"`
	}
)

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

func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request, raw []byte) {
	var req messagesRequest
	if json.Unmarshal(raw, &req) != nil {
		writeJSON(w, http.StatusBadRequest, anthropicErrorBody{Type: "error", Error: anthropicError{Type: "invalid_request_error", Message: "body is not a Messages request"}})
		return
	}
	lastUser, toolOutput, isToolOutput, texts := inspectMessages(req)
	rec := newRequest(r, raw)
	rec.InputTexts = texts
	if !isToolOutput {
		rec.LastUserText = lastUser
	}
	setReply := s.record(rec)

	first := ""
	if len(texts) > 0 {
		first = strings.TrimPrefix(texts[0], "user: ")
	}
	reply := anthropicReply{}
	switch {
	case len(req.Tools) == 0 && len(req.Messages) == 1 && strings.HasPrefix(strings.TrimSpace(first), "<session>"):
		reply.text = ClaudeTitleReply
	case strings.Contains(lastUser, "SUGGESTION MODE") && !isToolOutput:
		reply.text = SuggestionReply
	case isToolOutput:
		reply.text = "TOOL RESULT: " + toolOutput
	case strings.Contains(lastUser, "[fail]"):
		setReply("failed", false)
		writeJSON(w, http.StatusInternalServerError, anthropicErrorBody{Type: "error", Error: anthropicError{Type: "api_error", Message: "mock failure requested"}})
		return
	case strings.Contains(lastUser, "[shell]") || strings.Contains(lastUser, "[bash]"):
		cmd := ShellCommand
		if _, after, ok := strings.Cut(lastUser, "[bash]"); ok && strings.TrimSpace(after) != "" {
			cmd = strings.TrimSpace(after)
		}
		reply.tool = "Bash"
		reply.input, _ = json.Marshal(bashArgs{Command: cmd, Description: "Run the mock command"})
		for _, t := range req.Tools {
			if strings.EqualFold(t.Name, "bash") {
				reply.tool = t.Name
			}
		}
	case strings.Contains(lastUser, "[slow]"):
		reply.text = "ECHO: " + lastUser
		reply.chunks, reply.delay = SplitEven(reply.text, SlowChunks), s.SlowChunkDelay
	case strings.Contains(lastUser, "[history]"):
		reply.text = HistoryReply(userBlocks(req))
	default:
		reply.text = "ECHO: " + lastUser
	}
	reply.model = req.Model
	if reply.model == "" {
		reply.model = "mock-model"
	}
	reply.msgID = s.nextID("msg")
	reply.usage = anthropicUsage{InputTokens: len(raw) / 4, OutputTokens: len(strings.Fields(reply.text))}
	if !req.Stream {
		msg := message{ID: reply.msgID, Type: "message", Role: "assistant", Model: reply.model,
			Content: []outputBlock{{Type: "text", Text: &reply.text}}, StopReason: ptr("end_turn"), Usage: reply.usage}
		if reply.tool != "" {
			msg.Content = []outputBlock{{Type: "tool_use", ID: s.nextID("toolu"), Name: reply.tool, Input: reply.input}}
			msg.StopReason = ptr("tool_use")
		}
		writeJSON(w, http.StatusOK, msg)
		setReply(replyLabel(reply.text, reply.tool), false)
		return
	}
	s.streamMessage(w, r, reply, setReply)
}

func ptr[T any](v T) *T { return &v }

// anthropicReply is what serveMessages answers: the message's id, model
// and usage, and either text (streamed in chunks, delay apart) or a call
// of tool with input.
type anthropicReply struct {
	msgID, model string
	usage        anthropicUsage
	text         string
	chunks       []string
	delay        time.Duration
	tool         string
	input        json.RawMessage
}

// streamMessage streams reply as Messages server-sent events.
func (s *Server) streamMessage(w http.ResponseWriter, r *http.Request, reply anthropicReply, setReply func(reply string, aborted bool)) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, ctx: r.Context()}
	sse.event("message_start", messageStartEvent{Type: "message_start", Message: message{ID: reply.msgID, Type: "message",
		Role: "assistant", Model: reply.model, Content: []outputBlock{}, Usage: anthropicUsage{InputTokens: reply.usage.InputTokens, OutputTokens: 1}}})
	stop := "end_turn"
	if reply.tool != "" {
		sse.event("content_block_start", blockStartEvent{Type: "content_block_start",
			ContentBlock: outputBlock{Type: "tool_use", ID: s.nextID("toolu"), Name: reply.tool, Input: json.RawMessage("{}")}})
		sse.event("content_block_delta", blockDeltaEvent[inputJSONDelta]{Type: "content_block_delta",
			Delta: inputJSONDelta{Type: "input_json_delta", PartialJSON: string(reply.input)}})
		stop = "tool_use"
	} else {
		sse.event("content_block_start", blockStartEvent{Type: "content_block_start", ContentBlock: outputBlock{Type: "text", Text: ptr("")}})
		if !sse.stream(reply.text, reply.chunks, reply.delay, func(c string) {
			sse.event("content_block_delta", blockDeltaEvent[textDelta]{Type: "content_block_delta", Delta: textDelta{Type: "text_delta", Text: c}})
		}) {
			setReply(replyLabel(reply.text, reply.tool), true)
			return
		}
	}
	sse.event("content_block_stop", blockStopEvent{Type: "content_block_stop"})
	sse.event("message_delta", messageDeltaEvent{Type: "message_delta", Delta: messageDelta{StopReason: stop},
		Usage: outputTokensUsage{OutputTokens: reply.usage.OutputTokens}})
	sse.event("message_stop", typeOnly{Type: "message_stop"})
	setReply(replyLabel(reply.text, reply.tool), sse.err != nil)
}

func replyLabel(text, tool string) string {
	if tool != "" {
		return "call:" + tool
	}
	return fmt.Sprintf("text:%s", text)
}
