// Package codex supervises one `codex app-server` process (or a compatible
// fake) in its own process group and drives it over its stdio JSON-RPC
// protocol: initialize, thread/start|resume, turn/start, turn/steer,
// turn/interrupt. Provider notifications are mapped to PRP event types and
// handed to the caller's emit function in arrival order; each finished turn is
// also delivered on TurnDone.
//
// Concurrency: emit is called from the session's goroutines, one call at a
// time, never concurrently. It must not call Close (Close waits for the
// goroutine that is calling emit).
package codex

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// ClientName, ClientTitle and ClientVersion are sent as initialize.clientInfo.
const (
	ClientName    = prp.ClientName
	ClientTitle   = "tether runnerd"
	ClientVersion = "0.1.0"
)

const (
	defaultStartupTimeout = 30 * time.Second
	defaultRequestTimeout = 60 * time.Second
	// exitDrainWindow: after the process exited, stdout is read on until EOF
	// or until the reader made no progress for this long.
	exitDrainWindow = 200 * time.Millisecond
	// exitWait: after stdout EOF (or a broken stdin) a still-running process
	// has this long to exit before the session fails with
	// provider_stdout_closed (or provider_transport_failed).
	exitWait = time.Second
	// failGrace is the TERM grace used when the session fails on its own.
	failGrace = time.Second
	// startCleanupGrace is the grace used when Start fails after spawning.
	startCleanupGrace = time.Second
	// killWait bounds the wait for the group to vanish after SIGKILL.
	killWait = 5 * time.Second
	// pollInterval is how often the process group is checked while waiting.
	pollInterval = 10 * time.Millisecond
	// turnDoneBuffer is the capacity of the TurnDone channel.
	turnDoneBuffer = 64
)

// Event priorities (PRP): P0 is never dropped, P2 is coalescible.
const (
	PriorityP0 uint32 = 0
	PriorityP1 uint32 = 1
	PriorityP2 uint32 = 2
)

// Turn statuses in TurnResult.Status.
const (
	TurnCompleted   = provider.TurnCompleted
	TurnFailed      = provider.TurnFailed
	TurnInterrupted = provider.TurnInterrupted
)

// The values this driver reports are the runner's (package provider).
type (
	TurnResult  = provider.TurnResult
	Usage       = provider.Usage
	Artifact    = provider.Artifact
	ProcessInfo = provider.ProcessInfo
)

// Config describes how to spawn and drive the provider.
type Config struct {
	// Command and Args are executed as is (for the real codex: the native
	// binary and "app-server"). A Command without '/' is looked up in
	// runnerd's own PATH.
	Command string
	Args    []string
	// Env is the complete, allow-listed environment of the provider. Nothing
	// of runnerd's environment is inherited; nil means an empty environment.
	Env []string
	// Dir is the provider's working directory and the thread cwd.
	Dir string
	// CodexHome is informational here (the caller puts CODEX_HOME in Env and
	// may use WriteConfig); it is logged, never used to spawn.
	CodexHome string
	// Model, ApprovalPolicy and Sandbox go to thread/start when non-empty.
	Model, ApprovalPolicy, Sandbox string
	// DynamicTools are sent as thread/start dynamicTools (codex stores them
	// with the thread; they keep working after a resume). Each is
	// {type:"function", name, description, inputSchema} or a namespace.
	DynamicTools []provider.DynamicTool
	// ToolHandler answers dynamic tool calls (see ToolHandler); nil leaves
	// every call pending until AnswerToolCall.
	ToolHandler ToolHandler
	// ReconcileOnExit leaves the active turn to the caller when the
	// provider is lost (provider_process_exited, provider_stdout_closed; a
	// protocol failure still fails it): no turn.failed and no TurnResult
	// for it; the caller
	// restarts the provider and settles the turn with ReconcileTurn (SPEC
	// R7). Otherwise the turn fails with the exit's code.
	ReconcileOnExit bool
	// ToolTimeout bounds how long a dynamic tool call waits for its answer
	// (AnswerToolCall); then the driver answers it with success false and
	// the code semantic_tool_timeout (SPEC R8). Zero: no bound.
	ToolTimeout time.Duration
	// StartupTimeout bounds spawn-to-initialize-response (default 30s);
	// RequestTimeout bounds every other request (default 60s).
	StartupTimeout, RequestTimeout time.Duration
	// Logger receives operational logs (nil: discarded). Provider stderr is
	// logged at debug level, one sanitized, truncated line at a time.
	Logger *slog.Logger
	// Lines, when set, follows the reader through the provider's stdout
	// (a provider host marks every line but answers after it: the caller
	// holds a line's events until its mark).
	Lines LineObserver
	// Transport, when set, is the provider's stdio already connected (a
	// provider host's socket): no process is spawned, Command and Args
	// only name the provider in logs. Its end (the host closed it, or
	// closing it) is the provider process's end for the session; there is
	// no process group to signal and no stderr.
	Transport Transport
}

