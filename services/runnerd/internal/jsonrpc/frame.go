// Package jsonrpc is runnerd's one JSON-RPC 2.0 framing over a provider's
// stdio (codex app-server, ACP agents): newline-delimited messages, request
// ids and pending calls, the peer's notifications and requests handed to
// the driver in order on one reader goroutine, and close semantics (a
// failed connection fails every pending call and every later one). The
// message contents are the drivers'.
package jsonrpc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// MaxFrameBytes bounds one line (one message) read from the peer; a longer
// line fails the connection with provider_frame_too_large.
const MaxFrameBytes = 4 << 20

// keepFrameBuffer is the largest frame buffer kept between lines; a larger
// one (after an unusually big message) is released.
const keepFrameBuffer = 256 << 10

// ErrFrameTooLarge is ReadFrame's error for a line over MaxFrameBytes.
var ErrFrameTooLarge = errors.New("frame too large")

// errNotObject is Parse's error for a frame that is not a JSON object.
var errNotObject = errors.New("not a JSON object")

// Message is any message read from the peer. Presence of id, method,
// result and error is what routes it, so they stay raw: "id":0 is a real
// id.
type Message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// Kind is how a message is routed.
type Kind int

// Message kinds.
const (
	// Unroutable: neither a method nor an answer (ignored).
	Unroutable Kind = iota
	// Response answers one of our requests: an id, no method, and a
	// result or an error.
	Response
	// Request is the peer's request: a method and an id; it is answered
	// with Respond or RespondError.
	Request
	// Notification is a method without an id.
	Notification
)

// Kind routes m.
func (m *Message) Kind() Kind {
	hasID := Present(m.ID)
	switch {
	case m.Method == "" && hasID && (m.Result != nil || m.Error != nil):
		return Response
	case m.Method != "" && hasID:
		return Request
	case m.Method != "":
		return Notification
	}
	return Unroutable
}

// Answer reports whether m answers a request (an id and no method), also
// when it carries neither result nor error.
func (m *Message) Answer() bool { return m.Method == "" && Present(m.ID) }

// IntID is a response's id as our requests number them.
func (m *Message) IntID() (int64, bool) {
	id, err := strconv.ParseInt(string(bytes.TrimSpace(m.ID)), 10, 64)
	return id, err == nil
}

// WireError is the error object of a response, parsed leniently: an
// unparseable one reads as code 0, "unparseable error object"; nil when
// the response carries none.
func (m *Message) WireError() *Error {
	if !Present(m.Error) {
		return nil
	}
	var e Error
	if err := json.Unmarshal(m.Error, &e); err != nil {
		return &Error{Message: "unparseable error object"}
	}
	return &e
}

// Present reports whether a raw member is there and not null.
func Present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// Error is a JSON-RPC error object.
type Error struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// String is the message and its code.
func (e *Error) String() string {
	return e.Message + " (JSON-RPC " + strconv.FormatInt(e.Code, 10) + ")"
}

// Parse decodes one frame (surrounding white space allowed). A frame that
// is not a JSON object is an error.
func Parse(line []byte) (Message, error) {
	var m Message
	t := bytes.TrimSpace(line)
	if len(t) == 0 || t[0] != '{' {
		return m, errNotObject
	}
	if err := json.Unmarshal(t, &m); err != nil {
		return m, err
	}
	return m, nil
}

// ReadFrame returns the next line of br without its line terminator (\n or
// \r\n). buf is reused across calls. At EOF a final unterminated line is
// returned with io.EOF. A line over MaxFrameBytes is ErrFrameTooLarge; the
// reader is then left mid-line.
func ReadFrame(br *bufio.Reader, buf *[]byte) ([]byte, error) {
	line := (*buf)[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, chunk...)
			*buf = line
			// +1: a trailing '\r' of a CRLF terminator may still be in line.
			if len(line) > MaxFrameBytes+1 {
				return nil, ErrFrameTooLarge
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
			return nil, ErrFrameTooLarge
		}
		return full, err
	}
}

// Encoded messages for a relay (the provider host) that writes a few lines
// of its own among the ones it passes on: one message each, without its
// line terminator.

// EncodeNotification is a notification.
func EncodeNotification(method string, params any) []byte {
	return encode(notification{JSONRPC: "2.0", Method: method, Params: params})
}

// EncodeResponse answers request id with result.
func EncodeResponse(id json.RawMessage, result any) []byte {
	return encode(response{JSONRPC: "2.0", ID: id, Result: result})
}

// EncodeError answers request id with an error.
func EncodeError(id json.RawMessage, code int64, message string) []byte {
	return encode(errorResponse{JSONRPC: "2.0", ID: id, Error: Error{Code: code, Message: message}})
}

func encode(v any) []byte {
	b, _ := json.Marshal(v) // the envelopes hold nothing unencodable
	return b
}
