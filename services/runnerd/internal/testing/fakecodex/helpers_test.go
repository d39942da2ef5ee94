package fakecodex

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

const waitTimeout = 10 * time.Second

// wireMsg is one line the server wrote.
type wireMsg struct {
	Raw    string
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

func (m wireMsg) isResponse() bool { return m.Method == "" && len(m.ID) > 0 }

// testClient drives a Server in process over pipes.
type testClient struct {
	t      *testing.T
	in     *io.PipeWriter
	msgs   chan wireMsg
	runErr chan error
	nextID int
	all    []wireMsg // every message received, in order
}

func fastOpts() Options {
	return Options{Stderr: io.Discard}
}

func startServer(t *testing.T, opts Options) *testClient {
	t.Helper()
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	srv, err := New(opts)
	require.NoError(t, err)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &testClient{t: t, in: inW, msgs: make(chan wireMsg, 4096), runErr: make(chan error, 1), nextID: 1}
	go func() {
		err := srv.Run(context.Background(), inR, outW)
		_ = outW.Close()
		c.runErr <- err
	}()
	go func() {
		defer close(c.msgs)
		r := bufio.NewReader(outR)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				var m wireMsg
				if jerr := json.Unmarshal(line, &m); jerr != nil {
					m = wireMsg{Raw: "UNPARSEABLE: " + string(line)}
				}
				m.Raw = strings.TrimSpace(string(line))
				c.msgs <- m
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { c.stop() })
	return c
}

// stop closes stdin and waits for Run to return; it returns Run's error.
func (c *testClient) stop() error {
	_ = c.in.Close()
	select {
	case err := <-c.runErr:
		c.runErr <- err // keep it for later calls
		for range c.msgs {
		}
		return err
	case <-time.After(waitTimeout):
		c.t.Fatalf("server did not stop after stdin EOF")
		return nil
	}
}

func (c *testClient) send(v any) {
	c.t.Helper()
	data, err := json.Marshal(v)
	require.NoError(c.t, err)
	_, err = c.in.Write(append(data, '\n'))
	require.NoError(c.t, err)
}

func (c *testClient) sendRaw(line string) {
	c.t.Helper()
	_, err := c.in.Write([]byte(line + "\n"))
	require.NoError(c.t, err)
}

func (c *testClient) request(method string, params any) int {
	c.t.Helper()
	id := c.nextID
	c.nextID++
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	c.send(msg)
	return id
}

func (c *testClient) notifyServer(method string) {
	c.send(map[string]any{"jsonrpc": "2.0", "method": method})
}

func (c *testClient) next() wireMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok {
			c.t.Fatalf("server output closed")
		}
		c.all = append(c.all, m)
		return m
	case <-time.After(waitTimeout):
		c.t.Fatalf("timed out waiting for a server message")
		return wireMsg{}
	}
}

// until reads messages until pred matches; it returns the match and the
// messages before it.
func (c *testClient) until(pred func(wireMsg) bool) (wireMsg, []wireMsg) {
	c.t.Helper()
	var before []wireMsg
	for {
		m := c.next()
		if pred(m) {
			return m, before
		}
		before = append(before, m)
	}
}

func isResponseTo(id int) func(wireMsg) bool {
	return func(m wireMsg) bool { return m.isResponse() && string(m.ID) == itoa(id) }
}

func itoa(i int) string {
	data, _ := json.Marshal(i)
	return string(data)
}

// call sends a request and waits for its response; notifications that came
// first are returned too.
func (c *testClient) call(method string, params any) (wireMsg, []wireMsg) {
	c.t.Helper()
	id := c.request(method, params)
	return c.until(isResponseTo(id))
}

// mustCall is call that requires a successful result, decoded into out.
func (c *testClient) mustCall(method string, params any, out any) []wireMsg {
	c.t.Helper()
	resp, before := c.call(method, params)
	require.Nil(c.t, resp.Error, "%s failed: %s", method, resp.Raw)
	if out != nil {
		require.NoError(c.t, json.Unmarshal(resp.Result, out), resp.Raw)
	}
	return before
}

func (c *testClient) callErr(method string, params any) string {
	c.t.Helper()
	resp, _ := c.call(method, params)
	require.NotNil(c.t, resp.Error, "%s should fail: %s", method, resp.Raw)
	require.Equal(c.t, -32600, resp.Error.Code)
	return resp.Error.Message
}