// Transport is a provider's stdio over one connection.
type Transport interface {
	io.Reader
	io.Writer
	SetWriteDeadline(time.Time) error
	// CloseWrite is the provider's stdin EOF.
	CloseWrite() error
	Close() error
}

// stdinWriter is the provider's stdin: a pipe, or a transport's write side.
type stdinWriter interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// LineObserver follows the reader through the provider's stdout. Its
// methods run on the reader goroutine.
type LineObserver interface {
	// LineStart: the reader dispatches a line now.
	LineStart()
	// LineDone: every event the line caused was emitted; answer says the
	// line answered a request of the driver's.
	LineDone(answer bool)
	// ReaderDone: stdout ended (or failed); nothing more is read.
	ReaderDone()
}

// Event is one provider observation mapped to a PRP event type.
type Event struct {
	Type     string
	TurnID   string
	ItemID   string
	Priority uint32
	// Body is a typed payload (provider.Event.Body); Payload otherwise.
	Body    proto.Message
	Payload map[string]any
}

// Session is one supervised provider process.
type Session struct {
	cfg    Config
	log    *slog.Logger
	emitFn func(Event)
	emitMu sync.Mutex

	cmd    *exec.Cmd // nil with a Transport
	info   ProcessInfo
	stdin  stdinWriter
	stdout io.ReadCloser
	stderr io.ReadCloser // nil with a Transport

	conn        *jsonrpc.Conn
	stdinClosed atomic.Bool
	stdinOnce   sync.Once

	readerBusy   atomic.Bool  // the reader is handling a frame
	readerFrames atomic.Int64 // frames handled so far

	mu            sync.Mutex
	threadID      string
	opening       bool
	starting      bool
	turn          *turnState
	usageBaseline *tokenTotals
	reported      map[string]bool
	serverReqs    map[string]*serverRequest // runtime requests by request id
	toolCalls     map[string]*pendingTool   // tool calls by call id
	failErr       *Error
	closing       bool
	readerFatal   *Error
	readerErr     error
	writeErr      *Error
	procState     *os.ProcessState

	turnDone        chan TurnResult
	exited          chan struct{}
	procDone        chan struct{}
	readerDone      chan struct{}
	stderrDone      chan struct{}
	writeBroken     chan struct{}
	writeBrokenOnce sync.Once
	termOnce        sync.Once
	termDone        chan struct{}
	killNow         chan struct{}
	killNowOnce     sync.Once
	monitorDone     chan struct{}
	stderrTail      stderrRing
}

