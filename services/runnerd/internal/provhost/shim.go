package provhost

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Shim exit codes.
const (
	ShimExitClosed   = 0 // stdin closed: the driver (or runnerd) went away
	ShimExitGone     = 1 // the host closed the connection: the provider ended
	ShimExitRefused  = 3 // the host refused the attach
	ShimExitNoHost   = 4 // no host listens on the socket
	ShimExitBadUsage = 2
)

// RunShim connects stdin/stdout to the provider host listening on socket
// (a provider's stdio for a driver that can only spawn a process; runnerd
// itself talks to the host over its socket, see Dial). It returns when
// either side closes.
func RunShim(socket string, reattach bool, resumeAfter uint64, stdin io.Reader, stdout, stderr io.Writer) int {
	dir, name := filepath.Split(socket)
	if dir != "" {
		// A relative name keeps the socket path short whatever the dir.
		if err := os.Chdir(dir); err != nil {
			fmt.Fprintf(stderr, "provider-shim: %v\n", err)
			return ShimExitNoHost
		}
	}
	c, err := attach(name, reattach, resumeAfter)
	if err != nil {
		fmt.Fprintf(stderr, "provider-shim: %v\n", err)
		var ref *RefusedError
		if errors.As(err, &ref) {
			return ShimExitRefused
		}
		return ShimExitNoHost
	}
	defer c.Close()
	done := make(chan int, 2)
	go func() {
		_, _ = io.Copy(c, stdin)
		done <- ShimExitClosed
	}()
	go func() {
		_, _ = io.Copy(stdout, c)
		done <- ShimExitGone
	}()
	return <-done
}

// RefusedError is a host's refusal of an attach (a fresh session on a host
// that already served one, a replay from behind its buffer, a stopping
// host).
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the provider host refused: " + e.Reason }

// Conn is an attached client connection to a provider host: the
// provider's stdio, as the host relays it (see the package comment).
type Conn struct {
	c  *net.UnixConn
	br *bufio.Reader
}

// Read reads what the host relays from the provider (after the handshake).
func (c *Conn) Read(p []byte) (int, error) { return c.br.Read(p) }

// Write writes to the provider's stdin (through the host).
func (c *Conn) Write(p []byte) (int, error) { return c.c.Write(p) }

// SetWriteDeadline bounds the writes.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

// CloseWrite ends the client's side (the host detaches it, as when a
// client dies, and closes the connection).
func (c *Conn) CloseWrite() error { return c.c.CloseWrite() }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Dial attaches to the provider host serving runner directory dir: a fresh
// client, or a re-attaching one that resumes after host seq resumeAfter.
// runnerd drives its provider over the returned connection itself, without
// a shim process between them (every line crossed one more process each
// way). When runnerd dies, the kernel closes the connection and the host
// keeps the provider, as when a shim died with it.
func Dial(dir string, reattach bool, resumeAfter uint64) (*Conn, error) {
	name := filepath.Join(dir, SocketName)
	if len(name) >= maxSocketPath {
		// A socket address holds about 108 bytes: reach the socket
		// through a descriptor of its directory instead of chdir, which
		// would move the whole of runnerd.
		d, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		name = "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + SocketName
	}
	return attach(name, reattach, resumeAfter)
}

// maxSocketPath is the longest socket path dialled as is (sun_path is 108
// bytes on Linux, with its terminating NUL).
const maxSocketPath = 100

// attach connects to the socket at name and runs the handshake.
func attach(name string, reattach bool, resumeAfter uint64) (*Conn, error) {
	nc, err := net.DialTimeout("unix", name, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no provider host: %w", err)
	}
	conn := nc.(*net.UnixConn)
	b, _ := json.Marshal(handshake{Reattach: reattach, ResumeAfter: resumeAfter})
	if _, err := conn.Write(append(b, '\n')); err != nil {
		conn.Close()
		return nil, fmt.Errorf("no provider host: %w", err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := readLine(br, maxHandshakeBytes)
	_ = conn.SetReadDeadline(time.Time{})
	var rep handshakeReply
	if err == nil {
		err = json.Unmarshal(raw, &rep)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("no answer from the provider host: %w", err)
	}
	if !rep.OK {
		conn.Close()
		return nil, &RefusedError{Reason: rep.Error}
	}
	return &Conn{c: conn, br: br}, nil
}
