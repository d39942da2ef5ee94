package prp

import (
	"context"
	"errors"
	"sync"

	"github.com/coder/websocket"
)

// pipeEnd is one end of an in-memory message pipe implementing transport.
type pipeEnd struct {
	in     chan []byte
	out    chan []byte
	closed chan struct{}
	once   *sync.Once
}

var errPipeClosed = errors.New("pipe closed")

func newPipe() (*Conn, *Conn) {
	a, b := make(chan []byte, 16), make(chan []byte, 16)
	closed := make(chan struct{})
	once := &sync.Once{}
	return &Conn{t: &pipeEnd{in: a, out: b, closed: closed, once: once}},
		&Conn{t: &pipeEnd{in: b, out: a, closed: closed, once: once}}
}

func (p *pipeEnd) read(ctx context.Context) ([]byte, error) {
	select { // queued data wins over a close
	case b := <-p.in:
		return b, nil
	default:
	}
	select {
	case b := <-p.in:
		return b, nil
	case <-p.closed:
		return nil, errPipeClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *pipeEnd) write(ctx context.Context, b []byte) error {
	select {
	case p.out <- append([]byte(nil), b...):
		return nil
	case <-p.closed:
		return errPipeClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pipeEnd) close(websocket.StatusCode, string) error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

func (p *pipeEnd) closeNow() error { return p.close(websocket.StatusGoingAway, "") }