// Start spawns the provider in its own process group and performs the
// initialize handshake. On error nothing is left running.
func Start(ctx context.Context, cfg Config, emit func(Event)) (*Session, error) {
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = defaultStartupTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = defaultRequestTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if emit == nil {
		emit = func(Event) {}
	}
	if cfg.Command == "" && cfg.Transport == nil {
		return nil, errorf(failure.ProviderSpawnFailed, "empty provider command")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Session{
		cfg:         cfg,
		log:         cfg.Logger,
		emitFn:      emit,
		reported:    make(map[string]bool),
		serverReqs:  make(map[string]*serverRequest),
		toolCalls:   make(map[string]*pendingTool),
		turnDone:    make(chan TurnResult, turnDoneBuffer),
		exited:      make(chan struct{}),
		procDone:    make(chan struct{}),
		readerDone:  make(chan struct{}),
		stderrDone:  make(chan struct{}),
		writeBroken: make(chan struct{}),
		termDone:    make(chan struct{}),
		killNow:     make(chan struct{}),
		monitorDone: make(chan struct{}),
	}
	deadline := time.Now().Add(cfg.StartupTimeout)
	if err := s.spawn(); err != nil {
		return nil, err
	}
	s.conn = s.newConn()
	go s.waitLoop()
	go s.readLoop()
	go s.stderrLoop()
	go s.monitor()

	if err := s.initialize(ctx, time.Until(deadline)); err != nil {
		_ = s.Close(context.Background(), startCleanupGrace)
		return nil, err
	}
	return s, nil
}

func (s *Session) spawn() error {
	if t := s.cfg.Transport; t != nil {
		s.stdin, s.stdout = transportStdin{t}, transportStdout{t}
		s.log.Info("codex: provider connected", "command", s.cfg.Command, "dir", s.cfg.Dir, "codex_home", s.cfg.CodexHome)
		return nil
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return errorf(failure.ProviderSpawnFailed, "stdin pipe: %s", err.Error())
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return errorf(failure.ProviderSpawnFailed, "stdout pipe: %s", err.Error())
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW)
		return errorf(failure.ProviderSpawnFailed, "stderr pipe: %s", err.Error())
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Dir = s.cfg.Dir
	// A non-nil (possibly empty) Env: exec inherits os.Environ() only for nil.
	cmd.Env = append(make([]string, 0, len(s.cfg.Env)), s.cfg.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := procgroup.Start(cmd); err != nil {
		closeAll(inR, inW, outR, outW, errR, errW)
		return errorf(failure.ProviderSpawnFailed, "start %s: %s", s.cfg.Command, err.Error())
	}
	startedAt := time.Now()
	closeAll(inR, outW, errW)
	s.cmd, s.stdin, s.stdout, s.stderr = cmd, inW, outR, errR
	pid := cmd.Process.Pid
	// The child leads a new group whose id is its pid (package procgroup).
	s.info = ProcessInfo{PID: pid, PGID: pid, StartedAt: startedAt}
	// The child is not reaped before waitLoop runs, so /proc/<pid> exists.
	if st, err := readProcStat(pid); err == nil {
		s.info.StartTicks = st.StartTicks
		if st.PGRP > 0 {
			s.info.PGID = st.PGRP
		}
	} else {
		s.log.Warn("codex: cannot read provider start time", "pid", pid, "err", err)
	}
	s.log.Info("codex: provider started", "pid", pid, "pgid", s.info.PGID, "command", s.cfg.Command, "args", len(s.cfg.Args), "dir", s.cfg.Dir, "codex_home", s.cfg.CodexHome)
	return nil
}

// transportStdin is a transport's write side; closing it is stdin's EOF.
type transportStdin struct{ t Transport }

func (w transportStdin) Write(p []byte) (int, error)        { return w.t.Write(p) }
func (w transportStdin) SetWriteDeadline(d time.Time) error { return w.t.SetWriteDeadline(d) }
func (w transportStdin) Close() error                       { return w.t.CloseWrite() }

// transportStdout is a transport's read side; closing it closes the
// transport (as a pipe's reader closing ends a provider's writes).
type transportStdout struct{ t Transport }

func (r transportStdout) Read(p []byte) (int, error) { return r.t.Read(p) }
func (r transportStdout) Close() error               { return r.t.Close() }

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

func (s *Session) initialize(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		return errorf(failure.ProviderInitializeTimeout, "no initialize response within %s", s.cfg.StartupTimeout)
	}
	params := codexwire.InitializeParams{
		ClientInfo:   codexwire.ClientInfo{Name: ClientName, Title: ClientTitle, Version: ClientVersion},
		Capabilities: &codexwire.Capabilities{ExperimentalAPI: true},
	}
	res, rpcErr, err := s.call(ctx, codexwire.MethodInitialize, params, timeout, nil)
	switch {
	case CodeOf(err) == failure.ProviderRequestTimeout:
		return errorf(failure.ProviderInitializeTimeout, "no initialize response within %s", s.cfg.StartupTimeout)
	case err != nil:
		return err
	case rpcErr != nil:
		return errorf(failure.ProviderInitializeProtocolError, "initialize rejected: %s", rpcErr.Describe())
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(res, &obj); err != nil || obj == nil {
		return errorf(failure.ProviderInitializeProtocolError, "initialize result is not a JSON object")
	}
	if err := s.notify("initialized", nil); err != nil {
		return err
	}
	return nil
}

// Process returns the identity of the provider process.
func (s *Session) Process() ProcessInfo { return s.info }

// StderrTail returns the last provider stderr lines (sanitized, truncated).
func (s *Session) StderrTail() []string { return s.stderrTail.snapshot() }

// ProcessState returns the provider's exit state once it was reaped, else nil.
func (s *Session) ProcessState() *os.ProcessState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procState
}

// TurnDone delivers one TurnResult per finished turn.
func (s *Session) TurnDone() <-chan TurnResult { return s.turnDone }

// Exited is closed once the session has failed or was closed; ExitErr then
// tells why.
func (s *Session) Exited() <-chan struct{} { return s.exited }

// ExitErr returns nil while the session is alive, else an *Error with code
// provider_process_exited, provider_stdout_closed, provider_frame_too_large,
// provider_transport_failed or provider_closed (after Close).
func (s *Session) ExitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr == nil {
		return nil
	}
	return s.failErr
}

