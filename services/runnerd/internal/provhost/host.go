package provhost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
)

// HostConfig configures RunHost.
type HostConfig struct {
	// Dir is runnerd's private runner directory: socket, info and log.
	Dir string
	// WorkDir is the provider's working directory.
	WorkDir string
	// Command and Args start the provider; it gets the host's environment
	// (runnerd starts the host with the provider's allow-listed one).
	Command string
	Args    []string
	// SeqBase: the first line gets seq SeqBase+1.
	SeqBase uint64
	// DetachTimeout: with no client attached for this long the host stops
	// the provider and exits.
	DetachTimeout time.Duration
	// Grace is the TERM grace when stopping the provider.
	Grace time.Duration
	// RetainBytes bounds the replay buffer.
	RetainBytes int
	// Ready, when set, receives one line once the host serves.
	Ready  io.WriteCloser
	Logger *slog.Logger
}

type entry struct {
	seq       uint64 // 0: a response to one client generation
	gen       int
	line      []byte
	delivered bool
}

type call struct {
	gen      int
	clientID json.RawMessage
	method   string
}

type turnMark struct {
	id       string
	startSeq uint64
	endSeq   uint64 // 0 while open
	line     []byte
}

type client struct {
	gen         int
	conn        net.Conn
	reattach    bool
	gated       bool
	resumeAfter uint64
	next        int // absolute index of the next log entry to consider
	direct      [][]byte
	closed      bool
}

type host struct {
	cfg HostConfig
	log *slog.Logger

	cmd   *exec.Cmd
	stdin io.WriteCloser
	inMu  sync.Mutex
	pgid  int

	mu          sync.Mutex
	cond        *sync.Cond
	entries     []*entry
	base        int // absolute index of entries[0]
	bytes       int
	nextSeq     uint64
	lostThrough uint64
	calls       map[int64]*call
	nextID      int64
	initResult  json.RawMessage
	turns       []*turnMark
	serverReqs  map[string]uint64
	client      *client
	gen         int
	outputDone  bool // provider stdout reached EOF
	exited      bool
	exitCode    int
	stopping    bool
	detachedAt  time.Time
	flushed     bool // the last client received everything after the exit
}

