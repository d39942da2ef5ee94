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

// chat posts a streaming Chat Completions request and returns its data
// chunks (without the final [DONE], whose presence it checks).
func chat(t *testing.T, s *Server, msgs []any, tools bool) []map[string]any {
	t.Helper()
	req := map[string]any{"model": "mock-model", "stream": true, "stream_options": map[string]any{"include_usage": true}, "messages": msgs}
	if tools {
		req["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash"}}}
	}
	b, _ := json.Marshal(req)
	resp, err := http.Post(s.BaseURL()+"/chat/completions", "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []map[string]any
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(d), &m))
		out = append(out, m)
	}
	require.True(t, done, "the stream ends with [DONE]")
	return out
}

func chatText(chunks []map[string]any) (text, finish string, usage map[string]any) {
	for _, c := range chunks {
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		for _, ch := range c["choices"].([]any) {
			m := ch.(map[string]any)
			if f, ok := m["finish_reason"].(string); ok {
				finish = f
			}
			if s, ok := m["delta"].(map[string]any)["content"].(string); ok {
				text += s
			}
		}
	}
	return text, finish, usage
}

func TestR10_MockModelServesChatCompletions(t *testing.T) {
	t.Parallel()
	s, err := Start("")
	require.NoError(t, err)
	defer s.Close()
	sys := map[string]any{"role": "system", "content": "you are a mock"}
	u := func(text string) map[string]any {
		return map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": text}}}
	}

	text, finish, usage := chatText(chat(t, s, []any{sys, u("hello there")}, true))
	assert.Equal(t, "ECHO: hello there", text)
	assert.Equal(t, "stop", finish)
	assert.EqualValues(t, 3, usage["completion_tokens"])
	assert.Positive(t, usage["prompt_tokens"])

	// A tool call, then the tool's result answered as text.
	chunks := chat(t, s, []any{sys, u("[bash] echo hi")}, true)
	_, finish, _ = chatText(chunks)
	assert.Equal(t, "tool_calls", finish)
	call := chunks[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
	fn := call["function"].(map[string]any)
	assert.Equal(t, "bash", fn["name"])
	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(fn["arguments"].(string)), &args))
	assert.Equal(t, "echo hi", args["command"])
	text, _, _ = chatText(chat(t, s, []any{sys, u("[bash] echo hi"),
		map[string]any{"role": "assistant", "tool_calls": []any{call}},
		map[string]any{"role": "tool", "tool_call_id": call["id"], "content": "hi\n"}}, true))
	assert.Equal(t, "TOOL RESULT: hi", text)

	// A side call (no tools: OpenCode's title) is recognised by shape,
	// whatever the user text says.
	text, _, _ = chatText(chat(t, s, []any{sys, u("[bash] rm -rf /")}, false))
	assert.Equal(t, TitleReply, text)

	reqs := s.Requests()
	require.Len(t, reqs, 4)
	assert.Equal(t, "hello there", reqs[0].LastUserText)
	assert.Equal(t, "call:bash", reqs[1].Reply)
	assert.Equal(t, "", reqs[2].LastUserText, "a tool result is not keyed on user text")
	assert.Equal(t, "text:"+TitleReply, reqs[3].Reply)
	assert.Empty(t, s.Unexpected())

	// [fail] is an HTTP error before any stream.
	resp, err := http.Post(s.BaseURL()+"/chat/completions", "application/json",
		strings.NewReader(`{"stream":true,"tools":[{}],"messages":[{"role":"user","content":"[fail]"}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}
