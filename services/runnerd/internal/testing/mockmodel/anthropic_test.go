package mockmodel

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// postMessages sends a streaming Messages request and returns the SSE
// events as (event name, data) pairs.
func postMessages(t *testing.T, s *Server, body map[string]any) (names []string, datas []map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(s.AnthropicBaseURL()+"/v1/messages?beta=true", "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			names = append(names, n)
		}
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(d), &m))
			datas = append(datas, m)
		}
	}
	return names, datas
}

func streamedText(datas []map[string]any) string {
	var text string
	for _, d := range datas {
		if delta, ok := d["delta"].(map[string]any); ok && delta["type"] == "text_delta" {
			text += delta["text"].(string)
		}
	}
	return text
}

func msg(role string, content any) map[string]any {
	return map[string]any{"role": role, "content": content}
}

var bashTool = []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}, map[string]any{"name": "Read"}}

func TestR11_MockModelServesAnthropicMessages(t *testing.T) {
	t.Parallel()
	s, err := Start("")
	require.NoError(t, err)
	defer s.Close()

	// Plain echo; <system-reminder> blocks are skipped.
	names, datas := postMessages(t, s, map[string]any{"model": "claude-x", "stream": true, "tools": bashTool, "messages": []any{
		msg("user", []any{map[string]any{"type": "text", "text": "<system-reminder>x</system-reminder>"}, map[string]any{"type": "text", "text": "hello there"}}),
	}})
	assert.Equal(t, "message_start", names[0])
	assert.Equal(t, "message_stop", names[len(names)-1])
	assert.Equal(t, "ECHO: hello there", streamedText(datas))
	var stop any
	for _, d := range datas {
		if d["type"] == "message_delta" {
			stop = d["delta"].(map[string]any)["stop_reason"]
		}
	}
	assert.Equal(t, "end_turn", stop)

	// [shell] calls the request's Bash tool; its result is answered.
	_, datas = postMessages(t, s, map[string]any{"stream": true, "tools": bashTool, "messages": []any{msg("user", "do it [shell]")}})
	var toolName, partial string
	for _, d := range datas {
		if cb, ok := d["content_block"].(map[string]any); ok && cb["type"] == "tool_use" {
			toolName = cb["name"].(string)
		}
		if delta, ok := d["delta"].(map[string]any); ok && delta["type"] == "input_json_delta" {
			partial += delta["partial_json"].(string)
		}
	}
	assert.Equal(t, "Bash", toolName)
	assert.JSONEq(t, `{"command":"`+ShellCommand+`","description":"Run the mock command"}`, partial)
	_, datas = postMessages(t, s, map[string]any{"stream": true, "tools": bashTool, "messages": []any{
		msg("user", "do it [shell]"),
		msg("assistant", []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": map[string]any{}}}),
		msg("user", []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello-from-mock-shell"}}),
	}})
	assert.Equal(t, "TOOL RESULT: hello-from-mock-shell", streamedText(datas))

	// Claude Code's side calls are recognised by shape.
	_, datas = postMessages(t, s, map[string]any{"stream": true, "messages": []any{msg("user", "<session>hello there</session> give a title")}})
	assert.Equal(t, ClaudeTitleReply, streamedText(datas))
	_, datas = postMessages(t, s, map[string]any{"stream": true, "tools": bashTool, "messages": []any{
		msg("user", "hello there"), msg("assistant", "ECHO: hello there"), msg("user", "[SUGGESTION MODE: suggest what the user might type next]"),
	}})
	assert.Equal(t, SuggestionReply, streamedText(datas))

	// Non-streaming, [fail], and the auxiliary endpoints.
	b, _ := json.Marshal(map[string]any{"messages": []any{msg("user", "plain")}})
	resp, err := http.Post(s.AnthropicBaseURL()+"/v1/messages", "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	resp.Body.Close()
	assert.Equal(t, "ECHO: plain", m["content"].([]any)[0].(map[string]any)["text"])
	b, _ = json.Marshal(map[string]any{"stream": true, "messages": []any{msg("user", "[fail]")}})
	resp, err = http.Post(s.AnthropicBaseURL()+"/v1/messages", "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	resp, err = http.Post(s.AnthropicBaseURL()+"/v1/messages/count_tokens", "application/json", strings.NewReader(`{"messages":[]}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	assert.Empty(t, s.Unexpected())
	reqs := s.Requests()
	require.Len(t, reqs, 7)
	assert.Equal(t, "hello there", reqs[0].LastUserText)
	assert.Equal(t, "call:Bash", reqs[1].Reply)
	assert.Equal(t, "", reqs[2].LastUserText, "a tool result is not a user text")
}