// OpenThread starts a new thread (threadID == "") or resumes threadID. It
// emits session.started before any notification that follows the response.
func (s *Session) OpenThread(ctx context.Context, threadID string) (string, bool, error) {
	resumed := threadID != ""
	s.mu.Lock()
	switch {
	case s.threadID != "":
		open := s.threadID
		s.mu.Unlock()
		return "", false, errorf(failure.ProviderThreadAlreadyOpen, "thread %s is already open", open)
	case s.opening:
		s.mu.Unlock()
		return "", false, errorf(failure.ProviderThreadAlreadyOpen, "a thread is already being opened")
	}
	s.opening = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.opening = false
		s.mu.Unlock()
	}()

	// The tool contract: declared when the thread starts, and again when
	// it is resumed so that a provider restarted for another contract
	// serves the run's tools.
	var tools []json.RawMessage
	for _, t := range s.cfg.DynamicTools {
		b, err := json.Marshal(t)
		if err != nil {
			return "", false, errorf(failure.ProviderConfigInvalid, "dynamic tool: %v", err)
		}
		tools = append(tools, b)
	}
	method, failCode := codexwire.MethodThreadStart, failure.ProviderThreadStartFailed
	var params any = codexwire.ThreadStartParams{Cwd: s.cfg.Dir, ApprovalPolicy: s.cfg.ApprovalPolicy,
		Sandbox: s.cfg.Sandbox, Model: s.cfg.Model, DynamicTools: tools}
	if resumed {
		method, failCode = codexwire.MethodThreadResume, failure.ProviderThreadResumeFailed
		// excludeTurns: the full-history hydration is deprecated and can
		// exceed the frame limit on long threads.
		params = codexwire.ThreadResumeParams{ThreadID: threadID, ExcludeTurns: true, DynamicTools: tools}
	}
	var opened string
	onResult := func(raw json.RawMessage) error {
		var res struct {
			Thread struct {
				ID        string `json:"id"`
				SessionID string `json:"sessionId"`
			} `json:"thread"`
			Model string `json:"model"`
		}
		if err := json.Unmarshal(raw, &res); err != nil || res.Thread.ID == "" {
			return errorf(failure.ProviderProtocolError, "%s result has no thread.id", method)
		}
		if resumed && res.Thread.ID != threadID {
			return errorf(failure.ProviderThreadResumeMismatch, "thread/resume of %s returned thread %s", threadID, res.Thread.ID)
		}
		providerSession := res.Thread.SessionID
		if providerSession == "" {
			providerSession = res.Thread.ID
		}
		model := res.Model
		if model == "" {
			model = s.cfg.Model
		}
		s.mu.Lock()
		s.threadID = res.Thread.ID
		s.mu.Unlock()
		opened = res.Thread.ID
		s.emitFromReader(Event{Type: "session.started", Priority: PriorityP0, Payload: map[string]any{
			"threadId":          res.Thread.ID,
			"providerSessionId": providerSession,
			"resumed":           resumed,
			"model":             model,
		}})
		return nil
	}
	_, rpcErr, err := s.call(ctx, method, params, s.cfg.RequestTimeout, onResult)
	if err != nil {
		return "", false, err
	}
	if rpcErr != nil {
		return "", false, errorf(failCode, "%s: %s", method, rpcErr.Describe())
	}
	return opened, resumed, nil
}

// TurnOptions are optional turn/start settings.
type TurnOptions struct {
	// CollaborationMode "plan" or "default" (experimental in codex) is sent as
	// collaborationMode {mode, settings:{model, developer_instructions:null}};
	// empty leaves the thread's mode. codex offers request_user_input to the
	// model only in plan mode.
	CollaborationMode string
}

// StartTurn sends turn/start with one text input and returns the provider
// turn id once the response arrived. The turn's end is delivered on TurnDone.
func (s *Session) StartTurn(ctx context.Context, text string) (string, error) {
	return s.StartTurnWith(ctx, text, TurnOptions{})
}

