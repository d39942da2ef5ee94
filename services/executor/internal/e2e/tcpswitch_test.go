package e2e

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// tcpSwitch is a loopback TCP proxy to a service that a test turns off and
// on at once. Off, it cuts every connection through it and closes each new
// one unanswered, as a service that went away; on, it forwards again — no
// process start to wait for, however loaded the machine.
type tcpSwitch struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	off   bool
	conns map[net.Conn]bool
}

// newTCPSwitch listens on a free loopback port and forwards to target
// (closed with the test).
func newTCPSwitch(t *testing.T, target string) *tcpSwitch {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &tcpSwitch{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.set(true)
	})
	return s
}

// Addr is the proxy's address.
func (s *tcpSwitch) Addr() string { return s.ln.Addr().String() }

// set turns the switch off (cutting every open connection) or on.
func (s *tcpSwitch) set(off bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.off = off
	if off {
		for c := range s.conns {
			c.Close()
		}
		clear(s.conns)
	}
}

// track records c as open unless the switch is off (then c is closed).
func (s *tcpSwitch) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		c.Close()
		return false
	}
	s.conns[c] = true
	return true
}

func (s *tcpSwitch) untrack(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(s.conns, c)
	}
}

func (s *tcpSwitch) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		if !s.track(c) {
			continue
		}
		go s.pipe(c)
	}
}

func (s *tcpSwitch) pipe(c net.Conn) {
	up, err := net.Dial("tcp", s.target)
	if err != nil {
		s.untrack(c)
		return
	}
	if !s.track(up) {
		s.untrack(c)
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		s.untrack(c, up)
		close(done)
	}()
	_, _ = io.Copy(c, up)
	s.untrack(c, up)
	<-done
}
