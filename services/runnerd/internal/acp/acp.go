// Package acp drives an ACP agent (SPEC R11: @agentclientprotocol/codex-acp
// or claude-agent-acp, or the fake of internal/testing/fakeacp) over the Agent
// Client Protocol on its stdio: newline-delimited JSON-RPC 2.0 (initialize,
// session/new, session/load, session/set_mode, session/set_model,
// session/prompt with session/update notifications, session/cancel, and the
// agent's session/request_permission). A Session satisfies the
// provider contract (package provider) directly.
//
// runnerd speaks ACP to the agent itself; the acpx CLI does not sit in
// between (docs/providers.md says why: acpx keeps its own detached queue
// owner and session index outside the scope root, and a one-shot CLI per
// turn would put a second supervisor between runnerd and the process group
// it must own).
//
// The agent runs in its own process group; Close (and any failure) kills
// the whole group, because neither real agent exits when its stdin closes.
// A durable, bounded state document (state.go) in Config.StateDir holds the
// session identity, checked on every resume, and the newest turns' records,
// from which a turn lost with its process is reconciled.
package acp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/acp/acpwire"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// The values this driver reports are the runner's (package provider).
type (
	TurnResult  = provider.TurnResult
	Usage       = provider.Usage
	ProcessInfo = provider.ProcessInfo
	Error       = provider.Error
)

// ClientName is sent as initialize.clientInfo.name.
const ClientName = prp.ClientName

// ProtocolVersion is the ACP version spoken.
const ProtocolVersion = 1

const (
	defaultStartupTimeout = 60 * time.Second
	defaultRequestTimeout = 60 * time.Second
	defaultCloseGrace     = 5 * time.Second
	// exitDrain: after the process exited, its stdout is read for at most
	// this long (a child may hold it open).
	exitDrain = 500 * time.Millisecond
	// eofWait: after stdout EOF a still-running agent has this long to exit
	// before the session fails with provider_stdout_closed.
	eofWait = time.Second
)

// Event priorities (PRP).
const (
	P0 = provider.P0
	P1 = provider.P1
	P2 = provider.P2
)

// Event is one agent observation mapped to a PRP event type: the
// provider contract's, handed to the runner as it is.
type Event = provider.Event

// Config describes the agent and the session.
type Config struct {
	// Command and Args start the agent (e.g. node …/codex-acp/dist/index.js).
	Command string
	Args    []string
	// Env is the agent's complete, allow-listed environment (SPEC E2).
	Env []string
	// Dir is the workspace: the process's working directory and the ACP
	// session cwd.
	Dir string
	// StateDir holds the durable state document (the scope root's acpx/).
	StateDir string
	// Agent is codex or claude; PermissionMode approve-all, approve-reads
	// or deny-all; Model the requested model ("" keeps the agent's).
	Agent, PermissionMode, Model string
	// ProfileDigest identifies the launch profile (pinned package and
	// command); "" derives one from Agent, Command and Args.
	ProfileDigest string
	// StartupTimeout bounds spawn to the initialize answer; RequestTimeout
	// every other request except session/prompt, which lasts the turn.
	StartupTimeout, RequestTimeout time.Duration
	Logger                         *slog.Logger
}

// Session is one agent process and its ACP session.
type Session struct {
	cfg   Config
	log   *slog.Logger
	emit  func(Event)
	conn  *jsonrpc.Conn
	stdin *os.File // the agent's stdin

	cmd      *exec.Cmd
	info     ProcessInfo
	loadable bool // agentCapabilities.loadSession

	emitMu   sync.Mutex
	mu       sync.Mutex
	st       *State // nil until OpenThread
	loading  bool   // session/load replays history: not this session's news
	active   *turn
	exitErr  error
	exited   chan struct{}
	procDone chan struct{} // closed when the process was reaped
	turnDone chan TurnResult
	closed   bool
	stderr   tail
}

// Start spawns the agent in its own process group and initializes ACP.
func Start(ctx context.Context, cfg Config, emit func(Event)) (*Session, error) {
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = defaultStartupTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = defaultRequestTimeout
	}
	if cfg.Agent != AgentCodex && cfg.Agent != AgentClaude {
		return nil, &Error{Code: failure.ProviderConfigInvalid, Message: fmt.Sprintf("ACP agent %q is not supported (codex, claude)", cfg.Agent)}
	}
	switch cfg.PermissionMode {
	case ApproveAll, ApproveReads, DenyAll:
	default:
		return nil, &Error{Code: failure.ProviderConfigInvalid, Message: fmt.Sprintf("ACP permission mode %q is not one of approve-all, approve-reads, deny-all", cfg.PermissionMode)}
	}
	if cfg.StateDir == "" {
		return nil, &Error{Code: failure.ProviderConfigInvalid, Message: "ACP state directory missing"}
	}
	if cfg.ProfileDigest == "" {
		cfg.ProfileDigest = ProfileDigest(cfg.Agent, cfg.Command, cfg.Args)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Session{cfg: cfg, log: log, emit: emit, exited: make(chan struct{}), procDone: make(chan struct{}), turnDone: make(chan TurnResult, 16)}
	if err := s.spawn(); err != nil {
		return nil, err
	}
	if err := s.initialize(ctx); err != nil {
		s.kill(time.Second)
		return nil, err
	}
	return s, nil
}