// RunHost runs a provider host until the provider is gone and its output
// was delivered (or nobody re-attached in time). It returns the provider's
// exit code (or 1 on a host failure).
func RunHost(cfg HostConfig) int {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DetachTimeout <= 0 {
		cfg.DetachTimeout = 2 * time.Minute
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.RetainBytes <= 0 {
		cfg.RetainBytes = DefaultRetainBytes
	}
	h := &host{cfg: cfg, log: cfg.Logger, calls: map[int64]*call{}, serverReqs: map[string]uint64{}, nextSeq: cfg.SeqBase, nextID: 1}
	h.cond = sync.NewCond(&h.mu)
	code, err := h.run()
	if err != nil {
		h.log.Error("provider host failed", "err", err)
		return 1
	}
	return code
}

func (h *host) run() (int, error) {
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	ln, err := h.listen()
	if err != nil {
		return 1, err
	}
	defer os.Remove(SocketName)

	_ = os.Remove(ExitName) // a previous provider's
	stdout, err := h.spawn()
	if err != nil {
		ln.Close()
		return 1, err
	}
	pid := h.cmd.Process.Pid
	if err := h.announceStart(pid); err != nil {
		h.kill()
		ln.Close()
		return 1, err
	}
	h.log.Info("provider host serving", "provider_pid", pid, "seq_base", h.cfg.SeqBase)

	go h.readProvider(stdout)
	waited := make(chan struct{})
	go h.waitProvider(pid, waited)
	go h.accept(ln)
	return h.supervise(ln, sigs, waited), nil
}

// listen listens on the host's socket in the state directory (a relative
// name keeps the path short whatever the directory), replacing a stale
// one; the socket outlives the listener's Close (run removes it).
func (h *host) listen() (net.Listener, error) {
	if err := os.Chdir(h.cfg.Dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(SocketName); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(SocketName)
	}
	ln, err := net.Listen("unix", SocketName)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	_ = os.Chmod(SocketName, 0o600)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// announceStart records the host's and the provider's identity (Info) and
// tells the launcher the host is ready.
func (h *host) announceStart(pid int) error {
	info := &Info{Schema: InfoSchema, HostPID: os.Getpid(), ProviderPID: pid, ProviderPGID: pid, ProviderStartedAt: time.Now().UTC(),
		SeqBase: h.cfg.SeqBase, BootID: bootID()}
	info.HostStartTicks, _ = StartTicks(os.Getpid())
	info.ProviderStartTicks, _ = StartTicks(pid)
	if err := writeInfo(h.cfg.Dir, info); err != nil {
		return err
	}
	if h.cfg.Ready != nil {
		_, _ = h.cfg.Ready.Write([]byte("ready\n"))
		_ = h.cfg.Ready.Close()
	}
	return nil
}

// waitProvider waits for the provider to exit, records its end and closes
// waited.
func (h *host) waitProvider(pid int, waited chan struct{}) {
	err := h.cmd.Wait()
	// The provider's own end, for the restarted driver's message: the
	// shim only sees its connection close (SPEC R7).
	if werr := writeExit(h.cfg.Dir, Exit{Schema: ExitSchema, ProviderPID: pid,
		Description: procid.DescribeExit(h.cmd.ProcessState), At: time.Now().UTC()}); werr != nil {
		h.log.Warn("cannot record the provider's exit", "err", werr)
	}
	code := 0
	if err != nil {
		code = 1
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() >= 0 {
			code = ee.ExitCode()
		}
	}
	h.mu.Lock()
	h.exited, h.exitCode = true, code
	h.cond.Broadcast()
	h.mu.Unlock()
	close(waited)
}

// supervise stops the provider on a signal or when no client re-attached
// within the detach timeout, and returns the provider's exit code once it
// is gone and its output was delivered (or nobody came for it).
func (h *host) supervise(ln net.Listener, sigs <-chan os.Signal, waited chan struct{}) int {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
			h.log.Info("provider host stopping on signal")
			h.stop(waited)
		case <-tick.C:
		case <-waited:
			waited = nil
		}
		h.mu.Lock()
		done := h.exited && h.outputDone && (h.flushed || (h.client == nil && (h.stopping || time.Since(h.detachedAt) > h.cfg.DetachTimeout)))
		idle := !h.exited && h.client == nil && !h.stopping && time.Since(h.detachedAt) > h.cfg.DetachTimeout
		code := h.exitCode
		h.mu.Unlock()
		if idle {
			h.log.Warn("no client re-attached within the detach timeout; stopping the provider", "timeout", h.cfg.DetachTimeout)
			h.stop(waited)
			continue
		}
		if done {
			ln.Close()
			h.mu.Lock()
			if c := h.client; c != nil {
				h.closeClient(c)
			}
			h.mu.Unlock()
			h.log.Info("provider host exiting", "provider_exit_code", code)
			return code
		}
	}
}

func (h *host) spawn() (io.ReadCloser, error) {
	cmd := exec.Command(h.cfg.Command, h.cfg.Args...)
	cmd.Dir = h.cfg.WorkDir
	cmd.Env = os.Environ()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &boundedWriter{w: os.Stderr, left: maxStderrLogBytes}
	if err := procgroup.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", h.cfg.Command, err)
	}
	h.cmd, h.stdin, h.pgid = cmd, stdin, cmd.Process.Pid
	h.detachedAt = time.Now()
	return stdout, nil
}

// stop ends the provider: stdin EOF, grace, TERM to its group, grace, KILL.
func (h *host) stop(waited <-chan struct{}) {
	h.mu.Lock()
	if h.stopping {
		h.mu.Unlock()
		return
	}
	h.stopping = true
	h.mu.Unlock()
	h.inMu.Lock()
	_ = h.stdin.Close()
	h.inMu.Unlock()
	if waited == nil {
		return
	}
	go func() {
		select {
		case <-waited:
			return
		case <-time.After(h.cfg.Grace):
		}
		procgroup.Stop(context.Background(), h.pgid, waited, h.cfg.Grace)
	}()
}

func (h *host) kill() {
	procgroup.Kill(h.pgid)
	_ = h.cmd.Wait()
}

