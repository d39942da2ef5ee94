package codex

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/telemetry"
)

// MaxFrameBytes bounds one line (one JSON-RPC message) read from the
// provider's stdout. A longer line fails the session with
// provider_frame_too_large.
const MaxFrameBytes = 4 << 20

// keepFrameBuffer is the largest frame buffer kept between lines; a larger one
// (after an unusually big message) is released.
const keepFrameBuffer = 256 << 10

var errFrameTooLarge = errors.New("frame too large")

// wireMessage is any message read from the provider. Presence of id, result
// and error is what routes it, so they stay raw: "id":0 is a real id.
type wireMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

type wireError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

type outRequest struct {
	JSONRPC string `json:"jsonrpc"`
	ID      int64  `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type outNotification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type outResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *wireError      `json:"error,omitempty"`
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// rpcReply is what a pending call receives.
type rpcReply struct {
	result json.RawMessage
	rpcErr *wireError
	err    error // hook failure, or the session failure
}

type pendingCall struct {
	method string
	ch     chan rpcReply // buffered(1); exactly one send
	// onResult runs on the reader goroutine before any later message is
	// processed, so state it sets (open thread, active turn) is in place for
	// the notifications that follow the response.
	onResult func(json.RawMessage) error
}

// readFrame returns the next line of br without its line terminator. buf is
// reused across calls. At EOF a final unterminated line is returned with
// io.EOF.
func readFrame(br *bufio.Reader, buf *[]byte) ([]byte, error) {
	line := (*buf)[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, chunk...)
			*buf = line
			// +1: a trailing '\r' of a CRLF terminator may still be in line.
			if len(line) > MaxFrameBytes+1 {
				return nil, errFrameTooLarge
			}
			continue
		}
		var full []byte
		if len(line) == 0 {
			// The whole line fit in the reader's buffer; the slice stays
			// valid until the next read, which is after it was handled.
			full = chunk
		} else {
			line = append(line, chunk...)
			*buf = line
			full = line
		}
		full = bytes.TrimRight(full, "\r\n")
		if len(full) > MaxFrameBytes {
			return nil, errFrameTooLarge
		}
		return full, err
	}
}

// readLoop reads and dispatches provider stdout until EOF or a fatal error.
func (s *Session) readLoop() {
	defer close(s.readerDone)
	lines := s.cfg.Lines
	if lines != nil {
		defer lines.ReaderDone()
	}
	br := bufio.NewReaderSize(s.stdout, 64<<10)
	var buf []byte
	for {
		line, err := readFrame(br, &buf)
		if errors.Is(err, errFrameTooLarge) {
			s.setReaderFatal(errorf(failure.ProviderFrameTooLarge, "harness stdout frame exceeded %d bytes", MaxFrameBytes))
			return
		}
		if len(bytes.TrimSpace(line)) > 0 {
			s.readerBusy.Store(true)
			if lines != nil {
				lines.LineStart()
			}
			answer, fatal := s.dispatch(line)
			if lines != nil {
				lines.LineDone(answer)
			}
			s.readerFrames.Add(1)
			s.readerBusy.Store(false)
			if fatal != nil {
				s.setReaderFatal(fatal)
				return
			}
			if answer {
				// The caller waiting for this answer runs now rather than
				// after every line already buffered here was dispatched
				// (an answer to turn/start comes at the head of a burst).
				runtime.Gosched()
			}
		}
		if cap(buf) > keepFrameBuffer {
			buf = nil
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.setReaderErr(err)
			}
			return
		}
	}
}

func (s *Session) setReaderFatal(e *Error) {
	s.mu.Lock()
	if s.readerFatal == nil {
		s.readerFatal = e
	}
	s.mu.Unlock()
}

func (s *Session) setReaderErr(err error) {
	s.mu.Lock()
	if s.readerErr == nil {
		s.readerErr = err
	}
	s.mu.Unlock()
}

// dispatch routes one line; answer says it answered a request (an id and
// no method). A non-nil fatal fails the session.
func (s *Session) dispatch(line []byte) (answer bool, fatal *Error) {
	trimmed := bytes.TrimSpace(line)
	if trimmed[0] != '{' {
		return false, errorf(failure.ProviderTransportFailed, "malformed JSON-RPC frame on harness stdout: not a JSON object")
	}
	var msg wireMessage
	if err := json.Unmarshal(trimmed, &msg); err != nil {
		return false, errorf(failure.ProviderTransportFailed, "malformed JSON-RPC frame on harness stdout: %s", err.Error())
	}
	hasID := present(msg.ID)
	answer = msg.Method == "" && hasID
	switch {
	case msg.Method == "" && hasID && (msg.Result != nil || msg.Error != nil):
		s.handleResponse(msg)
	case msg.Method != "" && hasID:
		s.handleServerRequest(msg)
	case msg.Method != "":
		s.handleNotification(msg.Method, msg.Params)
	default:
		s.log.Warn("codex: ignoring unroutable message from provider", "bytes", len(trimmed))
	}
	return answer, nil
}

func (s *Session) handleResponse(msg wireMessage) {
	id, err := strconv.ParseInt(string(bytes.TrimSpace(msg.ID)), 10, 64)
	if err != nil {
		s.log.Warn("codex: response with a non-integer id ignored")
		return
	}
	s.mu.Lock()
	p := s.pending[id]
	delete(s.pending, id)
	s.mu.Unlock()
	if p == nil {
		s.log.Debug("codex: response for an unknown or abandoned request", "id", id)
		return
	}
	var reply rpcReply
	if present(msg.Error) {
		var we wireError
		if err := json.Unmarshal(msg.Error, &we); err != nil {
			we = wireError{Code: 0, Message: "unparseable error object"}
		}
		reply.rpcErr = &we
	} else {
		reply.result = msg.Result
		if p.onResult != nil {
			reply.err = p.onResult(msg.Result)
		}
	}
	p.ch <- reply
}

// call sends a request and waits for its response, the timeout, ctx or the
// session failure. onResult (optional) runs on the reader goroutine when a
// successful response arrives.
func (s *Session) call(ctx context.Context, method string, params any, timeout time.Duration, onResult func(json.RawMessage) error) (json.RawMessage, *wireError, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("codex: %s: %w", method, err)
	}
	// The provider call's span: a child of the command it serves.
	_, span := telemetry.Tracer().Start(ctx, "provider "+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("rpc.system", "jsonrpc"), attribute.String("rpc.method", method)))
	result, rpcErr, err := s.roundTrip(ctx, method, params, timeout, onResult)
	spanErr := err
	if err == nil && rpcErr != nil {
		spanErr = errors.New(rpcErr.describe())
	}
	telemetry.End(span, spanErr)
	return result, rpcErr, err
}

// roundTrip sends one request and waits for its answer (see call).
func (s *Session) roundTrip(ctx context.Context, method string, params any, timeout time.Duration, onResult func(json.RawMessage) error) (json.RawMessage, *wireError, error) {
	p := &pendingCall{method: method, ch: make(chan rpcReply, 1), onResult: onResult}
	s.mu.Lock()
	if s.failErr != nil {
		err := s.failErr
		s.mu.Unlock()
		return nil, nil, err
	}
	s.nextID++
	id := s.nextID
	s.pending[id] = p
	s.mu.Unlock()

	if err := s.writeMessage(outRequest{JSONRPC: "2.0", ID: id, Method: method, Params: params}); err != nil {
		s.removePending(id)
		return nil, nil, err
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var abandon error
	select {
	case r := <-p.ch:
		return r.result, r.rpcErr, r.err
	case <-timer.C:
		abandon = errorf(failure.ProviderRequestTimeout, "%s: no response within %s", method, timeout)
	case <-ctx.Done():
		abandon = fmt.Errorf("codex: %s: %w", method, ctx.Err())
	case <-s.exited:
	}
	if abandon != nil && s.removePending(id) {
		return nil, nil, abandon
	}
	// The reader (or the failure path) already took the call: its reply is
	// on the way.
	r := <-p.ch
	return r.result, r.rpcErr, r.err
}

func (s *Session) removePending(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[id]; !ok {
		return false
	}
	delete(s.pending, id)
	return true
}

func (s *Session) notify(method string, params any) error {
	return s.writeMessage(outNotification{JSONRPC: "2.0", Method: method, Params: params})
}

// writeMessage writes one JSON line to the provider's stdin. Any write error
// breaks the transport (a partial line cannot be repaired).
func (s *Session) writeMessage(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return errorf(failure.ProviderProtocolError, "encode request: %s", err.Error())
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.stdinClosed.Load() {
		return s.failureOr(errorf(failure.ProviderTransportFailed, "harness stdin is closed"))
	}
	_ = s.stdin.SetWriteDeadline(time.Now().Add(s.cfg.RequestTimeout))
	if _, err := s.stdin.Write(b.Bytes()); err != nil {
		e := errorf(failure.ProviderTransportFailed, "write to harness stdin: %s", err.Error())
		s.breakWrite(e)
		return s.failureOr(e)
	}
	return nil
}

// failureOr returns the session failure when there is one, else e.
func (s *Session) failureOr(e *Error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr != nil {
		return s.failErr
	}
	return e
}

func (s *Session) breakWrite(e *Error) {
	s.writeBrokenOnce.Do(func() {
		s.mu.Lock()
		s.writeErr = e
		s.mu.Unlock()
		close(s.writeBroken)
	})
}