// ProfileDigest is sha256 over the agent and its launch command.
func ProfileDigest(agent, command string, args []string) string {
	b, _ := json.Marshal(map[string]any{"agent": agent, "command": command, "args": args})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// WorkspaceDigest identifies the workspace a session belongs to.
func WorkspaceDigest(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *Session) spawn() error {
	inR, inW, err := os.Pipe()
	if err != nil {
		return &Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return &Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW)
		return &Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = s.cfg.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = s.cfg.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := procgroup.Start(cmd); err != nil {
		closeAll(inR, inW, outR, outW, errR, errW)
		return &Error{Code: failure.ProviderSpawnFailed, Message: fmt.Sprintf("start %s: %v", s.cfg.Command, err)}
	}
	closeAll(inR, outW, errW)
	s.cmd = cmd
	pid := cmd.Process.Pid
	ticks, _ := procid.StartTicks(pid)
	s.info = ProcessInfo{PID: pid, PGID: pid, StartTicks: ticks, StartedAt: time.Now().UTC()}
	s.stdin = inW
	s.conn = jsonrpc.New(jsonrpc.Config{
		Name: "acp", Peer: "agent", In: inW, WriteTimeout: s.cfg.RequestTimeout, Logger: s.log,
		NewError:       func(code, msg string) error { return &Error{Code: code, Message: msg} },
		OnNotification: s.onNotify,
		OnRequest:      func(m jsonrpc.Message) { s.onRequest(m.ID, m.Method, m.Params) },
	})
	readerDone := make(chan error, 1)
	go func() {
		// A read error is no failure of its own: the supervisor decides.
		fatal, _ := s.conn.Serve(outR)
		readerDone <- fatal
	}()
	go s.stderr.consume(errR, s.log)
	go s.supervise(readerDone)
	s.log.Info("acp: agent started", "pid", pid, "agent", s.cfg.Agent)
	return nil
}

// supervise waits for the end of the process or of its stdout and fails
// the session once: the process group is killed, pending calls fail, and
// Exited closes.
func (s *Session) supervise(readerDone chan error) {
	waitDone := make(chan error, 1)
	go func() { waitDone <- s.cmd.Wait(); close(s.procDone) }()
	var cause *Error
	select {
	case werr := <-waitDone:
		// Read what the agent wrote before it died, for a short while.
		select {
		case <-readerDone: //nolint:errcheck // the reader's error says less than the exit's
		case <-time.After(exitDrain):
		}
		cause = &Error{Code: failure.ProviderProcessExited, Message: fmt.Sprintf("agent process %d %s", s.info.PID, describeExit(werr, s.cmd.ProcessState))}
	case rerr := <-readerDone:
		var fatal *Error
		if errors.As(rerr, &fatal) {
			cause = fatal
		} else {
			select {
			case werr := <-waitDone:
				cause = &Error{Code: failure.ProviderProcessExited, Message: fmt.Sprintf("agent process %d %s", s.info.PID, describeExit(werr, s.cmd.ProcessState))}
			case <-time.After(eofWait):
				cause = &Error{Code: failure.ProviderStdoutClosed, Message: fmt.Sprintf("agent process %d closed its stdout", s.info.PID)}
			}
		}
	}
	s.mu.Lock()
	closing := s.closed
	if closing {
		cause = &Error{Code: failure.ProviderClosed, Message: "the agent session was closed"}
	}
	s.exitErr = cause
	s.mu.Unlock()
	if tail := s.stderr.lines(); len(tail) > 0 && !closing {
		s.log.Warn("acp: agent ended", "code", cause.Code, "err", cause.Message, "stderr_tail", tail)
	}
	s.conn.Fail(cause)
	procgroup.Kill(s.info.PGID)
	close(s.exited)
}

func describeExit(err error, ps *os.ProcessState) string {
	if ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by signal " + signalName(ws.Signal())
		}
		return fmt.Sprintf("exited with status %d", ps.ExitCode())
	}
	if err != nil {
		return "ended: " + err.Error()
	}
	return "ended"
}

