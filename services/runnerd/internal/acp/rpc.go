package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/telemetry"
)

// MaxFrameBytes bounds one JSON-RPC line from the agent; a longer one
// fails the session with provider_frame_too_large.
const MaxFrameBytes = 4 << 20

// frame is any JSON-RPC message. Presence of id, method, result and error
// routes it, so they stay raw.
type frame struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *wireError      `json:"error,omitempty"`
}

type wireError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *wireError) String() string { return fmt.Sprintf("%s (JSON-RPC %d)", e.Message, e.Code) }

// reply is what a pending call receives.
type reply struct {
	result json.RawMessage
	rpcErr *wireError
	err    error
}

type pending struct {
	method string
	ch     chan reply // buffered(1)
	// onReply runs on the reader goroutine before any later frame is
	// handled, so what it settles (the end of a load, of a turn) is in
	// place for the frames that follow.
	onReply func(reply)
}

// conn is the JSON-RPC connection over the agent's stdio: requests out,
// their responses, and the agent's notifications and requests in (handed to
// the handlers on the one reader goroutine, in order).
type conn struct {
	in  *os.File // the agent's stdin
	out *os.File // the agent's stdout

	writeMu        sync.Mutex
	requestTimeout time.Duration

	mu      sync.Mutex
	nextID  int64
	calls   map[int64]*pending
	failErr error // set once the connection is dead; pending calls get it

	onNotify  func(method string, params json.RawMessage)
	onRequest func(id json.RawMessage, method string, params json.RawMessage)
}

// readLoop reads frames until EOF or a fatal error, which it returns.
func (c *conn) readLoop() error {
	br := bufio.NewReaderSize(c.out, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			if len(line) > MaxFrameBytes {
				return &Error{Code: failure.ProviderFrameTooLarge, Message: fmt.Sprintf("agent stdout frame exceeded %d bytes", MaxFrameBytes)}
			}
			continue
		}
		if t := bytes.TrimSpace(line); len(t) > 0 {
			if len(t) > MaxFrameBytes {
				return &Error{Code: failure.ProviderFrameTooLarge, Message: fmt.Sprintf("agent stdout frame exceeded %d bytes", MaxFrameBytes)}
			}
			if ferr := c.dispatch(t); ferr != nil {
				return ferr
			}
		}
		line = line[:0]
		if cap(line) > 256<<10 {
			line = nil
		}
		if err != nil {
			return nil // EOF or a read error: the supervisor decides
		}
	}
}

func (c *conn) dispatch(b []byte) error {
	var f frame
	if b[0] != '{' || json.Unmarshal(b, &f) != nil {
		return &Error{Code: failure.ProviderTransportFailed, Message: "malformed JSON-RPC frame on agent stdout"}
	}
	hasID := len(f.ID) > 0 && string(f.ID) != "null"
	switch {
	case f.Method == "" && hasID:
		c.deliver(f)
	case f.Method != "" && hasID:
		c.onRequest(f.ID, f.Method, f.Params)
	case f.Method != "":
		c.onNotify(f.Method, f.Params)
	}
	return nil
}

func (c *conn) deliver(f frame) {
	id, err := strconv.ParseInt(string(f.ID), 10, 64)
	if err != nil {
		return
	}
	c.mu.Lock()
	p := c.calls[id]
	delete(c.calls, id)
	c.mu.Unlock()
	if p == nil {
		return
	}
	r := reply{result: f.Result, rpcErr: f.Error}
	if p.onReply != nil {
		p.onReply(r)
	}
	p.ch <- r
}

// fail ends the connection: every pending call (and every later one) gets
// err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.failErr == nil {
		c.failErr = err
	}
	calls := c.calls
	c.calls = map[int64]*pending{}
	c.mu.Unlock()
	for _, p := range calls {
		r := reply{err: err}
		if p.onReply != nil {
			p.onReply(r)
		}
		p.ch <- r
	}
}

// send writes a request and returns its pending call without waiting.
func (c *conn) send(method string, params any, onReply func(reply)) (*pending, error) {
	p := &pending{method: method, ch: make(chan reply, 1), onReply: onReply}
	c.mu.Lock()
	if c.failErr != nil {
		err := c.failErr
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	id := c.nextID
	c.calls[id] = p
	c.mu.Unlock()
	if err := c.write(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params}); err != nil {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
		return nil, err
	}
	return p, nil
}

// call sends a request and waits for its answer, ctx or timeout. A JSON-RPC
// error answer is returned as rpcErr.
func (c *conn) call(ctx context.Context, method string, params any, timeout time.Duration) (json.RawMessage, *wireError, error) {
	_, span := telemetry.Tracer().Start(ctx, "provider "+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("rpc.system", "jsonrpc"), attribute.String("rpc.method", method)))
	res, rpcErr, err := c.await(ctx, method, params, timeout, nil)
	spanErr := err
	if err == nil && rpcErr != nil {
		spanErr = fmt.Errorf("%s", rpcErr.String())
	}
	telemetry.End(span, spanErr)
	return res, rpcErr, err
}

// await is call without a span; onReply (optional) runs on the reader
// goroutine when the answer arrives.
func (c *conn) await(ctx context.Context, method string, params any, timeout time.Duration, onReply func(reply)) (json.RawMessage, *wireError, error) {
	p, err := c.send(method, params, onReply)
	if err != nil {
		return nil, nil, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-p.ch:
		return r.result, r.rpcErr, r.err
	case <-t.C:
		return nil, nil, &Error{Code: failure.ProviderRequestTimeout, Message: fmt.Sprintf("%s: no answer within %s", method, timeout)}
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("acp: %s: %w", method, ctx.Err())
	}
}

func (c *conn) notify(method string, params any) error {
	return c.write(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

func (c *conn) respond(id json.RawMessage, result any) error {
	return c.write(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func (c *conn) respondError(id json.RawMessage, code int64, msg string) error {
	return c.write(map[string]any{"jsonrpc": "2.0", "id": id, "error": wireError{Code: code, Message: msg}})
}

// write sends one JSON line; a failed write breaks the connection.
func (c *conn) write(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return &Error{Code: failure.ProviderProtocolError, Message: "encode: " + err.Error()}
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	failed := c.failErr
	c.mu.Unlock()
	if failed != nil {
		return failed
	}
	_ = c.in.SetWriteDeadline(time.Now().Add(c.requestTimeout))
	if _, err := c.in.Write(b.Bytes()); err != nil {
		e := &Error{Code: failure.ProviderTransportFailed, Message: "write to agent stdin: " + err.Error()}
		c.fail(e)
		return e
	}
	return nil
}
