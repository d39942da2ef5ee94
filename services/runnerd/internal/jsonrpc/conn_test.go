package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type codeErr struct{ code, msg string }

func (e *codeErr) Error() string { return e.code + ": " + e.msg }

// peer is the other end of a Conn: it reads our lines and writes its own.
type peer struct {
	t     *testing.T
	conn  *Conn
	lines *bufio.Scanner // what the Conn wrote
	out   *os.File       // what the peer writes (the Conn's stdout)
	in    *os.File       // the Conn's stdin (write side)

	mu       sync.Mutex
	notified []string
	requests []Message
	served   chan [2]error
}

func newPeer(t *testing.T, mod func(*Config)) *peer {
	t.Helper()
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	p := &peer{t: t, lines: bufio.NewScanner(inR), out: outW, in: inW, served: make(chan [2]error, 1)}
	cfg := Config{
		Name: "test", Peer: "agent", In: inW, WriteTimeout: 5 * time.Second,
		NewError: func(code, msg string) error { return &codeErr{code, msg} },
		OnNotification: func(method string, _ json.RawMessage) {
			p.mu.Lock()
			p.notified = append(p.notified, method)
			p.mu.Unlock()
		},
		OnRequest: func(m Message) {
			p.mu.Lock()
			p.requests = append(p.requests, m)
			p.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	p.conn = New(cfg)
	go func() {
		fatal, rerr := p.conn.Serve(outR)
		p.served <- [2]error{fatal, rerr}
	}()
	t.Cleanup(func() { outW.Close(); inR.Close(); inW.Close() })
	return p
}

func (p *peer) read() map[string]any {
	p.t.Helper()
	require.True(p.t, p.lines.Scan())
	var m map[string]any
	require.NoError(p.t, json.Unmarshal(p.lines.Bytes(), &m))
	return m
}

func (p *peer) write(line string) {
	p.t.Helper()
	_, err := io.WriteString(p.out, line+"\n")
	require.NoError(p.t, err)
}

func TestConnCallsAndAnswersInOrder(t *testing.T) {
	t.Parallel()
	p := newPeer(t, nil)
	type res struct {
		raw    json.RawMessage
		rpcErr *Error
		err    error
	}
	done := make(chan res, 2)
	var settled []string
	go func() {
		raw, rpcErr, err := p.conn.Call(context.Background(), "a", map[string]any{"x": 1}, 5*time.Second,
			func(r *Reply) { settled = append(settled, "a:"+string(r.Result)) })
		done <- res{raw, rpcErr, err}
	}()
	req := p.read()
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": 1.0, "method": "a", "params": map[string]any{"x": 1.0}}, req)
	// The answer's hook runs before the notification that follows it.
	p.write(`{"jsonrpc":"2.0","method":"n1"}`)
	p.write(`{"jsonrpc":"2.0","id":1,"result":{"ok":true}}`)
	p.write(`{"jsonrpc":"2.0","id":"s1","method":"ask","params":{"q":1}}`)
	r := <-done
	require.NoError(t, r.err)
	assert.Nil(t, r.rpcErr)
	assert.JSONEq(t, `{"ok":true}`, string(r.raw))
	assert.Equal(t, []string{`a:{"ok":true}`}, settled)

	go func() {
		raw, rpcErr, err := p.conn.Call(context.Background(), "b", nil, 5*time.Second, nil)
		done <- res{raw, rpcErr, err}
	}()
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": 2.0, "method": "b"}, p.read())
	p.write(`{"id":2,"error":{"code":-32601,"message":"no such method"}}`)
	r = <-done
	require.NoError(t, r.err)
	assert.Equal(t, &Error{Code: -32601, Message: "no such method"}, r.rpcErr)

	p.mu.Lock()
	assert.Equal(t, []string{"n1"}, p.notified)
	require.Len(t, p.requests, 1)
	assert.Equal(t, "ask", p.requests[0].Method)
	id := p.requests[0].ID
	p.mu.Unlock()
	require.NoError(t, p.conn.Respond(id, map[string]any{"outcome": "ok"}))
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": "s1", "result": map[string]any{"outcome": "ok"}}, p.read())
	require.NoError(t, p.conn.RespondError(id, -32600, "dup"))
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": "s1", "error": map[string]any{"code": -32600.0, "message": "dup"}}, p.read())
	require.NoError(t, p.conn.Notify("bye", nil))
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "method": "bye"}, p.read())

	p.out.Close()
	assert.Equal(t, [2]error{nil, nil}, <-p.served, "EOF ends Serve without an error")
}