// StartTurnWith is StartTurn with options.
func (s *Session) StartTurnWith(ctx context.Context, text string, opts TurnOptions) (string, error) {
	s.mu.Lock()
	thread := s.threadID
	switch {
	case thread == "":
		s.mu.Unlock()
		return "", errorf(failure.ProviderThreadNotOpen, "no open thread")
	case s.turn != nil:
		active := s.turn.id
		s.mu.Unlock()
		return "", errorf(failure.ProviderTurnActive, "turn %s is still active; steer or interrupt it", active)
	case s.starting:
		s.mu.Unlock()
		return "", errorf(failure.ProviderTurnActive, "a turn is already being started")
	}
	s.starting = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.starting = false
		s.mu.Unlock()
	}()

	var turnID string
	onResult := func(raw json.RawMessage) error {
		var res struct {
			Turn struct {
				ID string `json:"id"`
			} `json:"turn"`
		}
		if err := json.Unmarshal(raw, &res); err != nil || res.Turn.ID == "" {
			return errorf(failure.ProviderProtocolError, "turn/start result has no turn.id")
		}
		turnID = res.Turn.ID
		s.mu.Lock()
		var replaced string
		switch {
		case s.turn == nil:
			s.turn = &turnState{id: turnID}
		case s.turn.id != turnID:
			replaced = s.turn.id
			s.turn = &turnState{id: turnID}
		}
		s.mu.Unlock()
		if replaced != "" {
			s.diagnosticOnce(failure.ProviderUnknownTurn, "turn/start", turnID, "", "provider announced turn "+replaced+" before the turn/start response named "+turnID)
		}
		return nil
	}
	params := codexwire.TurnStartParams{ThreadID: thread, Input: codexwire.TextInput(text)}
	if opts.CollaborationMode != "" {
		model := s.cfg.Model
		if model == "" {
			model = "default"
		}
		params.CollaborationMode = &codexwire.CollaborationMode{Mode: opts.CollaborationMode,
			Settings: codexwire.CollaborationSettings{Model: model}}
	}
	_, rpcErr, err := s.call(ctx, codexwire.MethodTurnStart, params, s.cfg.RequestTimeout, onResult)
	if err != nil {
		return "", err
	}
	if rpcErr != nil {
		return "", errorf(failure.ProviderTurnStartFailed, "turn/start: %s", rpcErr.Describe())
	}
	return turnID, nil
}

// Steer adds input to the active turn (turn/steer with expectedTurnId).
func (s *Session) Steer(ctx context.Context, turnID, text string) error {
	thread, err := s.openThread()
	if err != nil {
		return err
	}
	params := codexwire.TurnSteerParams{ThreadID: thread, ExpectedTurnID: turnID, Input: codexwire.TextInput(text)}
	_, rpcErr, err := s.call(ctx, codexwire.MethodTurnSteer, params, s.cfg.RequestTimeout, nil)
	if err != nil {
		return err
	}
	if rpcErr != nil {
		return errorf(failure.ProviderSteerFailed, "turn/steer: %s", rpcErr.Describe())
	}
	return nil
}

// Interrupt asks the provider to stop turnID (turn/interrupt). The turn then
// ends with status interrupted on TurnDone.
func (s *Session) Interrupt(ctx context.Context, turnID string) error {
	thread, err := s.openThread()
	if err != nil {
		return err
	}
	params := codexwire.TurnInterruptParams{ThreadID: thread, TurnID: turnID}
	_, rpcErr, err := s.call(ctx, codexwire.MethodTurnInterrupt, params, s.cfg.RequestTimeout, nil)
	if err != nil {
		return err
	}
	if rpcErr != nil {
		return errorf(failure.ProviderInterruptFailed, "turn/interrupt: %s", rpcErr.Describe())
	}
	return nil
}

func (s *Session) openThread() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr != nil {
		return "", s.failErr
	}
	if s.threadID == "" {
		return "", errorf(failure.ProviderThreadNotOpen, "no open thread")
	}
	return s.threadID, nil
}

// Close stops the provider: close stdin, wait up to grace for it to exit,
// SIGTERM the process group, wait up to grace, SIGKILL the group; then reap
// and wait for the session's goroutines. Idempotent. When ctx ends first the
// group is killed at once and ctx's error returned (after reaping).
func (s *Session) Close(ctx context.Context, grace time.Duration) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.startTermination(grace)
	select {
	case <-s.monitorDone:
		return nil
	case <-ctx.Done():
		s.killNowOnce.Do(func() { close(s.killNow) })
		<-s.monitorDone
		return ctx.Err()
	}
}

func putNonEmpty(m map[string]any, k, v string) {
	if v != "" {
		m[k] = v
	}
}