func (c *testClient) initialize() {
	c.t.Helper()
	c.mustCall("initialize", map[string]any{
		"clientInfo":   map[string]any{"name": "tether-test", "title": "tether test", "version": "0.0.1"},
		"capabilities": map[string]any{"experimentalApi": true},
	}, nil)
	c.notifyServer("initialized")
}

type threadResp struct {
	Thread struct {
		ID        string          `json:"id"`
		SessionID string          `json:"sessionId"`
		Status    json.RawMessage `json:"status"`
		Turns     []historyTurnT  `json:"turns"`
		Path      *string         `json:"path"`
	} `json:"thread"`
	Model          string         `json:"model"`
	Cwd            string         `json:"cwd"`
	ApprovalPolicy string         `json:"approvalPolicy"`
	Sandbox        map[string]any `json:"sandbox"`
}

type historyTurnT struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Items  []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Text    string `json:"text"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"items"`
	ItemsView string `json:"itemsView"`
}

func (c *testClient) startThread() string {
	c.t.Helper()
	var r threadResp
	c.mustCall("thread/start", map[string]any{
		"cwd": "/workspace", "approvalPolicy": "never", "sandbox": "read-only", "model": "mock-model",
	}, &r)
	started := c.next()
	require.Equal(c.t, "thread/started", started.Method, "thread/started must follow the response")
	return r.Thread.ID
}

func textInput(text string) []map[string]any {
	return []map[string]any{{"type": "text", "text": text}}
}

// startTurn sends turn/start and returns the turn id.
func (c *testClient) startTurn(threadID, text string) string {
	c.t.Helper()
	var r struct {
		Turn struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"turn"`
	}
	c.mustCall("turn/start", map[string]any{"threadId": threadID, "input": textInput(text)}, &r)
	require.Equal(c.t, statusInProgress, r.Turn.Status)
	return r.Turn.ID
}

// untilTurnCompleted returns the turn/completed message of turnID and every
// message before it.
func (c *testClient) untilTurnCompleted(turnID string) (turnCompleted, []wireMsg) {
	c.t.Helper()
	m, before := c.until(func(m wireMsg) bool {
		if m.Method != "turn/completed" {
			return false
		}
		var tc turnCompleted
		require.NoError(c.t, json.Unmarshal(m.Params, &tc))
		return tc.Turn.ID == turnID
	})
	var tc turnCompleted
	require.NoError(c.t, json.Unmarshal(m.Params, &tc))
	return tc, before
}

type turnCompleted struct {
	ThreadID string `json:"threadId"`
	Turn     struct {
		ID    string `json:"id"`
		Items []struct {
			Type string `json:"type"`
			ID   string `json:"id"`
			Text string `json:"text"`
		} `json:"items"`
		ItemsView string `json:"itemsView"`
		Status    string `json:"status"`
		Error     any    `json:"error"`
	} `json:"turn"`
}

type usageParams struct {
	ThreadID   string `json:"threadId"`
	TurnID     string `json:"turnId"`
	TokenUsage struct {
		Total              codexwire.TokenCounts `json:"total"`
		Last               codexwire.TokenCounts `json:"last"`
		ModelContextWindow int                   `json:"modelContextWindow"`
	} `json:"tokenUsage"`
}

func decode[T any](t *testing.T, raw json.RawMessage) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(raw, &v), string(raw))
	return v
}

// methods lists the methods of msgs, folding runs of deltas into one
// "item/agentMessage/delta*" entry.
func methods(msgs []wireMsg) []string {
	var out []string
	for _, m := range msgs {
		name := m.Method
		if name == "" {
			name = "response"
		}
		if name == "item/agentMessage/delta" {
			name += "*"
			if len(out) > 0 && out[len(out)-1] == name {
				continue
			}
		}
		out = append(out, name)
	}
	return out
}

type itemEvent struct {
	ThreadID string `json:"threadId"`
	TurnID   string `json:"turnId"`
	Item     struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Text    string `json:"text"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"item"`
}

type deltaEvent struct {
	ThreadID string `json:"threadId"`
	TurnID   string `json:"turnId"`
	ItemID   string `json:"itemId"`
	Delta    string `json:"delta"`
}

// deltasFor concatenates the deltas of one agentMessage item.
func deltasFor(t *testing.T, msgs []wireMsg, itemID string) (string, int) {
	var b strings.Builder
	n := 0
	for _, m := range msgs {
		if m.Method == "item/agentMessage/delta" {
			d := decode[deltaEvent](t, m.Params)
			if d.ItemID == itemID {
				b.WriteString(d.Delta)
				n++
			}
		}
	}
	return b.String(), n
}
