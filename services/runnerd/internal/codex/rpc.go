package codex

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
)

// MaxFrameBytes bounds one line (one JSON-RPC message) read from the
// provider's stdout. A longer line fails the session with
// provider_frame_too_large.
const MaxFrameBytes = jsonrpc.MaxFrameBytes

// The JSON-RPC framing is package jsonrpc's.
type (
	wireMessage = jsonrpc.Message
	wireError   = jsonrpc.Error
)

// newConn is the session's JSON-RPC connection over the provider's stdio.
// A write that fails breaks the transport (the monitor decides why the
// session ends); a closed stdin refuses writes.
func (s *Session) newConn() *jsonrpc.Conn {
	return jsonrpc.New(jsonrpc.Config{
		Name: "codex", Peer: "harness", In: s.stdin, WriteTimeout: s.cfg.RequestTimeout, Logger: s.log,
		NewError:       func(code, msg string) error { return &Error{Code: code, Message: msg} },
		OnNotification: s.handleNotification,
		OnRequest:      s.handleServerRequest,
		LineStart: func() {
			s.readerBusy.Store(true)
			if s.cfg.Lines != nil {
				s.cfg.Lines.LineStart()
			}
		},
		LineDone: func(answer bool) {
			if s.cfg.Lines != nil {
				s.cfg.Lines.LineDone(answer)
			}
			s.readerFrames.Add(1)
			s.readerBusy.Store(false)
		},
		CheckWrite: func() error {
			if s.stdinClosed.Load() {
				return s.failureOr(errorf(failure.ProviderTransportFailed, "harness stdin is closed"))
			}
			return nil
		},
		OnWriteError: func(err error) error {
			var e *Error
			if !errors.As(err, &e) {
				e = errorf(failure.ProviderTransportFailed, "%s", err.Error())
			}
			s.breakWrite(e)
			return s.failureOr(e)
		},
	})
}

// readLoop reads and dispatches provider stdout until EOF or a fatal error.
func (s *Session) readLoop() {
	defer close(s.readerDone)
	if lines := s.cfg.Lines; lines != nil {
		defer lines.ReaderDone()
	}
	fatal, err := s.conn.Serve(s.stdout)
	var e *Error
	if errors.As(fatal, &e) {
		s.setReaderFatal(e)
		return
	}
	if err != nil {
		s.setReaderErr(err)
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

// call sends a request and waits for its response, the timeout, ctx or the
// session failure. onResult (optional) runs on the reader goroutine when a
// successful response arrives; its error is the call's.
func (s *Session) call(ctx context.Context, method string, params any, timeout time.Duration, onResult func(json.RawMessage) error) (json.RawMessage, *wireError, error) {
	var hook func(*jsonrpc.Reply)
	if onResult != nil {
		hook = func(r *jsonrpc.Reply) {
			if r.Err == nil && r.RPCErr == nil {
				r.Err = onResult(r.Result)
			}
		}
	}
	return s.conn.Call(ctx, method, params, timeout, hook)
}

func (s *Session) notify(method string, params any) error {
	return s.conn.Notify(method, params)
}

// respond answers the provider's request id.
func (s *Session) respond(id json.RawMessage, result any) error {
	return s.conn.Respond(id, result)
}

// respondError answers the provider's request id with an error.
func (s *Session) respondError(id json.RawMessage, code int64, message string) error {
	return s.conn.RespondError(id, code, message)
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

// present reports whether a raw member is there and not null.
func present(raw json.RawMessage) bool { return jsonrpc.Present(raw) }
