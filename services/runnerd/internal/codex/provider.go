package codex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// builtinTools answers the built-in tools runnerd offers every provider:
// tether_ask_user (SPEC E4) is answered at once (the executor records the
// interaction from the call's semantic_tool.input event); a call with bad
// arguments fails with the reason, so the model can correct it. Other tools
// are the run's own: they wait for the controller's tool.result.
func builtinTools(c ToolCall) (ToolOutput, bool) {
	if c.Tool != askuser.ToolName {
		return ToolOutput{}, false
	}
	if _, err := askuser.Parse(c.Arguments); err != nil {
		return TextOutput(false, err.Error()), true
	}
	return TextOutput(true, askuser.RecordedText()), true
}

// StartProvider is runnerd's provider.StartFunc for the codex profile: it
// starts a Session (Start) and serves it as a provider.Provider. A hosted provider runs
// under a provider host (see the provhost package): the driver talks to
// the host over its socket (provhost.Dial), and the host's marks become
// cursors.
func StartProvider(ctx context.Context, cfg provider.Config, emit func(provider.Event)) (provider.Provider, error) {
	ccfg := Config{
		Command:        cfg.Command,
		Args:           cfg.Args,
		Env:            cfg.Env,
		Dir:            cfg.Dir,
		CodexHome:      cfg.CodexHome,
		Model:          cfg.Model,
		ApprovalPolicy: cfg.ApprovalPolicy,
		Sandbox:        cfg.Sandbox,
		DynamicTools:   cfg.DynamicTools,
		ToolHandler:    builtinTools,
		ToolTimeout:    cfg.ToolTimeout,
		StartupTimeout: cfg.StartupTimeout,
		RequestTimeout: cfg.RequestTimeout,
		Logger:         cfg.Logger,
		// runnerd reconciles a turn its provider was lost in (SPEC R7).
		ReconcileOnExit: true,
	}
	var host *provhost.Info
	if cfg.Hosted {
		h, err := startHost(ctx, cfg)
		if err != nil {
			return nil, err
		}
		host = h
		conn, err := provhost.Dial(cfg.HostDir, cfg.Reattach, cfg.ResumeAfter)
		if err != nil {
			_ = provhost.Stop(host, closeGrace(cfg))
			code := failure.ProviderSpawnFailed
			if cfg.Reattach {
				code = failure.ProviderProcessLost
			}
			return nil, &provider.Error{Code: code, Message: err.Error()}
		}
		ccfg.Transport = conn
	}
	f := &markFilter{emit: emit}
	if cfg.Hosted {
		ccfg.Lines = f
	}
	s, err := Start(ctx, ccfg, f.handle)
	if err != nil {
		if host != nil {
			_ = provhost.Stop(host, closeGrace(cfg))
		}
		return nil, convertErr(err)
	}
	p := &providerSession{s: s, f: f, host: host, grace: closeGrace(cfg), done: make(chan TurnResult, 64), exited: make(chan struct{}), stop: make(chan struct{}), fwdDone: make(chan struct{})}
	if host != nil {
		p.hostDir = cfg.HostDir
	}
	go p.forward()
	return p, nil
}

func closeGrace(cfg provider.Config) time.Duration {
	if cfg.CloseGrace > 0 {
		return cfg.CloseGrace
	}
	return 5 * time.Second
}

// startHost finds the live host to re-attach to, or starts a new one (a
// leftover host is stopped first: a fresh provider never reuses it).
func startHost(ctx context.Context, cfg provider.Config) (*provhost.Info, error) {
	old, _ := provhost.ReadInfo(cfg.HostDir)
	if cfg.Reattach {
		if !old.HostAlive() || !old.ProviderAlive() {
			_ = provhost.Stop(old, closeGrace(cfg))
			return nil, &provider.Error{Code: failure.ProviderProcessLost, Message: "the provider host is gone"}
		}
		return old, nil
	}
	if old.HostAlive() {
		_ = provhost.Stop(old, closeGrace(cfg))
	}
	self, err := os.Executable()
	if err != nil {
		return nil, &provider.Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	in, err := provhost.Spawn(ctx, provhost.SpawnConfig{
		Self: self, Dir: cfg.HostDir, WorkDir: cfg.Dir, Env: cfg.Env, Command: cfg.Command, Args: cfg.Args,
		SeqBase: cfg.ResumeAfter, DetachTimeout: cfg.DetachTimeout, Grace: closeGrace(cfg),
	})
	if err != nil {
		return nil, &provider.Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	return in, nil
}

// markFilter turns the host's in-band marks into cursors and suppresses
// the turn.started a re-announced (adopted) turn causes a second time.
//
// The host follows each provider line but an answer with its mark. The
// events a line causes are held until its mark and handed on with the
// cursor on the last of them, the others marked More so that the runner
// takes them together: journaled in one batch with the cursor past their
// line. Handed on one by one, a runnerd killed after
// journaling a line's events but before its mark made the re-attached host
// replay the line, and its events were journaled twice.
//
// A turn's result does not pass through the filter: the driver delivers it
// on its own channel right after emitting the turn's last event (on the
// reader's goroutine, or on the runner's when a turn is reconciled), and
// the runner journals run.terminal with the events queued when it takes
// the result. The filter counts the events it was handed (handled) and
// handed on (released), and the provider passes a result on only once
// every event handled before it was released (waitReleased); otherwise a
// turn.completed still held for its line's mark was journaled after the
// turn's run.terminal (SPEC R7).
type markFilter struct {
	emit     func(provider.Event)
	mu       sync.Mutex
	suppress string
	held     []provider.Event
	inLine   bool          // the reader dispatches a line
	awaiting bool          // a line was read whose mark has not come yet
	marked   bool          // the line being read is a host notice (no mark follows it)
	bare     bool          // the next line comes without a mark (a re-announced turn)
	ended    bool          // the reader is done: nothing is held any more
	handled  uint64        // events handed in that are passed on (not marks, not suppressed)
	released uint64        // events handed on
	changed  chan struct{} // closed (and dropped) when released grows or the reader ends; nil until waited on
}

func (f *markFilter) LineStart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inLine, f.marked = true, false
}

func (f *markFilter) LineDone(answer bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inLine = false
	switch {
	case f.marked:
		f.marked = false
	case answer || f.bare:
		f.bare = false
		f.release(0)
	default:
		f.awaiting = true
	}
}

func (f *markFilter) ReaderDone() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended, f.inLine = true, false
	f.release(0)
	f.notify()
}