type boundedWriter struct {
	w    io.Writer
	left int
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	n := len(p)
	if b.left <= 0 {
		return n, nil
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	b.left -= len(p)
	_, _ = b.w.Write(p)
	return n, nil
}

// readLine reads one line (without '\n'), keeping at most max+1 bytes of an
// overlong one and discarding the rest of it.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if room := max + 1 - len(line); room > 0 {
			take := chunk
			if len(take) > room {
				take = take[:room]
			}
			line = append(line, take...)
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte{'\n'}), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}

// wire is a message the host routes (package jsonrpc's framing).
type wire = jsonrpc.Message

func hasID(id json.RawMessage) bool { return jsonrpc.Present(id) }

func (h *host) readProvider(stdout io.Reader) {
	br := bufio.NewReaderSize(stdout, 64<<10)
	for {
		line, err := readLine(br, MaxLineBytes)
		if len(line) > 0 {
			h.onProviderLine(line)
			// The client's writer, woken for this line, runs now rather
			// than after every line already buffered here was parsed: a
			// burst (an answer, turn/started, the first items) otherwise
			// reached runnerd only once the host had read all of it.
			runtime.Gosched()
		}
		if err != nil {
			break
		}
	}
	h.mu.Lock()
	h.outputDone = true
	h.cond.Broadcast()
	h.mu.Unlock()
}

func (h *host) onProviderLine(line []byte) {
	var m wire
	perr := json.Unmarshal(line, &m)
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.cond.Broadcast()
	if perr == nil && m.Method == "" && hasID(m.ID) {
		h.onResponse(line, m)
		return
	}
	h.nextSeq++
	seq := h.nextSeq
	if perr == nil && m.Method != "" {
		if hasID(m.ID) {
			h.serverReqs[string(bytes.TrimSpace(m.ID))] = seq
		}
		switch m.Method {
		case "turn/started", "turn/completed":
			var p struct {
				Turn struct {
					ID string `json:"id"`
				} `json:"turn"`
			}
			if json.Unmarshal(m.Params, &p) == nil && p.Turn.ID != "" {
				h.trackTurn(m.Method, p.Turn.ID, seq, line)
			}
		}
	}
	h.appendEntry(&entry{seq: seq, line: line})
}

func (h *host) trackTurn(method, id string, seq uint64, line []byte) {
	if method == "turn/started" {
		h.turns = append(h.turns, &turnMark{id: id, startSeq: seq, line: append([]byte(nil), line...)})
		if len(h.turns) > 16 {
			h.turns = h.turns[len(h.turns)-16:]
		}
		return
	}
	for _, t := range h.turns {
		if t.id == id && t.endSeq == 0 {
			t.endSeq = seq
		}
	}
}

// activeTurnAt is the turn started at or before seq and not completed by it.
func (h *host) activeTurnAt(seq uint64) *turnMark {
	for i := len(h.turns) - 1; i >= 0; i-- {
		t := h.turns[i]
		if t.startSeq <= seq && (t.endSeq == 0 || t.endSeq > seq) {
			return t
		}
	}
	return nil
}

func (h *host) onResponse(line []byte, m wire) {
	hid, err := strconv.ParseInt(string(bytes.TrimSpace(m.ID)), 10, 64)
	c := h.calls[hid]
	if err != nil || c == nil {
		h.log.Debug("dropping a response to no pending request", "id", string(m.ID))
		return
	}
	delete(h.calls, hid)
	if c.method == "initialize" && h.initResult == nil && len(m.Result) > 0 {
		h.initResult = append(json.RawMessage(nil), m.Result...)
	}
	cl := h.client
	if cl == nil || cl.gen != c.gen {
		return // the client that asked is gone
	}
	out, err := withID(line, c.clientID)
	if err != nil {
		return
	}
	if cl.gated {
		cl.direct = append(cl.direct, out)
		if c.method == "thread/resume" || c.method == "thread/start" {
			h.openGate(cl)
		}
		return
	}
	h.appendEntry(&entry{gen: c.gen, line: out})
}

// withID re-encodes a JSON-RPC message with another id.
func withID(line []byte, id json.RawMessage) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		return nil, err
	}
	obj["id"] = id
	return json.Marshal(obj)
}

