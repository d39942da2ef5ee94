package jsonrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/telemetry"
)

// Writer is the peer's stdin (a pipe, or a provider host's connection).
type Writer interface {
	io.Writer
	SetWriteDeadline(time.Time) error
}

// Config configures a Conn.
type Config struct {
	// Name prefixes errors of the caller's context ("codex", "acp");
	// Peer names the other side in transport errors ("harness", "agent").
	Name, Peer string
	// In is the peer's stdin; every write gets WriteTimeout to finish.
	In           Writer
	WriteTimeout time.Duration
	// NewError makes the driver's error with a stable code (SPEC.md) for
	// the failures the connection reports.
	NewError func(code, message string) error
	// OnNotification and OnRequest receive the peer's messages, in order,
	// on the reader goroutine. A request is answered with Respond or
	// RespondError, at once or later.
	OnNotification func(method string, params json.RawMessage)
	OnRequest      func(m Message)
	// LineStart and LineDone (optional) bracket the dispatch of each line;
	// answer says the line answered a request.
	LineStart func()
	LineDone  func(answer bool)
	// CheckWrite (optional) runs before each write under the write lock;
	// its error is returned instead of writing.
	CheckWrite func() error
	// OnWriteError (optional) decides what a failed write does and
	// returns; by default the connection fails with it (Fail).
	OnWriteError func(err error) error
	Logger       *slog.Logger
}

// Reply is what a pending call receives: the result, the peer's error
// answer (RPCErr), or Err (the connection's failure, or what the call's
// onReply hook set).
type Reply struct {
	Result json.RawMessage
	RPCErr *Error
	Err    error
}

// Call is a request sent and not answered yet.
type Call struct {
	id     int64
	method string
	ch     chan Reply // buffered(1); exactly one send
	// onReply runs on the reader goroutine before any later message is
	// handled (or on the failing goroutine), so what it settles is in
	// place for the messages that follow the answer.
	onReply func(*Reply)
}

// Conn is one JSON-RPC connection: requests out and their answers, the
// peer's notifications and requests in.
type Conn struct {
	cfg     Config
	writeMu sync.Mutex

	mu      sync.Mutex
	nextID  int64
	calls   map[int64]*Call
	failErr error // set once the connection is dead; pending and later calls get it
}

// New returns a connection; Serve reads it.
func New(cfg Config) *Conn {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Conn{cfg: cfg, calls: map[int64]*Call{}}
}

// Serve reads and dispatches the peer's lines until EOF (nil, nil), a read
// error (nil, err) or a fatal protocol failure (fatal, nil): a frame over
// MaxFrameBytes or one that is not JSON.
func (c *Conn) Serve(r io.Reader) (fatal, readErr error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	for {
		line, err := ReadFrame(br, &buf)
		if errors.Is(err, ErrFrameTooLarge) {
			return c.cfg.NewError(failure.ProviderFrameTooLarge, fmt.Sprintf("%s stdout frame exceeded %d bytes", c.cfg.Peer, MaxFrameBytes)), nil
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if c.cfg.LineStart != nil {
				c.cfg.LineStart()
			}
			answer, fatal := c.dispatch(line)
			if c.cfg.LineDone != nil {
				c.cfg.LineDone(answer)
			}
			if fatal != nil {
				return fatal, nil
			}
			if answer {
				// The caller waiting for this answer runs now rather than
				// after every line already buffered here was dispatched
				// (an answer comes at the head of a burst).
				runtime.Gosched()
			}
		}
		if cap(buf) > keepFrameBuffer {
			buf = nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
	}
}

// dispatch routes one line; answer says it answered a request.
func (c *Conn) dispatch(line []byte) (answer bool, fatal error) {
	m, err := Parse(line)
	if err != nil {
		return false, c.cfg.NewError(failure.ProviderTransportFailed, fmt.Sprintf("malformed JSON-RPC frame on %s stdout: %s", c.cfg.Peer, err.Error()))
	}
	switch m.Kind() {
	case Response:
		c.deliver(&m)
	case Request:
		c.cfg.OnRequest(m)
	case Notification:
		c.cfg.OnNotification(m.Method, m.Params)
	default:
		c.cfg.Logger.Warn(c.cfg.Name+": ignoring unroutable message from provider", "bytes", len(bytes.TrimSpace(line)))
	}
	return m.Answer(), nil
}

func (c *Conn) deliver(m *Message) {
	id, ok := m.IntID()
	if !ok {
		c.cfg.Logger.Warn(c.cfg.Name + ": response with a non-integer id ignored")
		return
	}
	c.mu.Lock()
	p := c.calls[id]
	delete(c.calls, id)
	c.mu.Unlock()
	if p == nil {
		c.cfg.Logger.Debug(c.cfg.Name+": response for an unknown or abandoned request", "id", id)
		return
	}
	r := Reply{RPCErr: m.WireError()}
	if r.RPCErr == nil {
		r.Result = m.Result
	}
	if p.onReply != nil {
		p.onReply(&r)
	}
	p.ch <- r
}

// Fail ends the connection: every pending call, and every later one, gets
// err (the first one Fail was given).
func (c *Conn) Fail(err error) {
	c.mu.Lock()
	if c.failErr == nil {
		c.failErr = err
	}
	calls := c.calls
	c.calls = map[int64]*Call{}
	c.mu.Unlock()
	for _, p := range calls {
		r := Reply{Err: err}
		if p.onReply != nil {
			p.onReply(&r)
		}
		p.ch <- r
	}
}

// Err is the connection's failure, nil while it is alive.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failErr
}