func TestConnTimeoutAbandonsTheCall(t *testing.T) {
	t.Parallel()
	p := newPeer(t, nil)
	_, _, err := p.conn.Call(context.Background(), "slow", nil, 20*time.Millisecond, nil)
	var ce *codeErr
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, &codeErr{"provider_request_timeout", "slow: no response within 20ms"}, ce)
	p.read()
	// The late answer is dropped; the next call gets its own.
	p.write(`{"id":1,"result":1}`)
	go func() { p.read(); p.write(`{"id":2,"result":2}`) }()
	raw, _, err := p.conn.Call(context.Background(), "next", nil, 5*time.Second, nil)
	require.NoError(t, err)
	assert.Equal(t, "2", string(raw))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = p.conn.Call(ctx, "gone", nil, time.Second, nil)
	assert.ErrorIs(t, err, context.Canceled)
	assert.EqualError(t, err, "test: gone: context canceled")
}

func TestConnFailFailsPendingAndLaterCalls(t *testing.T) {
	t.Parallel()
	p := newPeer(t, nil)
	var hooked []error
	call, err := p.conn.Send("prompt", nil, func(r *Reply) { hooked = append(hooked, r.Err) })
	require.NoError(t, err)
	p.read()
	lost := errors.New("lost")
	p.conn.Fail(lost)
	p.conn.Fail(errors.New("second"))
	_, _, err = p.conn.Wait(context.Background(), call, time.Second)
	assert.Equal(t, lost, err)
	assert.Equal(t, []error{lost}, hooked, "the hook learns of the failure")
	_, _, err = p.conn.Call(context.Background(), "after", nil, time.Second, nil)
	assert.Equal(t, lost, err)
	assert.Equal(t, lost, p.conn.Notify("n", nil))
	assert.Equal(t, lost, p.conn.Err())
}

func TestConnFatalFrames(t *testing.T) {
	t.Parallel()
	p := newPeer(t, nil)
	p.write(`not json`)
	got := <-p.served
	assert.Equal(t, &codeErr{"provider_transport_failed", "malformed JSON-RPC frame on agent stdout: not a JSON object"}, got[0])

	var lines []bool
	p = newPeer(t, func(c *Config) {
		c.LineStart = func() { lines = append(lines, false) }
		c.LineDone = func(answer bool) { lines = append(lines, answer) }
	})
	go func() {
		_, _ = p.out.Write([]byte("\n\r\n{\"id\":9}\n"))
		big := make([]byte, MaxFrameBytes+64<<10+2) // past the bound by more than the reader's buffer
		for i := range big {
			big[i] = 'a'
		}
		_, _ = p.out.Write(big)
	}()
	got = <-p.served
	assert.Equal(t, &codeErr{"provider_frame_too_large", "agent stdout frame exceeded 4194304 bytes"}, got[0])
	assert.Equal(t, []bool{false, true}, lines, "blank lines are skipped; an id-only line is an answer")
}

func TestConnWriteErrors(t *testing.T) {
	t.Parallel()
	p := newPeer(t, nil)
	p.in.Close()
	err := p.conn.Notify("n", nil)
	var ce *codeErr
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "provider_transport_failed", ce.code)
	assert.Equal(t, err, p.conn.Err(), "by default a failed write fails the connection")

	var broken error
	p = newPeer(t, func(c *Config) {
		c.OnWriteError = func(err error) error { broken = err; return errors.New("decided") }
		c.CheckWrite = func() error { return nil }
	})
	p.in.Close()
	assert.EqualError(t, p.conn.Notify("n", nil), "decided")
	assert.Error(t, broken)
	assert.NoError(t, p.conn.Err(), "OnWriteError decides instead")

	p = newPeer(t, func(c *Config) { c.CheckWrite = func() error { return errors.New("stdin closed") } })
	assert.EqualError(t, p.conn.Notify("n", nil), "stdin closed")
	_, err = p.conn.Send("m", func() {}, nil)
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "provider_protocol_error", ce.code, "an unencodable request is a protocol error")
}
