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

func TestR2_MockModelRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "10.0.0.1:0", ":0", "example.com:80"} {
		_, err := Start(addr)
		assert.Error(t, err, addr)
	}
}

func post(t *testing.T, s *Server, input []any) []map[string]any {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "mock-model", "stream": true, "input": input})
	resp, err := http.Post(s.BaseURL()+"/responses", "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var evs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(d), &m))
			evs = append(evs, m)
		}
	}
	return evs
}

func user(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

func TestR2_MockModelRepliesBySSE(t *testing.T) {
	s, err := Start("")
	require.NoError(t, err)
	defer s.Close()

	evs := post(t, s, []any{user("<environment_context>x</environment_context>"), user("hello there")})
	require.GreaterOrEqual(t, len(evs), 4)
	assert.Equal(t, "response.created", evs[0]["type"])
	last := evs[len(evs)-1]
	assert.Equal(t, "response.completed", last["type"])
	var text string
	for _, e := range evs {
		if e["type"] == "response.output_text.delta" {
			text += e["delta"].(string)
		}
	}
	assert.Equal(t, "ECHO: hello there", text)

	evs = post(t, s, []any{user("[dyn] look")})
	item := evs[2]["item"].(map[string]any)
	assert.Equal(t, "function_call", item["type"])
	assert.Equal(t, "mock_lookup", item["name"])

	evs = post(t, s, []any{user("[dyn] look"), map[string]any{"type": "function_call_output", "call_id": "c", "output": "lookup(alpha) = 42"}})
	done := evs[len(evs)-2]["item"].(map[string]any)
	assert.Equal(t, "TOOL RESULT: lookup(alpha) = 42", done["content"].([]any)[0].(map[string]any)["text"])

	reqs := s.Requests()
	require.Len(t, reqs, 3)
	assert.Equal(t, "hello there", reqs[0].LastUserText)
	assert.Equal(t, "text:ECHO: hello there", reqs[0].Reply)
	assert.Equal(t, "call:mock_lookup", reqs[1].Reply)
	assert.Empty(t, s.Unexpected())

	resp, err := http.Get(s.BaseURL() + "/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"GET /v1/models"}, s.Unexpected())
}
