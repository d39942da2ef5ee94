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
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
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
	// whose input names another provider is refused. ProviderCommand and
	// ProviderArgs launch it, whatever its kind (--provider-command,
	// --provider-arg).
	Provider        string
	ProviderCommand string
	ProviderArgs    []string
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
	Tick                time.Duration // [100ms] timer resolution (while a timer is pending, see wakeIn)
	// TurnStartedWait [2ms] bounds how long a started turn waits for the
	// provider's turn.started (awaitTurnStarted).
	TurnStartedWait time.Duration
	// AttachFollowWindow [2ms] bounds how long a run.attach waits for the
	// command behind it (see onCommands): well under one save of the state.
	AttachFollowWindow time.Duration
	// TurnEndFollowWindow [5ms] bounds how long the provider events that
	// end the active turn (its turn.<status>) wait for the turn's result,
	// which every driver delivers right behind that event, to be journaled
	// with its run.terminal (see pumpQueued).
	TurnEndFollowWindow time.Duration
	// TurnSnapshotEvery [1s]: turn after turn, their ends are saved in the
	// state document at most this often (saveTurnEnd).
	TurnSnapshotEvery time.Duration

	// OutboxSynced, when set, is called after each outbox fsync (tests).
	OutboxSynced func([]statedir.Record)
	// TimerFired, when set, is called each time the loop wakes for its
	// timers alone (tests).
	TimerFired func()
	// StateSaved, when set, is called after each save of the state
	// document, with the state as that save wrote it (tests).
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
	def(&c.AttachFollowWindow, 2*time.Millisecond)
	def(&c.TurnEndFollowWindow, 5*time.Millisecond)
	def(&c.TurnSnapshotEvery, time.Second)
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
		"--session-scope": c.SessionScope, "--workspace": c.Workspace, "--provider-command": c.ProviderCommand,
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

type exitPlan struct {
	code     int
	reason   string
	deadline time.Time
	// immediate exits without waiting for acks.
	immediate bool
}

// Runner is one runnerd process's state machine: it composes the journal
// (journal.go: outbox, intents, state snapshots, answers, held events), the
// link to the gateway (link.go: dial/listen, handshake, backoff) and the
// provider supervisor (supervisor.go), and decides what commands, provider
// events and connection changes do to the durable state. All fields are
// owned by the loop goroutine.
type Runner struct {
	cfg  Config
	log  *slog.Logger
	st   *runnerstate.State
	j    *journal
	link *link
	sup  *supervisor
	boot string
	self *runnerstate.Process

	lastActivity time.Time
	exit         *exitPlan

	// reattach: a provider recorded by the previous runnerd process is to
	// be re-attached (hosted providers) before the loop starts.
	reattach bool
	// held is a frame read while draining a batch of commands; the loop
	// handles it next.
	held *inbound

	// interruptAsked is the turn a turn.interrupt reached the provider
	// for: its interrupted end is the asked-for one, not a crash's.
	interruptAsked string
	// streamed is the agent text the active turn streamed so far (its
	// newest agentMessage item, as journaled): a cut-off turn's partial
	// output (partialOutput).
	streamed streamedText
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

// journalFailed implements journalHost: the state can no longer be
// persisted, so the runner exits at once.
func (r *Runner) journalFailed() { r.setExit(ExitError, failure.RunnerStateWriteFailed, true) }

// Run runs runnerd until it decides to exit and returns the exit code.
func Run(ctx context.Context, cfg Config) (int, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return ExitError, err
	}
	r := &Runner{
		cfg:  cfg,
		log:  cfg.Logger,
		boot: bootID(),
		link: newLink(&cfg),
		sup:  newSupervisor(cfg.StartProvider),
	}
	code, stop, err := r.open(ctx)
	if err != nil || stop {
		r.link.stopListening()
		if r.j != nil {
			r.j.close()
		}
		return code, err
	}
	r.log.Info("runner transport", "mode", cfg.Mode(), "connect_url", cfg.ConnectURL, "ca_bundle", cfg.CABundlePath != "")
	runCtx, cancel := context.WithCancel(context.Background())
	r.link.ctx = runCtx
	r.j.startSaving()
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
	if r.j.ackDirty || r.j.saveOnAck != 0 || !r.j.outcomesOwed.IsZero() || !r.j.snapDue.IsZero() {
		_ = r.j.save() // the acknowledged cursor (and what waited for it, and outcomes only the intent log has), for the next process
	}
	_ = r.j.settleSaves() // answers waiting for a snapshot go out before the goodbye
	r.link.stopListening()
	r.link.goodbye(failure.RunnerExiting, "runnerd is exiting")
	cancel()
	r.link.wg.Wait()
	r.j.close()
	r.log.Info("runnerd exiting", "code", code, "lifecycle", r.st.Lifecycle, "reason", r.st.LifecycleReason)
	return code, nil
}