// openGate lets a re-attached client's replay begin: the turn active at its
// cursor is re-announced first, then every line after the cursor.
func (h *host) openGate(c *client) {
	if t := h.activeTurnAt(c.resumeAfter); t != nil {
		c.direct = append(c.direct, noticeLine(AdoptPrefix+t.id), t.line)
	}
	c.gated = false
	c.next = h.base
}

func (h *host) appendEntry(e *entry) {
	h.entries = append(h.entries, e)
	h.bytes += len(e.line)
	h.trim()
}

// trim drops the oldest entries beyond RetainBytes, never one the attached
// client has not been sent yet.
func (h *host) trim() {
	limit := h.base + len(h.entries)
	if c := h.client; c != nil && !c.gated {
		limit = c.next
	} else if c != nil {
		limit = h.base
	}
	k := 0
	for h.bytes > h.cfg.RetainBytes && h.base+k < limit && k < len(h.entries) {
		e := h.entries[k]
		h.bytes -= len(e.line)
		if e.seq > h.lostThrough {
			h.lostThrough = e.seq
		}
		k++
	}
	if k > 0 {
		h.entries = append([]*entry(nil), h.entries[k:]...)
		h.base += k
	}
}

// dropThrough forgets entries at or before seq (journaled by runnerd) and
// responses to earlier generations.
func (h *host) dropThrough(seq uint64, gen int) {
	kept := h.entries[:0]
	for _, e := range h.entries {
		if (e.seq != 0 && e.seq <= seq) || (e.seq == 0 && e.gen != gen) {
			h.bytes -= len(e.line)
			continue
		}
		kept = append(kept, e)
	}
	dropped := len(h.entries) - len(kept)
	for i := len(kept); i < len(h.entries); i++ {
		h.entries[i] = nil
	}
	h.entries = kept
	h.base += dropped
}

func (h *host) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go h.serveClient(conn)
	}
}

func peerIsSelf(conn net.Conn) bool {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	same := false
	_ = raw.Control(func(fd uintptr) {
		cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		same = err == nil && int(cred.Uid) == os.Getuid()
	})
	return same
}