// handledCount is the number of events handed in so far that the filter
// passes on (at once or with their line's mark).
func (f *markFilter) handledCount() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handled
}

// waitReleased returns once n events were handed on, the reader ended (so
// nothing is held any more), or stop is closed. It must not run on the
// reader's goroutine: a mark only comes with the reader's next line.
func (f *markFilter) waitReleased(n uint64, stop <-chan struct{}) {
	for {
		f.mu.Lock()
		if f.released >= n || f.ended {
			f.mu.Unlock()
			return
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-stop:
			return
		}
	}
}

// notify wakes the waiters of waitReleased; under f.mu.
func (f *markFilter) notify() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// release hands on the held events, the last one carrying cursor (a bare
// mark when nothing is held and cursor is not 0); under f.mu.
func (f *markFilter) release(cursor uint64) {
	f.awaiting = false
	if len(f.held) == 0 {
		if cursor > 0 {
			f.emit(provider.Event{Cursor: cursor})
		}
		return
	}
	held := f.held
	f.held = nil
	held[len(held)-1].Cursor = cursor
	for i, ev := range held {
		ev.More = i < len(held)-1 // the runner takes the line's events together
		f.emit(ev)
	}
	f.released += uint64(len(held))
	f.notify()
}

func (f *markFilter) handle(ev Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.Type == "provider.notice.recorded" {
		if msg, _ := ev.Payload["message"].(string); msg != "" {
			if cursor, adopt, ok := provhost.ParseMark(msg); ok {
				f.marked = true
				if adopt != "" {
					f.suppress, f.bare = adopt, true
				} else {
					f.release(cursor)
				}
				return
			}
		}
	}
	if ev.Type == "turn.started" && f.suppress != "" && ev.TurnID == f.suppress {
		f.suppress = "" // already journaled by the previous runnerd
		return
	}
	out := provider.Event{Type: ev.Type, TurnID: ev.TurnID, ItemID: ev.ItemID, Priority: ev.Priority, Body: ev.Body, Payload: ev.Payload}
	f.handled++
	if !f.ended && (f.inLine || f.awaiting) {
		f.held = append(f.held, out)
		return
	}
	f.emit(out)
	f.released++ // nothing is held (or it would have been released first): no one waits
}

func convertErr(err error) error {
	var ce *Error
	if errors.As(err, &ce) {
		return &provider.Error{Code: ce.Code, Message: ce.Message}
	}
	return err
}

// providerSession is a Session as a provider.Provider: its turn results wait
// for the mark filter, and a hosted provider's exits are the host's record.
type providerSession struct {
	s       *Session
	f       *markFilter
	host    *provhost.Info // nil unless hosted
	hostDir string         // the host's directory (hosted only)
	grace   time.Duration
	done    chan TurnResult
	exited  chan struct{}
	stop    chan struct{}
	fwdDone chan struct{}
}

// forward relays turn results; once the session exits it forwards the
// results still buffered and only then reports the exit, so a turn that
// finished before the exit is never lost.
func (p *providerSession) forward() {
	defer close(p.fwdDone)
	for {
		select {
		case r := <-p.s.TurnDone():
			if !p.pass(r) {
				return
			}
		case <-p.s.Exited():
			for {
				select {
				case r := <-p.s.TurnDone():
					if !p.pass(r) {
						return
					}
				default:
					close(p.exited)
					return
				}
			}
		case <-p.stop:
			return
		}
	}
}