// open loads or creates the state and opens the journal and the transport.
// stop means exit at once.
func (r *Runner) open(ctx context.Context) (int, bool, error) {
	cfg := r.cfg
	store, err := statedir.OpenStore(cfg.StateDir)
	if err != nil {
		return ExitError, true, fmt.Errorf("state dir: %w", err)
	}
	if err := statedir.EnsurePrivateDir(filepath.Join(cfg.StateDir, "codex-home")); err != nil {
		return ExitError, true, fmt.Errorf("codex home: %w", err)
	}
	st, err := store.Load()
	if err != nil {
		return ExitError, true, fmt.Errorf("runner_state_unreadable: %w", err)
	}
	recovered := st != nil
	if st, err = r.adoptState(st); err != nil {
		return ExitError, true, err
	}
	if st.Lifecycle == runnerstate.LifecycleRevoked && recovered {
		r.log.Info("runner state is revoked; exiting without connecting")
		return ExitOK, true, nil
	}
	r.st = st
	if r.j, err = openJournal(store, st, &r.cfg, r); err != nil {
		return ExitError, true, err
	}
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
		r.recallTurnEvent()
		r.settleEndedTurn()
	}
	r.settleCutCommands(recovered)
	var lostProvider *runnerstate.Process
	if recovered {
		lostProvider = r.takeOverProvider()
	}
	if err := r.j.save(); err != nil {
		return ExitError, true, err
	}
	if err := r.j.intents.Reset(); err != nil { // the saved state holds them
		return ExitError, true, fmt.Errorf("intent log: %w", err)
	}
	// A stage an online checkpoint left behind (runnerd or its gateway
	// died during it) is never uploaded now: the next checkpoint stages
	// afresh.
	_ = os.RemoveAll(filepath.Join(store.Dir, CheckpointStageDir))
	if recovered {
		r.announceRecovery(lostProvider)
	}
	if err := r.link.open(ctx, &r.cfg); err != nil {
		return ExitError, true, err
	}
	return ExitOK, false, nil
}

// adoptState checks that a state loaded from the state dir (st) belongs to
// this runner and takes this process's environment lease, or creates the
// state of a new runner (st nil).
func (r *Runner) adoptState(st *runnerstate.State) (*runnerstate.State, error) {
	cfg := r.cfg
	id := runnerstate.Identity{
		RunnerInstanceID:    cfg.RunnerID,
		EnvironmentLeaseID:  cfg.EnvironmentLeaseID,
		NormalizedSessionID: cfg.SessionID,
		SessionScope:        cfg.SessionScope,
	}
	if st == nil {
		return runnerstate.NewState(id), nil
	}
	if st.Identity.RunnerInstanceID != id.RunnerInstanceID || st.Identity.SessionScope != id.SessionScope ||
		st.Identity.NormalizedSessionID != id.NormalizedSessionID {
		return nil, fmt.Errorf("runner_state_identity_mismatch: state dir belongs to runner %q session %q scope %q",
			st.Identity.RunnerInstanceID, st.Identity.NormalizedSessionID, st.Identity.SessionScope)
	}
	st.Identity.EnvironmentLeaseID = id.EnvironmentLeaseID
	return st, nil
}

