// Package runner is runnerd's durable main loop: it journals every event
// before sending it, keeps a command journal, supervises one provider
// session and stays connected to the runner gateway.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/durable"
)

// Outbox limit defaults and bounds.
const (
	DefaultMaxOutboxBytes = 16 << 20
	DefaultP0ReserveBytes = 1 << 20
	MinOutboxBytes        = 16 << 10
	MaxOutboxBytesLimit   = 512 << 20
)

// DefaultSemanticToolTimeout bounds a dynamic tool call's wait for its
// result when nothing else is configured.
const DefaultSemanticToolTimeout = 10 * time.Minute

// Exit codes.
const (
	ExitOK = 0
	// ExitError: invalid configuration or a local fatal error.
	ExitError = 1
	// ExitRecoverable: no gateway connection within the reconnect grace.
	ExitRecoverable = 3
	// ExitCredentialRefused: the gateway refused the credential (ticket
	// replayed, expired, wrong); a fresh bootstrap ticket is needed.
	ExitCredentialRefused = 4
)

// Config configures one runner. Exactly one transport is configured: a
// ConnectURL (ws:// to loopback = dial_ws_loopback, wss:// = dial_wss, with
// an optional CABundlePath) or the Listen* group (listen_ws).
type Config struct {
	ConnectURL   string
	CABundlePath string
	// listen_ws: runnerd listens on ListenAddress:ListenPort and serves
	// exactly ListenPath (= ListenPath(RunnerID)); TLS when both
	// ListenTLSCert and ListenTLSKey are set.
	ListenAddress string
	ListenPort    int
	ListenPath    string
	ListenTLSCert string
	ListenTLSKey  string

	StateDir           string
	RunnerID           string
	EnvironmentLeaseID string
	SessionID          string
	SessionScope       string
	Workspace          string
	// Provider is the launch profile name (package providerlaunch) this
	// runner drives: "" or "codex", "opencode", "acpx-codex", ... A run
	// whose input names another provider is refused. CodexCommand and
	// CodexArgs launch it (whatever its kind; --provider-command).
	Provider     string
	CodexCommand string
	CodexArgs    []string
	// ProviderHomeTemplate is handed to the driver (ProviderConfig.HomeTemplate).
	ProviderHomeTemplate string
	IdleTimeout          time.Duration
	ReconnectGrace       time.Duration
	// Ticket is the bootstrap credential (from the environment).
	Ticket        prp.Credential
	StartProvider StartFunc
	Logger        *slog.Logger
	RunnerVersion string
	// PathEnv is the PATH handed to the provider.
	PathEnv string

	// ProviderHost runs the provider under a provider host (see the
	// provhost package) so that it survives a runnerd crash; a runnerd
	// restarted on the same state dir re-attaches to it and the turn goes
	// on. ProviderDetachTimeout is how long a host waits for that.
	ProviderHost          bool
	ProviderDetachTimeout time.Duration
	// SilenceTimeout: a connection on which nothing arrived for this long
	// (the gateway pings regularly) is dropped and re-established. [60s]
	SilenceTimeout time.Duration

	// Outbox limits: non-P0 events may fill MaxOutboxBytes-P0ReserveBytes
	// of unacknowledged envelopes (beyond that the runner is in
	// backpressure and rejects them); P0 events may use the reserve; a P0
	// event beyond MaxOutboxBytes is unrecoverable. [16 MiB, 1 MiB]
	MaxOutboxBytes uint64
	P0ReserveBytes uint64

	// Tuning; zero values take the defaults in brackets.
	BackoffMin         time.Duration // [250ms]
	BackoffMax         time.Duration // [5s]
	DrainTimeout       time.Duration // [5s] wait for acks before exiting
	ProviderCloseGrace time.Duration // [5s]
	RequestTimeout     time.Duration // [60s] provider requests
	// SemanticToolTimeout bounds how long a dynamic tool call waits for
	// its tool.result; then it is answered failed with
	// semantic_tool_timeout (SPEC R8). [10m]
	SemanticToolTimeout time.Duration
	Tick                time.Duration // [100ms] timer resolution
	// TurnStartedWait [2ms] bounds how long a started turn waits for the
	// provider's turn.started (awaitTurnStarted).
	TurnStartedWait time.Duration

	// OutboxSynced, when set, is called after each outbox fsync (tests).
	OutboxSynced func([]durable.Record)
	// StateSaved, when set, is called after each save of the state
	// document (tests).
	StateSaved func(*runnerstate.State)
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Provider == "" {
		c.Provider = providerlaunch.Codex
	}
	def(&c.IdleTimeout, 10*time.Minute)
	def(&c.ReconnectGrace, 2*time.Minute)
	def(&c.BackoffMin, 250*time.Millisecond)
	def(&c.BackoffMax, 5*time.Second)
	def(&c.DrainTimeout, 5*time.Second)
	def(&c.ProviderCloseGrace, 5*time.Second)
	def(&c.RequestTimeout, 60*time.Second)
	def(&c.SemanticToolTimeout, DefaultSemanticToolTimeout)
	def(&c.Tick, 100*time.Millisecond)
	def(&c.TurnStartedWait, 2*time.Millisecond)
	def(&c.SilenceTimeout, 60*time.Second)
	if c.MaxOutboxBytes == 0 {
		c.MaxOutboxBytes = DefaultMaxOutboxBytes
	}
	if c.P0ReserveBytes == 0 {
		c.P0ReserveBytes = DefaultP0ReserveBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RunnerVersion == "" {
		c.RunnerVersion = "dev"
	}
}

// listening reports whether the listen_ws group is configured.
func (c *Config) listening() bool {
	return c.ListenAddress != "" || c.ListenPort != 0 || c.ListenPath != "" || c.ListenTLSCert != "" || c.ListenTLSKey != ""
}

// Mode is the configured transport mode.
func (c *Config) Mode() string {
	switch {
	case c.listening():
		return prp.ModeListenWS
	case strings.HasPrefix(c.ConnectURL, "wss://"):
		return prp.ModeDialWSS
	}
	return prp.ModeDialWSLoopback
}

func (c *Config) validate() error {
	switch {
	case c.ConnectURL != "" && c.listening():
		return errors.New("give either --connect-url or the --listen-* flags, not both")
	case c.ConnectURL == "" && !c.listening():
		return errors.New("--connect-url (dial_ws_loopback, dial_wss) or --listen-address/--listen-port/--listen-path (listen_ws) is required")
	case c.listening() && (c.ListenAddress == "" || c.ListenPort == 0 || c.ListenPath == ""):
		return errors.New("listen_ws needs --listen-address, --listen-port and --listen-path")
	case c.CABundlePath != "" && !strings.HasPrefix(c.ConnectURL, "wss://"):
		return errors.New("--ca-bundle-path is only valid with a wss:// --connect-url")
	}
	for name, v := range map[string]string{
		"--state-dir": c.StateDir, "--runner-id": c.RunnerID,
		"--environment-lease-id": c.EnvironmentLeaseID, "--session-id": c.SessionID,
		"--session-scope": c.SessionScope, "--workspace": c.Workspace, "--provider-command": c.CodexCommand,
	} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if !filepath.IsAbs(c.StateDir) || !filepath.IsAbs(c.Workspace) {
		return errors.New("--state-dir and --workspace must be absolute paths")
	}
	if c.MaxOutboxBytes < MinOutboxBytes || c.MaxOutboxBytes > MaxOutboxBytesLimit {
		return fmt.Errorf("--max-outbox-bytes must be %d..%d", MinOutboxBytes, MaxOutboxBytesLimit)
	}
	if c.P0ReserveBytes >= c.MaxOutboxBytes/2 {
		return errors.New("--p0-reserve-bytes must be less than half of --max-outbox-bytes")
	}
	if c.Ticket.Kind == "" {
		return fmt.Errorf("no bootstrap ticket (--bootstrap-ticket-fd or %s)", prp.EnvBootstrapTicket)
	}
	if c.StartProvider == nil {
		return errors.New("no provider starter")
	}
	return nil
}

type liveConn struct {
	id           int
	c            *prp.Conn
	cancel       context.CancelFunc
	connectionID string
	lastHeard    time.Time
}

type inbound struct {
	connID int
	f      *prpv1.Frame
	err    error
}

type dialResult struct {
	c       *prp.Conn
	cancel  context.CancelFunc
	welcome *prpv1.Welcome
	cred    prp.Credential
	err     error
	inbound bool           // listen_ws: the gateway dialed in
	used    prp.Credential // the credential the handshake presented
}

type exitPlan struct {
	code     int
	reason   string
	deadline time.Time
	// immediate exits without waiting for acks.
	immediate bool
}

// Runner is one runnerd process's state machine. All fields are owned by the
// loop goroutine.
type Runner struct {
	cfg      Config
	log      *slog.Logger
	store    *durable.Store
	st       *runnerstate.State
	outbox   *durable.Outbox
	dialer   *gatewayDialer
	listener *runnerListener
	inbound2 chan accepted // listen_ws: upgraded connections awaiting their handshake
	cred     prp.Credential
	boot     string
	self     *runnerstate.Process

	runCtx  context.Context
	wg      sync.WaitGroup
	inbound chan inbound
	dialed  chan dialResult

	conn              *liveConn
	connSeq           int
	dialing           bool
	nextDial          time.Time
	backoff           backoff.Backoff // the next gateway dial's delay
	disconnectedSince time.Time

	queue   *eventQueue
	prov    Provider
	provGen int
	// configuredEnv is the attached run's configured provider environment
	// (SPEC E2). It may hold provider credentials, so it is kept in memory
	// only: the persisted session input (the state document, which a
	// suspension archives) carries the policy without it.
	configuredEnv map[string]string
	// provTools is the digest of the dynamic tools the live provider's
	// thread was opened or resumed with (its tool contract).
	provTools string

	lastActivity time.Time
	exit         *exitPlan

	// reattach: a provider recorded by the previous runnerd process is to
	// be re-attached (hosted providers) before the loop starts.
	reattach bool
	// pendingCursor is the provider host cursor of the batch being
	// journaled (it goes on the batch's last record).
	pendingCursor uint64
	// held is a frame read while draining a batch of commands; the loop
	// handles it next.
	held *inbound
	// ackDirty: the acknowledged cursor moved since the last save. It is
	// persisted lazily (see applyAck).
	ackDirty bool

	// State snapshots (see saver.go): saveGen is the newest asked for,
	// savedGen the newest durable; saveErr is a failed write (fatal).
	saver             *stateSaver
	saveGen, savedGen uint64
	saveErr           error
	pendingAnswers    []pendingAnswer
	// intents is the intent log (nil: intents are made durable by saving
	// the state); covers maps a snapshot to the controller seq its state
	// covers, so the log is emptied once a durable one covers it all.
	intents    *durable.IntentLog
	intentsTo  uint64
	snapCovers map[uint64]uint64

	// holdEvents: events emitted now are held (heldEvents, no source seq
	// yet) and journaled with the next batch — the provider events after
	// a turn starts, or before the next state save at the latest (see
	// onCommands).
	holdEvents bool
	heldEvents []pendingEvent

	// interruptAsked is the turn a turn.interrupt reached the provider
	// for: its interrupted end is the asked-for one, not a crash's.
	interruptAsked string
	// lostTurn: a turn whose provider died with the previous runnerd
	// (no provider host); reconciled before the loop starts.
	lostTurn *runnerstate.Turn
	// pongDue: the provider process changed since the gateway last heard
	// (see pongIfDue).
	pongDue bool
	// cutTurnStart: a turn.start the previous runnerd process journaled
	// but did not finish (reconcileCutTurnStart).
	cutTurnStart *runnerstate.CommandRecord
	lostCause    string
	// requestsDirty: OpenRequests changed since the last save.
	requestsDirty bool
}

// Run runs runnerd until it decides to exit and returns the exit code.
func Run(ctx context.Context, cfg Config) (int, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return ExitError, err
	}
	r := &Runner{
		cfg:      cfg,
		log:      cfg.Logger,
		cred:     cfg.Ticket,
		boot:     bootID(),
		inbound:  make(chan inbound, 64),
		inbound2: make(chan accepted),
		dialed:   make(chan dialResult, 1),
		queue:    newEventQueue(),
		backoff:  backoff.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax, Jitter: true},
	}
	code, stop, err := r.open(ctx)
	if err != nil || stop {
		if r.listener != nil {
			r.listener.Close()
		}
		if r.outbox != nil {
			_ = r.outbox.Close()
		}
		if r.intents != nil {
			_ = r.intents.Close()
		}
		return code, err
	}
	r.log.Info("runner transport", "mode", cfg.Mode(), "connect_url", cfg.ConnectURL, "ca_bundle", cfg.CABundlePath != "")
	runCtx, cancel := context.WithCancel(context.Background())
	r.runCtx = runCtx
	r.saver = startSaver(r.store)
	defer r.saver.stop()
	if r.reattach {
		r.recoverProvider()
	} else if t := r.lostTurn; t != nil {
		r.lostTurn = nil
		r.recoverTurn(t, failure.ProviderProcessLost, r.lostCause)
	}
	if rec := r.cutTurnStart; rec != nil {
		r.cutTurnStart = nil
		r.reconcileCutTurnStart(rec)
	}
	code = r.loop(ctx)
	if r.ackDirty {
		_ = r.save() // the acknowledged cursor, for the next process
	}
	_ = r.settleSaves() // answers waiting for a snapshot go out before the goodbye
	if r.listener != nil {
		r.listener.Close()
	}
	r.closeConn(failure.RunnerExiting, "runnerd is exiting")
	cancel()
	r.wg.Wait()
	_ = r.outbox.Close()
	_ = r.intents.Close()
	r.log.Info("runnerd exiting", "code", code, "lifecycle", r.st.Lifecycle, "reason", r.st.LifecycleReason)
	return code, nil
}