func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	}
	return sig.String()
}

func (s *Session) initialize(ctx context.Context) error {
	res, rpcErr, err := s.conn.Call(ctx, acpwire.MethodInitialize, acpwire.InitializeParams{
		ProtocolVersion: ProtocolVersion,
		ClientInfo:      &acpwire.Implementation{Name: ClientName, Title: "tether runnerd", Version: "0.1.0"},
	}, s.cfg.StartupTimeout, nil)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == failure.ProviderRequestTimeout {
			return &Error{Code: failure.ProviderInitializeTimeout, Message: e.Message}
		}
		return err
	}
	if rpcErr != nil {
		return &Error{Code: failure.ProviderInitializeProtocolError, Message: "initialize: " + rpcErr.String()}
	}
	var ans acpwire.InitializeResponse
	if err := json.Unmarshal(res, &ans); err != nil || ans.ProtocolVersion != ProtocolVersion {
		return &Error{Code: failure.ProviderInitializeProtocolError, Message: fmt.Sprintf("initialize: agent speaks ACP version %d, want %d", ans.ProtocolVersion, ProtocolVersion)}
	}
	s.loadable = ans.AgentCapabilities.LoadSession
	var agent acpwire.Implementation
	if ans.AgentInfo != nil {
		agent = *ans.AgentInfo
	}
	s.log.Info("acp: initialized", "agent", agent.Name, "agent_version", agent.Version, "load_session", s.loadable)
	return nil
}

// Process identifies the agent process.
func (s *Session) Process() ProcessInfo { return s.info }

// Exited is closed once the agent process is gone (or the session failed).
func (s *Session) Exited() <-chan struct{} { return s.exited }

// ExitErr is why the session ended (nil while it runs).
func (s *Session) ExitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exitErr == nil {
		return nil
	}
	return s.exitErr
}

// TurnDone delivers each finished turn.
func (s *Session) TurnDone() <-chan TurnResult { return s.turnDone }

// State returns a copy of the durable state (nil before OpenThread).
func (s *Session) State() *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return nil
	}
	c := *s.st
	c.Turns = append([]TurnRecord(nil), s.st.Turns...)
	return &c
}

// Close stops the agent: stdin closed, SIGTERM to its group, SIGKILL to the
// group after grace (neither real agent exits on stdin EOF alone).
func (s *Session) Close(ctx context.Context, grace time.Duration) error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if !already {
		if grace <= 0 {
			grace = defaultCloseGrace
		}
		s.kill(grace)
	}
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kill ends the process group: TERM, then KILL after grace (at once when the
// leader is gone), then waits for the supervisor.
func (s *Session) kill(grace time.Duration) {
	_ = s.stdin.Close()
	procgroup.Stop(context.Background(), s.info.PGID, s.procDone, grace)
	procgroup.Kill(s.info.PGID) // what outlived a TERM the agent obeyed
	<-s.exited
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

func (s *Session) send(ev Event) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.emit(ev)
}

// tail keeps the agent's last stderr lines (bounded) and logs them at debug
// level; a line that may carry a credential is not kept or logged.
type tail struct {
	mu    sync.Mutex
	ring  []string
	count int
}

const (
	tailLines   = 32
	tailLineMax = 512
)

func (t *tail) consume(f *os.File, log *slog.Logger) {
	defer f.Close()
	buf := make([]byte, 32<<10)
	var partial string
	for {
		n, err := f.Read(buf)
		if n > 0 {
			text := partial + string(buf[:n])
			lines := strings.Split(text, "\n")
			partial = lines[len(lines)-1]
			if len(partial) > tailLineMax {
				partial = partial[:tailLineMax]
			}
			for _, l := range lines[:len(lines)-1] {
				t.add(l, log)
			}
		}
		if err != nil {
			if partial != "" {
				t.add(partial, log)
			}
			return
		}
	}
}

func (t *tail) add(line string, log *slog.Logger) {
	if len(line) > tailLineMax {
		line = line[:tailLineMax]
	}
	low := strings.ToLower(line)
	for _, w := range []string{"key", "token", "secret", "bearer", "password", "authorization"} {
		if strings.Contains(low, w) {
			line = "[line withheld: it may carry a credential]"
			break
		}
	}
	log.Debug("acp: agent stderr", "line", line)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) < tailLines {
		t.ring = append(t.ring, line)
	} else {
		t.ring[t.count%tailLines] = line
	}
	t.count++
}

func (t *tail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.ring...)
}