// pass hands r on to the runner once the events the filter was handed
// before it (the turn's completion event among them) were handed on, so
// the runner journals them before the turn's run.terminal; false when
// stopped. The driver emits a turn's last event before delivering its
// result, so the count taken now covers it (and perhaps a few events
// after it, whose line's mark follows as promptly).
func (p *providerSession) pass(r TurnResult) bool {
	p.f.waitReleased(p.f.handledCount(), p.stop)
	select {
	case p.done <- r:
		return true
	case <-p.stop:
		return false
	}
}

func (p *providerSession) Process() ProcessInfo {
	if h := p.host; h != nil {
		return ProcessInfo{PID: h.ProviderPID, PGID: h.ProviderPGID, StartTicks: h.ProviderStartTicks, StartedAt: h.ProviderStartedAt}
	}
	return p.s.Process()
}

func (p *providerSession) OpenThread(ctx context.Context, threadID string) (string, bool, error) {
	id, resumed, err := p.s.OpenThread(ctx, threadID)
	return id, resumed, p.convert(err)
}

func (p *providerSession) StartTurn(ctx context.Context, text string) (string, error) {
	id, err := p.s.StartTurn(ctx, text)
	return id, p.convert(err)
}

func (p *providerSession) TurnDone() <-chan TurnResult { return p.done }

func (p *providerSession) Steer(ctx context.Context, turnID, text string) error {
	return p.convert(p.s.Steer(ctx, turnID, text))
}

func (p *providerSession) Interrupt(ctx context.Context, turnID string) error {
	return p.convert(p.s.Interrupt(ctx, turnID))
}

func (p *providerSession) Exited() <-chan struct{} { return p.exited }

func (p *providerSession) ExitErr() error { return p.convert(p.s.ExitErr()) }

func (p *providerSession) Close(ctx context.Context, grace time.Duration) error {
	var herr error
	if p.host != nil {
		// The host stops the provider (stdin EOF, grace, TERM, KILL of its
		// group) and closes the shim's connection.
		herr = provhost.Stop(p.host, grace)
	}
	err := p.s.Close(ctx, grace)
	if err == nil {
		err = herr
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.fwdDone
	return convertErrOrNil(err)
}

// convert converts a driver error; for a hosted provider, an exit the
// driver saw as its shim's end names the provider's own (the host's
// record: "killed by signal SIGKILL"), SPEC R7.
func (p *providerSession) convert(err error) error {
	err = convertErrOrNil(err)
	var pe *provider.Error
	if p.hostDir == "" || !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case failure.ProviderProcessExited, failure.ProviderStdoutClosed, failure.ProviderTransportFailed:
	default:
		return err
	}
	ex := provhost.ReadExit(p.hostDir)
	if ex == nil {
		return err
	}
	return &provider.Error{Code: failure.ProviderProcessExited,
		Message: fmt.Sprintf("provider process %d %s (its driver saw: %s)", ex.ProviderPID, ex.Description, pe.Message)}
}

func convertErrOrNil(err error) error {
	if err == nil {
		return nil
	}
	return convertErr(err)
}

// ResolveRequest answers a pending runtime request (provider.RuntimeRequestProvider).
func (p *providerSession) ResolveRequest(ctx context.Context, requestID string, resolution provider.Resolution) (*prpv1.RuntimeRequestEvent, error) {
	res, err := p.s.ResolveRequest(ctx, requestID, resolution)
	return res, p.convert(err)
}

// AnswerToolCall answers a pending dynamic tool call (provider.RuntimeRequestProvider).
func (p *providerSession) AnswerToolCall(ctx context.Context, callID, turnID string, success bool, contentItems []*prpv1.ToolContentItem) (*prpv1.ToolCallEvent, error) {
	res, err := p.s.AnswerToolCall(ctx, callID, turnID, ToolOutput{Success: success, ContentItems: contentItems})
	return res, p.convert(err)
}

// ReconcileTurn settles a turn persisted as active before a restart
// (thread/read): the outcome is retained, terminalized (its TurnResult
// arrives on TurnDone) or missing (a provider_turn_missing error, which is
// recoverable).
func (p *providerSession) ReconcileTurn(ctx context.Context, turnID string) (outcome, status string, err error) {
	rec, err := p.s.ReconcileTurn(ctx, turnID)
	return rec.Outcome, rec.Status, p.convert(err)
}

// LastTurn returns the thread's newest turn id (provider.TurnReconciler).
func (p *providerSession) LastTurn(ctx context.Context) (string, error) {
	id, err := p.s.LastTurn(ctx)
	return id, p.convert(err)
}

// DropTurn removes a cut-off turn from the thread (provider.TurnDropper).
func (p *providerSession) DropTurn(ctx context.Context, turnID string) error {
	return p.convert(p.s.DropTurn(ctx, turnID))
}

var (
	_ provider.RuntimeRequestProvider = (*providerSession)(nil)
	_ provider.TurnReconciler         = (*providerSession)(nil)
	_ provider.TurnDropper            = (*providerSession)(nil)
)