func (h *host) serveClient(conn net.Conn) {
	if !peerIsSelf(conn) {
		conn.Close()
		return
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := readLine(br, maxHandshakeBytes)
	_ = conn.SetReadDeadline(time.Time{})
	var hs handshake
	if err != nil || len(raw) > maxHandshakeBytes || json.Unmarshal(raw, &hs) != nil {
		conn.Close()
		return
	}
	reply := func(r handshakeReply) bool {
		b, _ := json.Marshal(r)
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := conn.Write(append(b, '\n'))
		_ = conn.SetWriteDeadline(time.Time{})
		return err == nil
	}
	h.mu.Lock()
	var refuse string
	switch {
	case h.stopping:
		refuse = "the provider host is stopping"
	case hs.Reattach && h.initResult == nil:
		refuse = "the provider was never initialised; nothing to re-attach to"
	case !hs.Reattach && h.gen > 0:
		refuse = "a fresh session cannot attach to a provider that already served one"
	case hs.Reattach && hs.ResumeAfter < h.lostThrough:
		refuse = fmt.Sprintf("cannot replay from %d: lines through %d were dropped (replay buffer limit)", hs.ResumeAfter, h.lostThrough)
	}
	if refuse != "" {
		h.mu.Unlock()
		h.log.Warn("refusing a client", "reason", refuse)
		reply(handshakeReply{Error: refuse})
		conn.Close()
		return
	}
	if old := h.client; old != nil {
		h.log.Info("a newer client supersedes the attached one", "old_generation", old.gen)
		h.closeClient(old)
	}
	h.gen++
	c := &client{gen: h.gen, conn: conn, reattach: hs.Reattach, gated: hs.Reattach, resumeAfter: hs.ResumeAfter, next: h.base}
	h.client = c
	var answers [][]byte
	if hs.Reattach {
		h.dropThrough(hs.ResumeAfter, c.gen)
		c.next = h.base
		// Requests the dead client never answered can no longer be.
		for id, seq := range h.serverReqs {
			if seq <= hs.ResumeAfter {
				answers = append(answers, jsonrpc.EncodeError(json.RawMessage(id), -32000, "the runner restarted; request expired"))
				delete(h.serverReqs, id)
			}
		}
	}
	gen := c.gen
	h.mu.Unlock()
	h.log.Info("client attached", "generation", gen, "reattach", hs.Reattach, "resume_after", hs.ResumeAfter)
	for _, a := range answers {
		h.writeProvider(a)
	}
	if !reply(handshakeReply{OK: true}) {
		h.detach(c)
		return
	}
	go h.writeClient(c)
	for {
		line, err := readLine(br, MaxLineBytes)
		if err != nil {
			break // a partial last line (a client dying mid-write) is dropped
		}
		if len(line) > 0 {
			h.fromClient(c, line)
		}
	}
	h.detach(c)
}

func (h *host) fromClient(c *client, line []byte) {
	var m wire
	if err := json.Unmarshal(line, &m); err != nil {
		h.writeProvider(line)
		return
	}
	switch {
	case m.Method != "" && hasID(m.ID):
		h.mu.Lock()
		if c.closed {
			h.mu.Unlock()
			return
		}
		if c.reattach && m.Method == "initialize" {
			c.direct = append(c.direct, jsonrpc.EncodeResponse(m.ID, h.initResult))
			h.cond.Broadcast()
			h.mu.Unlock()
			return
		}
		hid := h.nextID
		h.nextID++
		h.calls[hid] = &call{gen: c.gen, clientID: append(json.RawMessage(nil), m.ID...), method: m.Method}
		h.mu.Unlock()
		out, err := withID(line, json.RawMessage(strconv.FormatInt(hid, 10)))
		if err != nil {
			return
		}
		h.writeProvider(out)
	case m.Method != "":
		if c.reattach && m.Method == "initialized" {
			return
		}
		h.writeProvider(line)
	default: // an answer to a server request
		h.mu.Lock()
		delete(h.serverReqs, string(bytes.TrimSpace(m.ID)))
		h.mu.Unlock()
		h.writeProvider(line)
	}
}

func (h *host) writeProvider(line []byte) {
	h.inMu.Lock()
	defer h.inMu.Unlock()
	buf := make([]byte, 0, len(line)+1)
	buf = append(append(buf, line...), '\n')
	if _, err := h.stdin.Write(buf); err != nil {
		h.log.Debug("provider stdin write failed", "err", err)
	}
}

// pending collects what c may be sent now; under h.mu.
func (h *host) pending(c *client) [][]byte {
	out := c.direct
	c.direct = nil
	if c.gated {
		return out
	}
	if c.next < h.base {
		c.next = h.base
	}
	for c.next < h.base+len(h.entries) {
		e := h.entries[c.next-h.base]
		c.next++
		switch {
		case e.seq == 0:
			if e.gen == c.gen && !e.delivered {
				e.delivered = true
				out = append(out, e.line)
			}
		case e.seq > c.resumeAfter:
			out = append(out, e.line, noticeLine(MarkPrefix+strconv.FormatUint(e.seq, 10)))
		}
	}
	return out
}

func (h *host) writeClient(c *client) {
	bw := bufio.NewWriterSize(c.conn, 64<<10)
	for {
		h.mu.Lock()
		var lines [][]byte
		for {
			if c.closed {
				h.mu.Unlock()
				return
			}
			lines = h.pending(c)
			if len(lines) > 0 || (h.outputDone && h.exited) {
				break
			}
			h.cond.Wait()
		}
		finished := len(lines) == 0
		h.mu.Unlock()
		if finished {
			// The provider is gone and everything was delivered: closing the
			// connection tells the driver (via the shim) the provider ended.
			h.mu.Lock()
			h.flushed = true
			h.closeClient(c)
			h.mu.Unlock()
			return
		}
		for _, l := range lines {
			_, _ = bw.Write(l)
			_ = bw.WriteByte('\n')
		}
		if err := bw.Flush(); err != nil {
			h.detach(c)
			return
		}
	}
}

// closeClient closes c; under h.mu.
func (h *host) closeClient(c *client) {
	if c.closed {
		return
	}
	c.closed = true
	_ = c.conn.Close()
	if h.client == c {
		h.client = nil
		h.detachedAt = time.Now()
	}
	h.cond.Broadcast()
}

func (h *host) detach(c *client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !c.closed {
		h.log.Info("client detached", "generation", c.gen)
	}
	h.closeClient(c)
}
