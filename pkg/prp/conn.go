package prp

import (
	"bytes"
	"context"
	"errors"
	"sync"

	"github.com/coder/websocket"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// transport is the message layer under a Conn (a WebSocket in production; an
// in-memory pipe in tests and fuzzing).
type transport interface {
	read(ctx context.Context) ([]byte, error)
	write(ctx context.Context, b []byte) error
	close(code websocket.StatusCode, reason string) error
	closeNow() error
}

// Conn is a framed PRP connection over a WebSocket. Write is safe for
// concurrent use; Read must be called from one goroutine at a time.
//
// Note: as with the underlying WebSocket, a context that ends during Read
// closes the connection.
type Conn struct {
	t   transport
	wmu sync.Mutex
}

// NewConn wraps ws and limits inbound messages to MaxFrameBytes.
func NewConn(ws *websocket.Conn) *Conn {
	ws.SetReadLimit(MaxFrameBytes)
	return &Conn{t: &wsTransport{ws: ws}}
}

// Read returns the next frame. An oversize message fails with
// provider_frame_too_large (and the WebSocket is closed with 1009); a message
// that does not decode fails with runner_protocol_error.
func (c *Conn) Read(ctx context.Context) (*prpv1.Frame, error) {
	b, err := c.t.read(ctx)
	if err != nil {
		return nil, err
	}
	return Unmarshal(b)
}

// ReadRelay is Read with UnmarshalRelay: event batches come back as
// opaque, pre-encoded batches for forwarding (see UnmarshalRelay).
func (c *Conn) ReadRelay(ctx context.Context) (*prpv1.Frame, error) {
	b, err := c.t.read(ctx)
	if err != nil {
		return nil, err
	}
	return UnmarshalRelay(b)
}

// Write encodes and sends one frame.
func (c *Conn) Write(ctx context.Context, f *prpv1.Frame) error {
	b, err := Marshal(f)
	if err != nil {
		return err
	}
	return c.WriteRaw(ctx, b)
}

// WriteRaw sends an already encoded frame (for example a journaled envelope
// that must be resent with identical bytes).
func (c *Conn) WriteRaw(ctx context.Context, b []byte) error {
	if len(b) > MaxFrameBytes {
		return errorf(failure.ProviderFrameTooLarge, "frame of %d bytes exceeds %d bytes", len(b), MaxFrameBytes)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.t.write(ctx, b)
}

// Close closes the connection with a WebSocket status code and reason.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	if len(reason) > 120 { // control frame payload limit is 125 bytes
		reason = reason[:120]
	}
	return c.t.close(code, reason)
}

// CloseNow closes the connection at once, without a close handshake (for a
// peer that stopped answering).
func (c *Conn) CloseNow() error { return c.t.closeNow() }

// wsTransport reads each message into a buffer it reuses (frames are
// decoded before the next read; the decoders copy what they keep).
type wsTransport struct {
	ws  *websocket.Conn
	buf bytes.Buffer
}

func (w *wsTransport) closeNow() error { return w.ws.CloseNow() }

func (w *wsTransport) read(ctx context.Context) ([]byte, error) {
	if w.buf.Cap() > 1<<20 {
		w.buf = bytes.Buffer{} // do not keep a huge frame's buffer around
	}
	w.buf.Reset()
	typ, r, err := w.ws.Reader(ctx)
	if err == nil {
		_, err = w.buf.ReadFrom(r)
	}
	if err != nil {
		if errors.Is(err, websocket.ErrMessageTooBig) {
			return nil, errorf(failure.ProviderFrameTooLarge, "inbound frame exceeded %d bytes", MaxFrameBytes)
		}
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, errorf(failure.RunnerProtocolError, "binary WebSocket message; PRP frames are protojson text")
	}
	return w.buf.Bytes(), nil
}

func (w *wsTransport) write(ctx context.Context, b []byte) error {
	return w.ws.Write(ctx, websocket.MessageText, b)
}

func (w *wsTransport) close(code websocket.StatusCode, reason string) error {
	return w.ws.Close(code, reason)
}