// Send writes a request and returns its pending call without waiting;
// onReply (optional) runs when it is answered or the connection fails.
func (c *Conn) Send(method string, params any, onReply func(*Reply)) (*Call, error) {
	p := &Call{method: method, ch: make(chan Reply, 1), onReply: onReply}
	c.mu.Lock()
	if c.failErr != nil {
		err := c.failErr
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	p.id = c.nextID
	c.calls[p.id] = p
	c.mu.Unlock()
	if err := c.write(request{JSONRPC: "2.0", ID: p.id, Method: method, Params: params}); err != nil {
		c.remove(p.id)
		return nil, err
	}
	return p, nil
}

// Call sends a request and waits for its answer (see Wait), in a client
// span of ctx's trace.
func (c *Conn) Call(ctx context.Context, method string, params any, timeout time.Duration, onReply func(*Reply)) (json.RawMessage, *Error, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", c.cfg.Name, method, err)
	}
	_, span := telemetry.Tracer().Start(ctx, "provider "+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("rpc.system", "jsonrpc"), attribute.String("rpc.method", method)))
	var result json.RawMessage
	var rpcErr *Error
	p, err := c.Send(method, params, onReply)
	if err == nil {
		result, rpcErr, err = c.Wait(ctx, p, timeout)
	}
	spanErr := err
	if err == nil && rpcErr != nil {
		spanErr = errors.New(rpcErr.Describe())
	}
	telemetry.End(span, spanErr)
	return result, rpcErr, err
}

// Wait waits for p's answer, the timeout or ctx. A call abandoned on the
// timeout or ctx is forgotten (its late answer is dropped) unless its
// answer is already on the way, which is then returned.
func (c *Conn) Wait(ctx context.Context, p *Call, timeout time.Duration) (json.RawMessage, *Error, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var abandon error
	select {
	case r := <-p.ch:
		return r.Result, r.RPCErr, r.Err
	case <-timer.C:
		abandon = c.cfg.NewError(failure.ProviderRequestTimeout, fmt.Sprintf("%s: no response within %s", p.method, timeout))
	case <-ctx.Done():
		abandon = fmt.Errorf("%s: %s: %w", c.cfg.Name, p.method, ctx.Err())
	}
	if c.remove(p.id) {
		return nil, nil, abandon
	}
	r := <-p.ch
	return r.Result, r.RPCErr, r.Err
}

func (c *Conn) remove(id int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.calls[id]; !ok {
		return false
	}
	delete(c.calls, id)
	return true
}

// Notify sends a notification.
func (c *Conn) Notify(method string, params any) error {
	return c.write(notification{JSONRPC: "2.0", Method: method, Params: params})
}

// Respond answers the peer's request id with result.
func (c *Conn) Respond(id json.RawMessage, result any) error {
	return c.write(response{JSONRPC: "2.0", ID: id, Result: result})
}

// RespondError answers the peer's request id with an error.
func (c *Conn) RespondError(id json.RawMessage, code int64, message string) error {
	return c.write(errorResponse{JSONRPC: "2.0", ID: id, Error: Error{Code: code, Message: message}})
}

type request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      int64  `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type notification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result"`
}

type errorResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   Error           `json:"error"`
}

// write sends one JSON line. A failed write breaks the transport (a
// partial line cannot be repaired): see Config.OnWriteError.
func (c *Conn) write(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return c.cfg.NewError(failure.ProviderProtocolError, "encode: "+err.Error())
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.Err(); err != nil {
		return err
	}
	if c.cfg.CheckWrite != nil {
		if err := c.cfg.CheckWrite(); err != nil {
			return err
		}
	}
	_ = c.cfg.In.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	if _, err := c.cfg.In.Write(b.Bytes()); err != nil {
		e := c.cfg.NewError(failure.ProviderTransportFailed, "write to "+c.cfg.Peer+" stdin: "+err.Error())
		if c.cfg.OnWriteError != nil {
			return c.cfg.OnWriteError(e)
		}
		c.Fail(e)
		return e
	}
	return nil
}

// Describe is the message (at most 1 KiB of it) and the code.
func (e *Error) Describe() string {
	msg := e.Message
	if len(msg) > 1024 {
		cut := 1024
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg + " (code " + strconv.FormatInt(e.Code, 10) + ")"
}