// open loads or creates the state and the outbox. stop means exit at once.
func (r *Runner) open(ctx context.Context) (int, bool, error) {
	cfg := r.cfg
	store, err := durable.OpenStore(cfg.StateDir)
	if err != nil {
		return ExitError, true, fmt.Errorf("state dir: %w", err)
	}
	r.store = store
	if err := durable.EnsurePrivateDir(filepath.Join(cfg.StateDir, "codex-home")); err != nil {
		return ExitError, true, fmt.Errorf("codex home: %w", err)
	}
	st, err := store.Load()
	if err != nil {
		return ExitError, true, fmt.Errorf("runner_state_unreadable: %w", err)
	}
	id := runnerstate.Identity{
		RunnerInstanceID:    cfg.RunnerID,
		EnvironmentLeaseID:  cfg.EnvironmentLeaseID,
		NormalizedSessionID: cfg.SessionID,
		SessionScope:        cfg.SessionScope,
	}
	recovered := st != nil
	if st == nil {
		st = runnerstate.NewState(id)
	} else {
		if st.Identity.RunnerInstanceID != id.RunnerInstanceID || st.Identity.SessionScope != id.SessionScope ||
			st.Identity.NormalizedSessionID != id.NormalizedSessionID {
			return ExitError, true, fmt.Errorf("runner_state_identity_mismatch: state dir belongs to runner %q session %q scope %q",
				st.Identity.RunnerInstanceID, st.Identity.NormalizedSessionID, st.Identity.SessionScope)
		}
		if st.Lifecycle == runnerstate.LifecycleRevoked {
			r.log.Info("runner state is revoked; exiting without connecting")
			return ExitOK, true, nil
		}
		st.Identity.EnvironmentLeaseID = id.EnvironmentLeaseID
	}
	r.st = st
	il, intents, err := durable.OpenIntentLog(store.Dir)
	if err != nil {
		return ExitError, true, fmt.Errorf("intent log: %w", err)
	}
	r.intents = il
	if n := durable.ReplayIntents(st, intents); n > 0 {
		r.log.Info("commands journaled in the intent log after the last state save", "commands", n)
	}
	ob, dropped, err := durable.OpenOutbox(store.Dir, st.AckedSourceSeq)
	if err != nil {
		return ExitError, true, fmt.Errorf("outbox: %w", err)
	}
	if dropped > 0 {
		r.log.Warn("outbox had a torn tail; truncated", "bytes", dropped)
	}
	ob.AfterSync = cfg.OutboxSynced
	r.outbox = ob
	st.NextSourceSeq = max(st.NextSourceSeq, ob.LastSeq()+1, st.AckedSourceSeq+1)
	st.ProviderCursor = max(st.ProviderCursor, ob.ProviderCursor())

	self := &runnerstate.Process{PID: os.Getpid(), PGID: syscall.Getpgrp(), BootID: r.boot, StartedAt: time.Now().UTC()}
	if t, err := procStartTicks(self.PID); err == nil {
		self.StartTicks = t
	}
	r.self = self
	st.RunnerProcess = self
	st.Lifecycle = runnerstate.LifecycleConnecting
	st.LifecycleReason = ""
	if st.Backpressure {
		st.Lifecycle, st.LifecycleReason = runnerstate.LifecycleBackpressure, failure.OutboxSoftLimit
	}

	if recovered {
		r.settleEndedTurn()
	}
	var lostProvider *runnerstate.Process
	var lostTurn *runnerstate.Turn
	for _, rec := range st.ProcessedCommands {
		if rec.Status == runnerstate.StatusPending && rec.CommandType == CmdRunAttach {
			// run.attach only binds the run in this state (and may stop
			// an idle provider): running it again is harmless, so the
			// controller's resent one runs instead of failing the run as
			// indeterminate.
			rec.Reopen(runnerstate.StatusUnexecuted, "", "", nil)
			continue
		}
		if rec.Status == runnerstate.StatusPending && rec.CommandType == CmdTurnStart && recovered {
			r.cutTurnStart = rec // settled from the provider's thread (Run)
		}
		if rec.Status == runnerstate.StatusPending {
			rec.Status = runnerstate.StatusIndeterminate
			rec.Code = failure.ExecutionIndeterminate
			rec.Message = "runnerd restarted while the command was in progress; it is never re-executed"
		}
	}
	if recovered {
		st.ReconnectCount++
		if p := st.ProviderProcess; p != nil && cfg.ProviderHost {
			// The provider may have survived under its host: re-attach
			// before anything else (recoverProvider).
			r.reattach = true
		} else {
			if p != nil {
				lostProvider = p
				if sameProcessAlive(p.PID, p.StartTicks, p.BootID) && p.PGID > 0 {
					r.log.Warn("killing the provider process group left by the previous runnerd", "pid", p.PID, "pgid", p.PGID)
					_ = syscall.Kill(-p.PGID, syscall.SIGKILL)
				}
				st.ProviderProcess = nil
			}
			lostTurn = st.ActiveTurn
		}
	}
	if err := r.save(); err != nil {
		return ExitError, true, err
	}
	if err := r.intents.Reset(); err != nil { // the saved state holds them
		return ExitError, true, fmt.Errorf("intent log: %w", err)
	}
	if recovered {
		r.log.Info("recovered durable state", "next_source_seq", st.NextSourceSeq, "acked_source_seq", st.AckedSourceSeq,
			"outbox", ob.Len(), "reconnect_count", st.ReconnectCount)
		r.emit(P0, "runner.reconciled", "", "", map[string]any{
			"outcome":        "same_durable_session_resumed",
			"reconnectCount": st.ReconnectCount,
		})
		const lostMsg = "provider process did not survive the runnerd restart"
		if lostProvider != nil {
			r.emit(P0, "harness.exited", "", "", map[string]any{
				"code": failure.ProviderProcessLost, "message": lostMsg,
				"pid": lostProvider.PID, "pgid": lostProvider.PGID,
			})
		}
		// The turn is reconciled on a restarted provider once the loop's
		// machinery is up (Run).
		r.lostTurn, r.lostCause = lostTurn, lostMsg
		if !r.reattach {
			r.expireRequests(r.openRequestKeys(), failure.ProviderProcessLost)
		}
	}
	if cfg.listening() {
		l, err := newRunnerListener(&r.cfg, r.inbound2)
		if err != nil {
			return ExitError, true, err
		}
		r.listener = l
		r.log.Info("listening for the gateway (listen_ws)", "url", l.boundURL, "tls", l.isTLS)
	} else {
		d, err := newGatewayDialer(ctx, cfg.ConnectURL, cfg.CABundlePath)
		if err != nil {
			return ExitError, true, err
		}
		r.dialer = d
	}
	return ExitOK, false, nil
}