// settleCutCommands settles the commands the previous runnerd process left
// pending: a run.attach runs again when resent, a turn.start is settled
// from the provider's thread (reconcileCutTurnStart, after open), any
// other is indeterminate and never executed again.
func (r *Runner) settleCutCommands(recovered bool) {
	for _, rec := range r.st.ProcessedCommands {
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
}

// takeOverProvider decides, for a recovered state, what becomes of the
// provider the previous runnerd process recorded: re-attached under its
// host (recoverProvider, in Run), or killed and forgotten with its active
// turn to be reconciled (lostTurn). It returns the lost provider, if any.
func (r *Runner) takeOverProvider() *runnerstate.Process {
	st := r.st
	st.ReconnectCount++
	if p := st.ProviderProcess; p != nil && r.cfg.ProviderHost {
		// The provider may have survived under its host: re-attach
		// before anything else (recoverProvider).
		r.reattach = true
		return nil
	}
	p := st.ProviderProcess
	if p != nil {
		if sameProcessAlive(p.PID, p.StartTicks, p.BootID) && p.PGID > 0 {
			r.log.Warn("killing the provider process group left by the previous runnerd", "pid", p.PID, "pgid", p.PGID)
			procgroup.Kill(p.PGID)
		}
		st.ProviderProcess = nil
	}
	r.lostTurn = st.ActiveTurn
	return p
}

// announceRecovery emits what a recovered runner owes the controller:
// runner.reconciled, harness.exited for a provider that did not survive,
// and the expiry of the requests it had open.
func (r *Runner) announceRecovery(lostProvider *runnerstate.Process) {
	st := r.st
	r.log.Info("recovered durable state", "next_source_seq", st.NextSourceSeq, "acked_source_seq", st.AckedSourceSeq,
		"outbox", r.j.outbox.Len(), "reconnect_count", st.ReconnectCount)
	r.emitBody(P0, prp.EventRunnerReconciled, "", &prpv1.RunnerReconciled{
		Outcome: "same_durable_session_resumed", ReconnectCount: uint32(st.ReconnectCount),
	})
	const lostMsg = "provider process did not survive the runnerd restart"
	if lostProvider != nil {
		r.emitBody(P0, prp.EventHarnessExited, "", &prpv1.HarnessExited{
			Code: failure.ProviderProcessLost, Message: lostMsg, Pid: int32(lostProvider.PID), Pgid: int32(lostProvider.PGID),
		})
	}
	// The turn is reconciled on a restarted provider once the loop's
	// machinery is up (Run).
	r.lostCause = lostMsg
	if !r.reattach {
		r.expireRequests(r.openRequestKeys(), failure.ProviderProcessLost)
	}
}

// mustSave persists the state; a failure to persist is fatal for a durable
// runner (it could otherwise acknowledge what it cannot remember).
func (r *Runner) mustSave() {
	if err := r.j.save(); err != nil {
		r.log.Error("cannot persist runner state", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
	}
}

// saveSoon has the state written without waiting (for changes nobody waits
// on); a failure is fatal as for mustSave.
// saveWhenAcked has the state saved (saveTurnEnd) once the controller
// acknowledged source seq seq: a turn's end, whose run.terminal the
// executor commits meanwhile — the snapshot's syncs (a rewrite, two
// fsyncs) then no longer compete with that commit for the disk, on the
// turn's critical path. Nothing waits for this snapshot: the turn's end is
// journaled, so a runnerd killed before it finds the end in its outbox and
// settles the active turn (settleEndedTurn, SPEC R8), and any earlier save
// holds it. Without a connection, once saveOnAckWait passed, and at exit
// it is saved anyway.
func (r *Runner) saveWhenAcked(seq uint64) {
	if !r.link.connected() || seq <= r.st.AckedSourceSeq {
		r.saveSoon()
		return
	}
	if r.j.saveOnAck == 0 {
		r.j.owedSince = time.Now()
	}
	r.j.saveOnAck = max(r.j.saveOnAck, seq)
}

// saveOnAckWait bounds how long a snapshot waits for its acknowledgement.
const saveOnAckWait = time.Second

// saveTurnEnd saves the state of an acknowledged turn's end (saveWhenAcked)
// at once when the newest snapshot was asked for TurnSnapshotEvery ago or
// earlier; else once that much time passed and no turn is active — or at
// the next acknowledged turn's end, whichever comes first. Turn after turn,
// the state document is then rewritten about once a second instead of once
// a turn (its temporary file, two fsyncs and a rename competed with the
// next turn for the cores). Nothing is lost meanwhile: each turn's
// commands and their outcomes are in the intent log (the outcome records
// carry the active and last turn), each turn's end in the outbox
// (settleEndedTurn clears a turn the state still has active, SPEC R8), and
// a stale acknowledged cursor only replays what the executor drops as
// duplicates; the log is emptied and the outbox compacted only behind a
// durable snapshot.
func (r *Runner) saveTurnEnd() {
	r.j.saveOnAck = 0
	if due := r.j.snappedAt.Add(r.cfg.TurnSnapshotEvery); time.Now().Before(due) {
		if r.j.snapDue.IsZero() {
			r.j.snapDue = due
		}
		return
	}
	r.saveSoon()
}

// outcomeSnapshotWait bounds how long outcomes stay in the intent log only
// while a turn runs.
const outcomeSnapshotWait = 10 * time.Second

func (r *Runner) saveSoon() {
	if _, err := r.j.saveAsync(); err != nil && r.j.saveErr == nil {
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
	timer := time.NewTimer(r.cfg.Tick)
	defer timer.Stop()
	start := time.Now()
	r.lastActivity = start
	r.link.disconnectedSince = start
	for {
		now := time.Now()
		if code, done := r.checkTimers(now); done {
			return code
		}
		if h := r.held; h != nil {
			r.held = nil
			r.handleInbound(*h)
			continue
		}
		timer.Reset(r.wakeIn(now))
		turnDone, exited := r.sup.signals()
		select {
		case res := <-r.j.results():
			r.j.onSaved(res)
		case <-ctx.Done():
			r.terminate()
			return r.exit.code
		case in := <-r.link.inbound:
			r.handleInbound(in)
		case d := <-r.link.dialed:
			r.handleDialed(d)
		case a := <-r.link.accepted:
			r.startHandshake(a)
		case <-r.sup.queue.signal:
			select {
			case res := <-turnDone:
				// The turn's last events and its terminal: one batch.
				r.onTurnDone(res)
			default:
				r.pumpQueued(turnDone, exited)
			}
		case res := <-turnDone:
			r.onTurnDone(res)
		case <-exited:
			r.onProviderExit()
		case <-timer.C:
			if r.cfg.TimerFired != nil {
				r.cfg.TimerFired()
			}
		}
	}
}

// wakeIn is how long the loop may wait for its next event before
// checkTimers has something to do: a Tick while anything it checks often
// is pending (an exit, no connection, a snapshot owed), else until the
// live connection's silence or the session's idleness is due. A connected,
// settled runnerd (a warm session between turns) then no longer wakes
// itself, and its Go runtime, every Tick.
func (r *Runner) wakeIn(now time.Time) time.Duration {
	tick := r.cfg.Tick
	if r.exit != nil || !r.link.connected() || r.j.saveOnAck != 0 || !r.j.snapDue.IsZero() || !r.j.outcomesOwed.IsZero() {
		return tick
	}
	next := r.link.live.lastHeard.Add(r.cfg.SilenceTimeout)
	if r.st.ActiveTurn == nil {
		if idle := r.lastActivity.Add(r.cfg.IdleTimeout); idle.Before(next) {
			next = idle
		}
	}
	return max(next.Sub(now), tick)
}

// checkTimers handles reconnects, the reconnect grace, idleness and exits.
func (r *Runner) checkTimers(now time.Time) (int, bool) {
	if r.exit != nil {
		if r.exit.immediate || now.After(r.exit.deadline) || r.j.outbox.Len() == 0 {
			return r.exit.code, true
		}
	}
	if silent := r.link.silentFor(now); silent > r.cfg.SilenceTimeout {
		// A half-open connection: the gateway's pings stopped arriving.
		r.dropConn("gateway silent", fmt.Errorf("nothing received for %s", silent.Round(time.Millisecond)))
	}
	if !r.link.connected() && !r.link.dialing {
		if r.exit == nil && now.Sub(r.link.disconnectedSince) >= r.cfg.ReconnectGrace {
			r.log.Error("no gateway connection within the reconnect grace", "grace", r.cfg.ReconnectGrace)
			r.stopProvider(failure.TransportReconnectDeadlineExceeded)
			r.setLifecycle(runnerstate.LifecycleRecoverableFailure, failure.TransportReconnectDeadlineExceeded)
			return ExitRecoverable, true
		}
		if r.link.dialDue(now) {
			r.startDial()
		}
	}
	if r.j.saveOnAck != 0 && now.Sub(r.j.owedSince) >= saveOnAckWait {
		r.saveSoon()
	}
	if due := r.j.snapDue; !due.IsZero() && !now.Before(due) && r.st.ActiveTurn == nil && r.exit == nil {
		r.saveSoon()
	}
	if since := r.j.outcomesOwed; !since.IsZero() && r.exit == nil {
		// Outcomes only the intent log holds: the turn's end saves them
		// (saveWhenAcked); without a turn, or a long one, or a log grown
		// large, a snapshot of its own.
		age := now.Sub(since)
		if (r.st.ActiveTurn == nil && age >= saveOnAckWait) || age >= outcomeSnapshotWait ||
			r.j.intents.Size() >= intentLogResetBytes {
			r.saveSoon()
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
	for r.link.connected() && r.j.outbox.Len() > 0 && time.Now().Before(deadline) {
		select {
		case in := <-r.link.inbound:
			r.handleInbound(in)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