// save writes the state and waits until it is durable.
func (r *Runner) save() error {
	gen, err := r.saveAsync()
	if err != nil {
		return err
	}
	return r.waitSaved(gen)
}

// mustSave persists the state; a failure to persist is fatal for a durable
// runner (it could otherwise acknowledge what it cannot remember).
func (r *Runner) mustSave() {
	if err := r.save(); err != nil {
		r.log.Error("cannot persist runner state", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
	}
}

func (r *Runner) setExit(code int, reason string, immediate bool) {
	if r.exit != nil && r.exit.immediate {
		return
	}
	r.exit = &exitPlan{code: code, reason: reason, deadline: time.Now().Add(r.cfg.DrainTimeout), immediate: immediate}
}

func (r *Runner) loop(ctx context.Context) int {
	tick := time.NewTicker(r.cfg.Tick)
	defer tick.Stop()
	now := time.Now()
	r.lastActivity = now
	r.disconnectedSince = now
	for {
		if code, done := r.checkTimers(time.Now()); done {
			return code
		}
		if h := r.held; h != nil {
			r.held = nil
			r.handleInbound(*h)
			continue
		}
		var turnDone <-chan TurnResult
		var exited <-chan struct{}
		if r.prov != nil {
			turnDone, exited = r.prov.TurnDone(), r.prov.Exited()
		}
		var saved <-chan saveResult
		if r.saver != nil {
			saved = r.saver.done
		}
		select {
		case res := <-saved:
			r.onSaved(res)
		case <-ctx.Done():
			r.terminate()
			return r.exit.code
		case in := <-r.inbound:
			r.handleInbound(in)
		case d := <-r.dialed:
			r.handleDialed(d)
		case a := <-r.inbound2:
			r.startHandshake(a)
		case <-r.queue.signal:
			select {
			case res := <-turnDone:
				// The turn's last events and its terminal: one batch.
				r.onTurnDone(res)
			default:
				r.pumpProviderEvents()
			}
		case res := <-turnDone:
			r.onTurnDone(res)
		case <-exited:
			r.onProviderExit()
		case <-tick.C:
		}
	}
}

// checkTimers handles reconnects, the reconnect grace, idleness and exits.
func (r *Runner) checkTimers(now time.Time) (int, bool) {
	if r.exit != nil {
		if r.exit.immediate || now.After(r.exit.deadline) || r.outbox.Len() == 0 {
			return r.exit.code, true
		}
	}
	if r.conn != nil && now.Sub(r.conn.lastHeard) > r.cfg.SilenceTimeout {
		// A half-open connection: the gateway's pings stopped arriving.
		r.dropConn("gateway silent", fmt.Errorf("nothing received for %s", now.Sub(r.conn.lastHeard).Round(time.Millisecond)))
	}
	if r.conn == nil && !r.dialing {
		if r.exit == nil && now.Sub(r.disconnectedSince) >= r.cfg.ReconnectGrace {
			r.log.Error("no gateway connection within the reconnect grace", "grace", r.cfg.ReconnectGrace)
			r.stopProvider(failure.TransportReconnectDeadlineExceeded)
			r.setLifecycle(runnerstate.LifecycleRecoverableFailure, failure.TransportReconnectDeadlineExceeded)
			return ExitRecoverable, true
		}
		if r.dialer != nil && !now.Before(r.nextDial) {
			r.startDial()
		}
	}
	if r.exit == nil && r.st.ActiveTurn == nil && now.Sub(r.lastActivity) >= r.cfg.IdleTimeout {
		r.onIdle()
	}
	return 0, false
}

// onIdle ends a runner that has been idle for the idle timeout with no
// active turn. It has settled cleanly, so the exit is a durable suspension
// (lifecycle suspended, reason idle_timeout, provider thread kept), the
// state a later run may continue (SPEC E13); a revoked or unrecoverable
// runner stops instead. The runner exits 0 once its outbox drains.
func (r *Runner) onIdle() {
	const reason = failure.IdleTimeout
	if refusal := r.suspendRefusal(); refusal != nil {
		r.log.Info("session idle; stopping", failure.IdleTimeout, r.cfg.IdleTimeout, "lifecycle", r.st.Lifecycle)
		r.stopSession(reason)
		r.setExit(ExitOK, reason, false)
		return
	}
	r.log.Info("session idle; suspending", failure.IdleTimeout, r.cfg.IdleTimeout)
	if err := r.suspend(reason); err != nil {
		return // suspend set the immediate error exit
	}
	r.setExit(ExitOK, reason, false)
}

func (r *Runner) setLifecycle(l, reason string) {
	if r.st.Lifecycle == l && r.st.LifecycleReason == reason {
		return
	}
	r.st.Lifecycle, r.st.LifecycleReason = l, reason
	r.mustSave()
}

// terminate handles SIGTERM/SIGINT: end the turn, stop the provider.
func (r *Runner) terminate() {
	r.log.Info("terminating on signal")
	r.stopSession(failure.RunnerTerminated)
	r.setExit(ExitOK, failure.RunnerTerminated, false)
	// Give the outbox a brief chance to drain over a live connection.
	deadline := time.Now().Add(min(r.cfg.DrainTimeout, 2*time.Second))
	for r.conn != nil && r.outbox.Len() > 0 && time.Now().Before(deadline) {
		select {
		case in := <-r.inbound:
			r.handleInbound(in)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ---- connection ----

func (r *Runner) buildHello() *prpv1.Hello {
	st := r.st
	h := &prpv1.Hello{
		Identity: &prpv1.RunnerIdentity{
			RunnerInstanceId:    st.Identity.RunnerInstanceID,
			EnvironmentLeaseId:  st.Identity.EnvironmentLeaseID,
			NormalizedSessionId: st.Identity.NormalizedSessionID,
			SessionScope:        st.Identity.SessionScope,
			RunnerVersion:       r.cfg.RunnerVersion,
		},
		Resume: &prpv1.ResumeCursor{
			LastControllerSeq:    st.LastControllerCommandSeq,
			NextSourceSeq:        st.NextSourceSeq,
			AckedSourceSeq:       st.AckedSourceSeq,
			ConnectionGeneration: st.ReconnectCount,
		},
		RunnerProcess:   processProto(st.RunnerProcess),
		ProviderProcess: processProto(st.ProviderProcess),
		Lifecycle:       st.Lifecycle,
	}
	if len(st.SessionInput) > 0 {
		in := &prpv1.ExecutionInput{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(st.SessionInput, in); err == nil {
			h.SessionInput = in
		}
	}
	return h
}

func processProto(p *runnerstate.Process) *prpv1.ProcessInfo {
	if p == nil {
		return nil
	}
	pi := &prpv1.ProcessInfo{Pid: int32(p.PID), Pgid: int32(p.PGID), StartTicks: p.StartTicks, BootId: p.BootID}
	if !p.StartedAt.IsZero() {
		pi.StartedAt = nowTS(p.StartedAt)
	}
	return pi
}

func (r *Runner) startDial() {
	r.dialing = true
	hello := r.buildHello()
	cred := r.cred
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		res := r.dial(hello, cred)
		select {
		case r.dialed <- res:
		case <-r.runCtx.Done():
			if res.c != nil {
				res.cancel()
				_ = res.c.Close(websocket.StatusGoingAway, "runner exiting")
			}
		}
	}()
}

func (r *Runner) dial(hello *prpv1.Hello, cred prp.Credential) dialResult {
	ctx, cancel := context.WithCancel(r.runCtx)
	ws, err := r.dialer.Dial(ctx)
	if err != nil {
		cancel()
		return dialResult{err: err}
	}
	return handshake(ctx, cancel, ws, hello, cred)
}

// handshake runs the runner half of the PRP handshake on an open WebSocket.
func handshake(ctx context.Context, cancel context.CancelFunc, ws *websocket.Conn, hello *prpv1.Hello, cred prp.Credential) dialResult {
	c := prp.NewConn(ws)
	w, next, err := prp.ClientHandshake(ctx, c, cred, hello)
	if err != nil {
		_ = ws.CloseNow()
		cancel()
		return dialResult{err: err}
	}
	return dialResult{c: c, cancel: cancel, welcome: w, cred: next}
}

// startHandshake runs the handshake on an inbound (listen_ws) connection.
// The peer is untrusted until its challenge verifies.
func (r *Runner) startHandshake(a accepted) {
	hello := r.buildHello()
	cred := r.cred
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer a.release()
		ctx, cancel := context.WithCancel(r.runCtx)
		res := handshake(ctx, cancel, a.ws, hello, cred)
		res.inbound, res.used = true, cred
		select {
		case r.dialed <- res:
		case <-r.runCtx.Done():
			if res.c != nil {
				res.cancel()
				_ = res.c.Close(websocket.StatusGoingAway, "runner exiting")
			}
		}
	}()
}

func isCredentialRefusal(err error) bool {
	switch prp.CodeOf(err) {
	case failure.RunnerAuthFailed, failure.RunnerTicketReplayed, failure.RunnerCredentialExpired:
		return true
	}
	return false
}

func (r *Runner) handleDialed(d dialResult) {
	if !d.inbound {
		r.dialing = false
	}
	if d.err != nil && d.inbound {
		// Anyone who reaches the listener can fail a handshake; only a
		// refusal from a gateway that proved itself counts.
		// A refusal of a credential this runner no longer holds (a ticket
		// already exchanged for a lease by a concurrent handshake) is moot.
		if !(isCredentialRefusal(d.err) && prp.PeerVerified(d.err)) || d.used.Claims != r.cred.Claims {
			r.log.Warn("inbound runner connection failed its handshake", "err", d.err)
			return
		}
	}
	if d.err != nil {
		if isCredentialRefusal(d.err) {
			r.log.Error("gateway refused the runner credential", "code", prp.CodeOf(d.err), "err", d.err, "credential", r.cred)
			r.stopProvider(prp.CodeOf(d.err))
			r.setLifecycle(runnerstate.LifecycleRecoverableFailure, prp.CodeOf(d.err))
			r.setExit(ExitCredentialRefused, prp.CodeOf(d.err), true)
			return
		}
		wait := r.backoff.Next()
		r.nextDial = time.Now().Add(wait)
		r.log.Warn("gateway connect failed", "err", d.err, "retry_in", wait)
		return
	}
	if r.conn != nil {
		// listen_ws: the gateway dialed in again; the newer connection
		// takes over.
		old := r.conn
		r.conn = nil
		old.cancel()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = old.c.Close(websocket.StatusGoingAway, "superseded by a newer connection")
		}()
	}
	r.cred = d.cred
	r.backoff.Reset()
	r.connSeq++
	cctx, cancel := context.WithCancel(r.runCtx)
	stop := func() { cancel(); d.cancel() }
	lc := &liveConn{id: r.connSeq, c: d.c, cancel: stop, connectionID: d.welcome.GetConnectionId(), lastHeard: time.Now()}
	r.conn = lc
	r.wg.Add(1)
	go r.readLoop(cctx, lc)

	wa := d.welcome.GetAckedSourceSeq()
	produced := r.st.NextSourceSeq - 1
	switch {
	case wa > produced:
		r.log.Warn("welcome ACK beyond the produced source cursor; ignored", "welcome_acked", wa, "produced", produced)
	case wa > r.st.AckedSourceSeq:
		r.applyAck(wa)
	}
	if r.st.Lifecycle == runnerstate.LifecycleConnecting {
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleReady, ""
	}
	r.mustSave()
	r.log.Info("connected to gateway", "connection_id", lc.connectionID, "acked_source_seq", r.st.AckedSourceSeq,
		"outbox", r.outbox.Len(), "lease", d.welcome.GetLeaseExpiresAtUnixMs() != 0)
	r.sendRecords(r.outbox.After(r.st.AckedSourceSeq))
}

func (r *Runner) readLoop(ctx context.Context, lc *liveConn) {
	defer r.wg.Done()
	for {
		f, err := lc.c.Read(ctx)
		if err != nil && prp.CodeOf(err) == failure.RunnerProtocolError {
			// One undecodable frame; the connection itself is fine.
			r.log.Warn("ignoring undecodable frame", "err", err)
			continue
		}
		select {
		case r.inbound <- inbound{connID: lc.id, f: f, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// dropConn closes the live connection and schedules a reconnect.
func (r *Runner) dropConn(reason string, err error) {
	if r.conn == nil {
		return
	}
	r.log.Warn("gateway connection lost", "reason", reason, "err", err)
	lc := r.conn
	r.conn = nil
	lc.cancel()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = lc.c.Close(websocket.StatusGoingAway, "connection dropped")
	}()
	r.disconnectedSince = time.Now()
	wait := backoff.Jittered(r.backoff.Peek())
	r.nextDial = time.Now().Add(wait)
	r.st.ReconnectCount++
	if r.st.Lifecycle == runnerstate.LifecycleReady {
		r.st.Lifecycle = runnerstate.LifecycleConnecting
	}
	r.mustSave()
}

// closeConn sends a Goodbye and closes the connection at exit.
func (r *Runner) closeConn(code, msg string) {
	if r.conn == nil {
		return
	}
	lc := r.conn
	r.conn = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = lc.c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{Code: code, Message: msg}}})
	cancel()
	lc.cancel()
	_ = lc.c.Close(websocket.StatusNormalClosure, code)
}

func (r *Runner) write(f *prpv1.Frame) {
	if r.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.conn.c.Write(ctx, f); err != nil {
		r.dropConn("write failed", err)
	}
}

func (r *Runner) sendRecords(recs []durable.Record) {
	for _, fr := range batchFrames(recs) {
		if r.conn == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.conn.c.WriteRaw(ctx, fr)
		cancel()
		if err != nil {
			r.dropConn("write failed", err)
			return
		}
	}
}

func (r *Runner) handleInbound(in inbound) {
	if r.conn == nil || in.connID != r.conn.id {
		return // from a connection already dropped
	}
	if in.err != nil {
		r.dropConn("read failed", in.err)
		return
	}
	r.conn.lastHeard = time.Now()
	switch k := in.f.Kind.(type) {
	case *prpv1.Frame_Ack:
		r.onAck(k.Ack.GetAckedSourceSeq())
	case *prpv1.Frame_Replay:
		after := k.Replay.GetAfterSourceSeq()
		if after < r.st.AckedSourceSeq {
			r.log.Warn("replay requested from behind the durable cursor; sending what is retained",
				"after", after, "acked_source_seq", r.st.AckedSourceSeq)
		}
		r.sendRecords(r.outbox.After(after))
	case *prpv1.Frame_Command:
		r.lastActivity = time.Now()
		r.onCommands(in.connID, []*prpv1.Command{k.Command})
	case *prpv1.Frame_Ping:
		if r.ackDirty {
			// The gateway's keepalive bounds how stale the persisted
			// acknowledged cursor gets (see applyAck).
			r.mustSave()
		}
		r.pong(k.Ping.GetNonce())
	case *prpv1.Frame_Goodbye:
		r.dropConn("gateway goodbye: "+k.Goodbye.GetCode(), errors.New(k.Goodbye.GetMessage()))
	default:
		r.log.Warn("ignoring unexpected frame after welcome", "kind", fmt.Sprintf("%T", k))
	}
}

// pong answers a ping (nonce 0: unsolicited, when the provider process
// changed) with the runner's lifecycle, cursor and provider process.
func (r *Runner) pong(nonce uint64) {
	r.write(&prpv1.Frame{Kind: &prpv1.Frame_Pong{Pong: &prpv1.Pong{
		Nonce: nonce, Lifecycle: r.st.Lifecycle, AckedSourceSeq: r.st.AckedSourceSeq, OutboxBytes: r.outbox.Bytes(),
		ProviderProcess: processProto(r.st.ProviderProcess),
	}}})
}

// onAck applies a cumulative ACK, refusing out-of-range values.
func (r *Runner) onAck(n uint64) {
	produced := r.st.NextSourceSeq - 1
	switch {
	case n < r.st.AckedSourceSeq:
		r.log.Warn("refusing ACK: cumulative ACK cannot move behind the durable cursor", "ack", n, "acked_source_seq", r.st.AckedSourceSeq)
		return
	case n > produced:
		r.log.Warn("refusing ACK: cumulative ACK cannot move beyond the produced source cursor", "ack", n, "produced", produced)
		return
	case n == r.st.AckedSourceSeq:
		return
	}
	r.applyAck(n)
}

// applyAck moves the acknowledged cursor and trims the outbox.
//
// The cursor is persisted lazily: with the next state save (every command
// saves), at the latest at the gateway's next ping, and at exit. A stale
// cursor on disk only means that, after a crash, events the executor
// already persisted are replayed, and it drops them as identical
// duplicates; the outbox file keeps them until a compaction. Before a
// compaction the state (cursor and nextSourceSeq) is saved, so a compacted
// log never loses the seq high-water mark.
func (r *Runner) applyAck(n uint64) {
	r.st.AckedSourceSeq = n
	r.ackDirty = true
	r.outbox.Forget(n)
	if r.outbox.CompactDue() {
		if err := r.save(); err != nil {
			r.log.Error("cannot persist ACK", "err", err)
			r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
			return
		}
		if err := r.outbox.Compact(); err != nil {
			r.log.Error("outbox compaction failed", "err", err)
		}
	}
	r.relieveBackpressure()
}

// ---- events ----

// newEvent assigns the next source seq and builds the journaled envelope.
// The event is labelled with runID, or else with the attached run.
func (r *Runner) newEvent(prio uint32, typ, turnID, itemID, runID string, payload map[string]any) (durable.Record, error) {
	if prio > P2 {
		prio = P1
	}
	seq := r.st.NextSourceSeq
	ev := &prpv1.Event{
		Schema:              EventSchema,
		SourceInstanceId:    r.st.Identity.RunnerInstanceID,
		SourceEventId:       SourceEventID(r.st.Identity.RunnerInstanceID, seq),
		SourceSeq:           seq,
		SourceKind:          SourceKindRunner,
		NormalizedSessionId: r.st.Identity.NormalizedSessionID,
		TurnId:              turnID,
		ItemId:              itemID,
		EventType:           typ,
		SchemaVersion:       EventSchemaVersion,
		Priority:            prio,
		EmittedAt:           nowTS(time.Now()),
	}
	if runID != "" {
		ev.RunId = runID
	} else if r.st.CurrentRun != nil {
		ev.RunId = r.st.CurrentRun.RunID
	}
	s, err := toStruct(payload)
	if err != nil {
		return durable.Record{}, err
	}
	ev.Payload = s
	env, err := encodeEnvelope(ev)
	if err != nil {
		return durable.Record{}, err
	}
	if len(env) > maxEnvelopeBytes {
		s, _ := toStruct(map[string]any{
			"code":              failure.ProviderFrameTooLarge,
			"message":           fmt.Sprintf("%s event of %d bytes exceeds the frame limit", typ, len(env)),
			"originalEventType": typ,
		})
		ev.EventType, ev.Payload, ev.Priority = "harness.diagnostic", s, P1
		if env, err = encodeEnvelope(ev); err != nil {
			return durable.Record{}, err
		}
	}
	r.st.NextSourceSeq++
	return durable.Record{SourceSeq: seq, Priority: ev.Priority, EventType: ev.EventType, Envelope: env}, nil
}

type pendingEvent struct {
	prio                uint32
	typ, turnID, itemID string
	payload             map[string]any
	// runID labels the event (default: the attached run).
	runID string
}

// emitAll journals events (one fsync) and then sends them, within the
// outbox limits: a non-P0 event that does not fit below
// MaxOutboxBytes-P0ReserveBytes is rejected and puts the runner in
// backpressure (P0 runner.backpressure, lifecycle backpressure); P0 events
// may use the reserve; a P0 event beyond MaxOutboxBytes is unrecoverable.
// A rejected event takes no source seq, so seqs stay contiguous.
func (r *Runner) emitAll(evs []pendingEvent) {
	if r.holdEvents {
		r.heldEvents = append(r.heldEvents, evs...)
		return
	}
	if len(r.heldEvents) > 0 {
		evs = append(r.heldEvents, evs...)
		r.heldEvents = nil
	}
	recs := make([]durable.Record, 0, len(evs))
	opened := false // a runtime request or tool call is announced
	held := r.outbox.Bytes()
	soft := r.cfg.MaxOutboxBytes - r.cfg.P0ReserveBytes
	var add func(e pendingEvent) bool
	add = func(e pendingEvent) bool {
		rec, err := r.newEvent(e.prio, e.typ, e.turnID, e.itemID, e.runID, e.payload)
		if err != nil {
			r.log.Error("dropping unencodable event", "event_type", e.typ, "err", err)
			return true
		}
		size := uint64(len(rec.Envelope))
		switch {
		case rec.Priority == P0 && held+size > r.cfg.MaxOutboxBytes:
			r.st.NextSourceSeq = rec.SourceSeq
			r.log.Error("durable outbox limit exhausted by a P0 event", "event_type", rec.EventType, "outbox_bytes", held, "event_bytes", size,
				"max_outbox_bytes", r.cfg.MaxOutboxBytes)
			return false
		case rec.Priority != P0 && held+size > soft:
			r.st.NextSourceSeq = rec.SourceSeq
			r.st.BackpressureDropped++
			if !r.st.Backpressure {
				r.st.Backpressure = true
				r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleBackpressure, failure.OutboxSoftLimit
				r.log.Warn("outbox soft limit reached: backpressure; non-P0 events are rejected until acknowledged",
					"outbox_bytes", held, "soft_limit", soft)
				return add(pendingEvent{prio: P0, typ: "runner.backpressure", payload: map[string]any{
					"active": true, "outboxBytes": float64(held), "softLimitBytes": float64(soft),
					"maxOutboxBytes": float64(r.cfg.MaxOutboxBytes), "rejectedEventType": rec.EventType,
				}})
			}
			return true
		}
		held += size
		r.st.PeakOutboxBytes = max(r.st.PeakOutboxBytes, held)
		recs = append(recs, rec)
		label := e.runID
		if label == "" && r.st.CurrentRun != nil {
			label = r.st.CurrentRun.RunID
		}
		if r.trackRequest(e, label) {
			r.requestsDirty = true
			opened = opened || e.typ == "runtime_request.created" || e.typ == "semantic_tool.input"
		}
		return true
	}
	entered := r.st.Backpressure
	for _, e := range evs {
		if !add(e) {
			r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleUnrecoverable, failure.P0StorageExhausted
			r.journal(recs)
			_ = r.save()
			r.setExit(ExitError, failure.P0StorageExhausted, true)
			return
		}
	}
	if opened {
		// The state knows an announced request before the controller
		// does: a restarted runnerd announces it expired (SPEC R8).
		r.requestsDirty = false
		r.mustSave()
	}
	r.journal(recs)
	if r.st.Backpressure && !entered {
		r.mustSave()
	}
}

// journal appends recs to the outbox (one fsync) and sends them.
func (r *Runner) journal(recs []durable.Record) {
	if len(recs) == 0 {
		return
	}
	if r.pendingCursor > 0 {
		recs[len(recs)-1].ProviderCursor = r.pendingCursor
	}
	if err := r.outbox.Append(recs...); err != nil {
		r.log.Error("cannot journal events", "err", err)
		r.st.NextSourceSeq = recs[0].SourceSeq
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleUnrecoverable, failure.OutboxWriteFailed
		_ = r.save()
		r.setExit(ExitError, failure.OutboxWriteFailed, true)
		return
	}
	r.sendRecords(recs)
}

// relieveBackpressure leaves backpressure once acknowledgements brought the
// outbox to half the soft limit (hysteresis, so it does not flap).
func (r *Runner) relieveBackpressure() {
	if !r.st.Backpressure {
		return
	}
	soft := r.cfg.MaxOutboxBytes - r.cfg.P0ReserveBytes
	if r.outbox.Bytes() > soft/2 {
		return
	}
	dropped := r.st.BackpressureDropped
	r.st.Backpressure, r.st.BackpressureDropped = false, 0
	if r.st.Lifecycle == runnerstate.LifecycleBackpressure {
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleConnecting, ""
		if r.conn != nil {
			r.st.Lifecycle = runnerstate.LifecycleReady
		}
	}
	r.log.Info("backpressure relieved", "outbox_bytes", r.outbox.Bytes(), "rejected_events", dropped)
	r.emit(P0, "runner.backpressure", "", "", map[string]any{
		"active": false, "outboxBytes": float64(r.outbox.Bytes()), "rejectedEvents": float64(dropped),
	})
	r.mustSave()
}

// flushHeld journals (and sends) the held events.
func (r *Runner) flushHeld() {
	if len(r.heldEvents) == 0 {
		return
	}
	hold := r.holdEvents
	r.holdEvents = false
	r.emitAll(nil)
	r.holdEvents = hold
}

func (r *Runner) emit(prio uint32, typ, turnID, itemID string, payload map[string]any) {
	r.emitAll([]pendingEvent{{prio: prio, typ: typ, turnID: turnID, itemID: itemID, payload: payload}})
}

// pumpProviderEvents journals (one fsync) and sends every provider event
// queued so far.
func (r *Runner) pumpProviderEvents() {
	evs, cursor := r.providerEvents()
	r.journalProvider(evs, cursor)
}

// providerEvents drains the provider events queued so far, and the
// provider host cursor they reach (0: none).
func (r *Runner) providerEvents() ([]pendingEvent, uint64) {
	items := r.queue.drain()
	if len(items) == 0 {
		return nil, 0
	}
	r.lastActivity = time.Now()
	evs := make([]pendingEvent, 0, len(items))
	var cursor uint64
	for _, it := range items {
		if it.ev.Type == "" {
			cursor = max(cursor, it.ev.Cursor) // a provider host mark
			continue
		}
		evs = append(evs, pendingEvent{prio: it.ev.Priority, typ: it.ev.Type, turnID: it.ev.TurnID, itemID: it.ev.ItemID, payload: it.ev.Payload})
	}
	return evs, cursor
}

// journalProvider journals provider events and the events derived from
// them (one group commit: one fsync, then sent together).
func (r *Runner) journalProvider(evs []pendingEvent, cursor uint64) {
	if len(evs) == 0 && cursor == 0 && len(r.heldEvents) == 0 {
		return
	}
	// Held events go first, in the same fsync. The cursor is journaled
	// with the batch's last record: after a crash the host replays
	// exactly the lines after it.
	hold := r.holdEvents
	r.holdEvents = false
	r.pendingCursor = cursor
	r.emitAll(evs)
	r.pendingCursor = 0
	r.holdEvents = hold
	if cursor > r.st.ProviderCursor && (r.exit == nil || !r.exit.immediate) {
		r.st.ProviderCursor = cursor
	}
	if r.requestsDirty && !hold && r.exit == nil {
		// A request opened or settled: the state follows soon, so that a
		// restart knows what to announce expired (SPEC R8).
		r.requestsDirty = false
		r.saveSoon()
	}
}
