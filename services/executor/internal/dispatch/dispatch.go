// Package dispatch claims due runs and drives each one through the runner
// gateway under a fenced lease: it opens RunnerGateway/Attach with its fencing
// token, persists every relayed event idempotently, acknowledges the highest
// contiguous source seq and records the outcome.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/services/executor/internal/livesession"
	"github.com/tether-run/tether/services/executor/internal/recovery"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/session"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
)

// Config configures a Dispatcher.
type Config struct {
	// Owner identifies this executor replica in leases.
	Owner string
	// LeaseTTL is the lease duration; renewals run every LeaseTTL/3.
	LeaseTTL time.Duration
	// PollInterval bounds how long a due run waits when no notification
	// arrives.
	PollInterval time.Duration
	// MaxActive bounds concurrently driven runs.
	MaxActive int
	// MaxAttachFailures is how many consecutive failed attaches a run
	// tolerates before it fails with the last error's code.
	MaxAttachFailures int
	// RetryDelay separates a failed attempt from the next (E11; default 30s).
	RetryDelay time.Duration
	// Clock returns the current time (tests inject one).
	Clock func() time.Time
	// AdvertiseAddr is where this replica serves the executor API; it is
	// recorded with each lease so other replicas can forward steering and
	// resolutions to the live session.
	AdvertiseAddr string
	// NoSameHostTakeover disables taking over, before expiry, leases whose
	// controller on this host is provably dead.
	NoSameHostTakeover bool
	// Metrics registers the dispatcher's counters (optional).
	Metrics prometheus.Registerer
	// Router gives each claimed run the gateway its session scope is
	// placed on (SPEC F2); nil: every run goes to Gateway.
	Router Router
	// Gateway is the one gateway of a dispatcher without a Router.
	Gateway gatewayv1.RunnerGatewayClient
	Logger  *slog.Logger
	// Secrets resolves runs' secret references (SPEC T3) for the attach
	// sent to the run's gateway; nil: a run naming a secret fails
	// (secret_unreadable).
	Secrets *secrets.Vault
}

// Router routes a claimed run to its session scope's gateway, placing the
// scope first when it has none (fleet.Router). A scope that cannot be placed
// now is gateway_capacity_exhausted: the run goes back to the queue.
type Router interface {
	Route(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput) (gatewayv1.RunnerGatewayClient, error)
}

// PlacedRouter is a Router that also routes from a placement read
// beforehand, under its share lock, with the gateways' state for TTL (the
// claiming transaction's, store.Claim.Preread).
type PlacedRouter interface {
	Router
	TTL() time.Duration
	RoutePlaced(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput, p *store.Placement) (gatewayv1.RunnerGatewayClient, error)
}

// MoveTaker is a Router that tells whether routing a run moved its session
// scope off its lost gateway (fleet.Router.TakeMove).
type MoveTaker interface {
	TakeMove(runID string) (from string, ok bool)
}

// DefaultOwner names this process: host:pid.
func DefaultOwner() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}

// Dispatcher claims and drives runs.
type Dispatcher struct {
	cfg    Config
	store  *store.Store
	leases *leaseKeeper
	log    *slog.Logger
	kick   chan struct{}
	wg     sync.WaitGroup
	self   store.Controller

	mu       sync.Mutex
	cancels  map[string]chan *executorv1.Cancellation // per driven run: its pending cancellation, or nil (read it)
	replaced map[string]bool                          // runs whose warm session was closed for a new configuration
	// localReplace: runs whose gateway cannot checkpoint (no backup
	// verifier); their warm session is replaced on its local state.
	localReplace map[string]bool
	controls     *livesession.Registry
	metrics      *metrics
	// kicked: runs submitted to this replica whose claim loop was already
	// woken (KickRun); their database notification is redundant here.
	kicked map[string]struct{}
	// fleet: the live replicas and their capacity (fair claims).
	fleet fleetView
	// runCtx and sem are Run's context and its slots of driven runs, set
	// while Run claims (nil before and once it stops): SubmitAndClaim
	// drives a run it claimed under them.
	runCtx context.Context
	sem    chan struct{}
	// claiming is closed when Run's claim loop has stopped.
	claiming chan struct{}
	// ackWaiters: CancelRun calls of this replica waiting for a run's
	// cancellation to be acknowledged (AwaitCancellationAck).
	ackWaiters map[string][]chan *executorv1.Cancellation
}

// Controls is the registry of this replica's live provider sessions, for
// steering and runtime-request resolution.
func (d *Dispatcher) Controls() *livesession.Registry { return d.controls }

// New returns a Dispatcher.
func New(s *store.Store, cfg Config) *Dispatcher {
	if cfg.Owner == "" {
		cfg.Owner = DefaultOwner()
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 60 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.MaxActive == 0 {
		cfg.MaxActive = 64
	}
	if cfg.MaxAttachFailures == 0 {
		cfg.MaxAttachFailures = 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = recovery.RetryDelay
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	self := SelfController()
	self.Addr = cfg.AdvertiseAddr
	m := newMetrics(cfg.Metrics, s)
	return &Dispatcher{
		metrics: m,
		cfg:     cfg, store: s, log: cfg.Logger, self: self,
		leases:   newLeaseKeeper(s, cfg.Owner, cfg.LeaseTTL, cfg.Logger, m),
		kick:     make(chan struct{}, 1),
		cancels:  map[string]chan *executorv1.Cancellation{},
		replaced: map[string]bool{}, localReplace: map[string]bool{}, kicked: map[string]struct{}{},
		controls: livesession.NewRegistry(func() string { return store.NewID("") }),
	}
}

// CancelKick tells the run's driver, if this replica drives it, that a
// cancellation is waiting to be dispatched (the driver reads it).
func (d *Dispatcher) CancelKick(runID string) { d.DispatchCancellation(runID, nil) }

// DispatchCancellation hands the run's driver, if this replica drives it,
// the pending cancellation rec just recorded, so it dispatches it without
// reading it back (SPEC P2); nil makes the driver read it.
func (d *Dispatcher) DispatchCancellation(runID string, rec *executorv1.Cancellation) {
	d.mu.Lock()
	ch := d.cancels[runID]
	d.mu.Unlock()
	if ch != nil {
		select {
		case ch <- rec:
		default: // a kick is waiting: the driver reads the record then
		}
	}
}

// AwaitCancellationAck returns a channel that receives once when a driver
// of this replica acknowledged a cancellation of run runID (the provider
// was told to stop and the record says so): the record as the
// acknowledging commit left it, or nil when the driver does not have it
// (the caller reads it), and a function that stops waiting. A caller
// registers before it records the cancellation, so it cannot miss the
// acknowledgement; a run driven by another replica never sends on it.
func (d *Dispatcher) AwaitCancellationAck(runID string) (<-chan *executorv1.Cancellation, func()) {
	ch := make(chan *executorv1.Cancellation, 1)
	d.mu.Lock()
	if d.ackWaiters == nil {
		d.ackWaiters = map[string][]chan *executorv1.Cancellation{}
	}
	d.ackWaiters[runID] = append(d.ackWaiters[runID], ch)
	d.mu.Unlock()
	return ch, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		ws := d.ackWaiters[runID]
		for i, w := range ws {
			if w == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(d.ackWaiters, runID)
		} else {
			d.ackWaiters[runID] = ws
		}
	}
}

// cancellationAcked wakes the waiters of run runID's acknowledgement,
// handing them rec, the record as the acknowledging commit left it (nil:
// not at hand).
func (d *Dispatcher) cancellationAcked(runID string, rec *executorv1.Cancellation) {
	d.mu.Lock()
	ws := d.ackWaiters[runID]
	delete(d.ackWaiters, runID)
	d.mu.Unlock()
	for _, ch := range ws {
		ch <- rec // buffered, each waiter's own, sent once
	}
}

// Kick wakes the claim loop (a run was submitted).
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// maxKicked bounds the runs remembered by KickRun.
const maxKicked = 1024

// KickRun wakes the claim loop for a run submitted to this replica (after
// its commit). The database notification of the same submission
// (NotifiedRun) then wakes it no more: the claim attempt that follows this
// kick already sees the run.
func (d *Dispatcher) KickRun(runID string) {
	d.mu.Lock()
	if len(d.kicked) >= maxKicked {
		clear(d.kicked) // notifications lost (listener down): forget them
	}
	d.kicked[runID] = struct{}{}
	d.mu.Unlock()
	d.Kick()
}

// NotifiedRun handles the database notification of a submitted run: it
// wakes the claim loop unless KickRun did for that run.
func (d *Dispatcher) NotifiedRun(runID string) {
	d.mu.Lock()
	_, kicked := d.kicked[runID]
	delete(d.kicked, runID)
	d.mu.Unlock()
	if !kicked {
		d.Kick()
	}
}

// Run claims due runs until ctx ends, then hands its leases back (SPEC F5):
// it claims no more, its drivers stop acting (they detach from the
// gateway; the runners keep their turns going and their outboxes), and each
// lease a driver held is released under its exact fence, so any replica
// claims the run at once and resumes the same turn. Run returns once every
// driver stopped and released. A replica that dies without returning leaves
// its leases to lapse (or, on the same host and in the same PID namespace,
// to a successor that proves it dead).
func (d *Dispatcher) Run(ctx context.Context) error {
	go d.leases.run(ctx)
	hb := make(chan struct{})
	go func() { defer close(hb); d.heartbeat(ctx) }()
	defer func() { <-hb }()
	sem := make(chan struct{}, d.cfg.MaxActive)
	defer d.wg.Wait()
	claiming := make(chan struct{})
	d.mu.Lock()
	d.runCtx, d.sem, d.claiming = ctx, sem, claiming
	d.mu.Unlock()
	defer func() { // before d.wg.Wait: no driver starts after it
		d.mu.Lock()
		d.runCtx, d.sem = nil, nil
		d.mu.Unlock()
	}()
	defer close(claiming) // first: the drivers stopping hand their leases back

	due := false // the last attempt claimed a due run
	for {
		claimed, fair := false, false
		// After claiming a due run the loop looks again at once (more may
		// be due); the takeover probe is then left to the next wake-up (a
		// kick or the poll), so it does not load the database while the
		// run just claimed attaches.
		probe := !due && !d.cfg.NoSameHostTakeover
		due = false
		select {
		case sem <- struct{}{}:
			// Over its fair share a replica leaves due runs to the
			// others, but still takes over from a dead controller here.
			var c *store.Claim
			if fair = d.overShare(ctx); !fair {
				var err error
				c, err = d.claim(ctx, func(cctx context.Context) (*store.Claim, error) {
					return d.store.ClaimNext(cctx, d.cfg.Owner, d.cfg.LeaseTTL, d.self)
				})
				if err != nil && ctx.Err() == nil {
					d.log.Error("claim failed", "err", err)
				}
				due = c != nil
			}
			if c == nil && probe {
				c = d.takeOverDead(ctx)
			}
			if c == nil {
				<-sem
				break
			}
			claimed = true
			d.metrics.claims.Inc()
			if c.Expired {
				d.metrics.takeovers.WithLabelValues(takeoverLeaseExpired).Inc()
			}
			d.start(ctx, c, sem, nil)
		case <-ctx.Done():
			return nil
		}
		if claimed {
			continue // more may be due
		}
		wait := d.cfg.PollInterval
		if fair {
			wait = min(wait, fairRetry)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-d.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// SubmitAndClaim stores a submitted run (idempotent by run id, as
// store.Submit) and, when this replica has a free slot and is within its
// fair share, claims it in the same commit if it can start at once (it heads
// its session scope, which no other run holds), and drives it: one synced
// write instead of a submission's and a claim's, and no claim loop to wake
// (SPEC P4). The lease is the one ClaimNext would have taken, under the same
// fence; a replica that dies holding it leaves it to lapse or to a
// same-host successor, as any claim. Otherwise the run waits for a claim as
// usual and the local claim loop is woken. run is the claimed run as its
// claim committed, or as stored when it was not claimed here (read in the
// same round trip); nil when it existed already.
func (d *Dispatcher) SubmitAndClaim(ctx context.Context, runID string, in *prpv1.ExecutionInput) (created bool, run *executorv1.Run, err error) {
	if sem := d.freeSlot(ctx); sem != nil {
		var c *store.Claim
		// The run's cancellations reach its driver from the moment the
		// claim commits: its facts are read before (in the claiming
		// transaction), when no cancellation of the run can exist yet.
		cancelCh := d.reserveCancels(runID)
		reads := &store.AttachReads{PriorRuns: priorRunRecords}
		if pr, ok := d.cfg.Router.(PlacedRouter); ok {
			reads.GatewayTTL = pr.TTL()
		}
		// Not cancelled midway by the caller going away: the run is
		// durable either way, and a claim that committed must be driven.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
		created, c, run, err = d.store.SubmitClaim(sctx, runID, in, d.cfg.Owner, d.cfg.LeaseTTL, d.self, reads)
		cancel()
		if c != nil {
			if cancelCh == nil {
				c.Preread = nil // read once the driver takes its cancellations
			}
			d.metrics.claims.Inc()
			d.startClaimed(c, sem, cancelCh)
			return created, run, nil
		}
		d.releaseCancels(runID, cancelCh)
		<-sem
		if err == nil && created && run != nil {
			// Stored, not claimable at once (queued behind its scope, or
			// not due): the store announced it if anyone can claim it.
			return created, run, nil
		}
	} else {
		created, err = d.store.Submit(ctx, runID, in)
	}
	if created {
		d.KickRun(runID)
	}
	return created, nil, err
}

// freeSlot takes a slot for a run to drive when Run is claiming and this
// replica is within its fair share; nil otherwise.
func (d *Dispatcher) freeSlot(ctx context.Context) chan struct{} {
	d.mu.Lock()
	sem := d.sem
	d.mu.Unlock()
	if sem == nil {
		return nil
	}
	select {
	case sem <- struct{}{}:
	default:
		return nil
	}
	if d.overShare(ctx) {
		<-sem
		return nil
	}
	return sem
}

// reserveCancels registers the channel of the cancellations of a run about
// to be claimed (nil when the run has a driver here already).
func (d *Dispatcher) reserveCancels(runID string) chan *executorv1.Cancellation {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancels[runID] != nil {
		return nil
	}
	ch := make(chan *executorv1.Cancellation, 1)
	d.cancels[runID] = ch
	return ch
}

// releaseCancels unregisters a channel reserveCancels registered.
func (d *Dispatcher) releaseCancels(runID string, ch chan *executorv1.Cancellation) {
	if ch == nil {
		return
	}
	d.mu.Lock()
	if d.cancels[runID] == ch {
		delete(d.cancels, runID)
	}
	d.mu.Unlock()
}

// startClaimed drives a run SubmitAndClaim claimed, in Run's context, with
// the cancellation channel reserved for it (nil: none); if Run stopped
// meanwhile, the lease is handed back at once.
func (d *Dispatcher) startClaimed(c *store.Claim, sem chan struct{}, cancelCh chan *executorv1.Cancellation) {
	d.mu.Lock()
	runCtx := d.runCtx
	if runCtx != nil {
		d.wg.Add(1) // Run's d.wg.Wait waits for this driver from now on
	}
	d.mu.Unlock()
	if runCtx == nil {
		d.releaseCancels(c.RunID, cancelCh)
		d.handBack(c)
		<-sem
		return
	}
	defer d.wg.Done()
	d.start(runCtx, c, sem, cancelCh)
}

// start drives c; cancelCh is the channel reserved for its cancellations
// (reserveCancels), or nil to register one.
func (d *Dispatcher) start(ctx context.Context, c *store.Claim, sem chan struct{}, cancelCh chan *executorv1.Cancellation) {
	runCtx, cancel := context.WithCancelCause(ctx)
	d.leases.add(c.RunID, c.Attempt, cancel)
	if cancelCh == nil {
		cancelCh = make(chan *executorv1.Cancellation, 1)
	}
	d.mu.Lock()
	d.cancels[c.RunID] = cancelCh
	claiming := d.claiming
	d.mu.Unlock()
	d.wg.Add(1)
	d.metrics.active.Inc()
	go func() {
		defer d.wg.Done()
		defer d.metrics.active.Dec()
		defer func() { <-sem }()
		defer cancel(nil)
		defer d.leases.remove(c.RunID)
		defer func() {
			d.mu.Lock()
			if d.cancels[c.RunID] == cancelCh {
				delete(d.cancels, c.RunID)
			}
			delete(d.replaced, c.RunID)
			delete(d.localReplace, c.RunID)
			d.mu.Unlock()
		}()
		d.drive(runCtx, c, cancelCh)
		if ctx.Err() == nil {
			// The run's slot frees (SPEC Q1: a run of its company
			// held back by its limit may start now): the claim loop
			// looks again, taking the slot once it is released.
			defer d.Kick()
		}
		if ctx.Err() != nil {
			// Only once the claim loop stopped: a claim it was making
			// could otherwise take this run back the moment its lease
			// expires, and hand it back again, an attempt for nothing
			// (seen under load: the successor ran attempt 3, not 2).
			if claiming != nil {
				<-claiming
			}
			d.handBack(c)
		}
	}()
}

// claimTimeout bounds one claim statement.
const claimTimeout = 30 * time.Second

// claim runs one claim statement so that its outcome is never lost. A
// statement cancelled after it reached the database may still commit (the
// server reads it after the cancel request arrived, or finishes before it):
// the claimer would see an error while the run sat under its lease, driven
// by nobody until the lease lapsed — with a long lease and a stopping
// replica, for minutes. So the statement is not cancelled with ctx; a claim
// that commits after ctx ended (the dispatcher is stopping) is handed back
// at once, and nothing is claimed once ctx has ended.
func (d *Dispatcher) claim(ctx context.Context, f func(context.Context) (*store.Claim, error)) (*store.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	c, err := f(cctx)
	if c != nil && ctx.Err() != nil {
		d.handBack(c)
		return nil, ctx.Err()
	}
	return c, err
}

// handBackTimeout bounds the release of one lease at shutdown.
const handBackTimeout = 5 * time.Second

// handBack releases the lease of a claim whose driver stopped because the
// dispatcher is stopping. A driver that finished its run, failed it, or lost
// its lease releases nothing: the fence no longer holds.
func (d *Dispatcher) handBack(c *store.Claim) {
	ctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
	defer cancel()
	released, err := d.store.ReleaseLease(ctx, c.Fence)
	switch {
	case err != nil:
		d.log.Warn("handing the lease back failed; it lapses at its expiry", "run_id", c.RunID, "attempt", c.Attempt, "err", err)
	case released:
		d.metrics.handBacks.Inc()
		d.log.Info("lease handed back", "run_id", c.RunID, "attempt", c.Attempt)
	}
}

// takeOverDead claims, before its lease expires, a run whose controller ran
// on this host and is provably dead (E7 takeover with proof of death).
func (d *Dispatcher) takeOverDead(ctx context.Context) *store.Claim {
	held, err := d.store.HeldOnHost(ctx, d.self, d.cfg.Owner)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Error("listing held leases", "err", err)
		}
		return nil
	}
	for _, h := range held {
		if !ControllerDead(h.Controller) {
			continue
		}
		c, err := d.claim(ctx, func(cctx context.Context) (*store.Claim, error) {
			return d.store.ClaimRun(cctx, h.RunID, d.cfg.Owner, d.cfg.LeaseTTL, d.self, nil,
				&store.DeadProof{Owner: h.Owner, Attempt: h.Attempt, Controller: h.Controller})
		})
		if err != nil {
			d.log.Info("takeover refused", "run_id", h.RunID, "err", err)
			continue
		}
		d.metrics.takeovers.WithLabelValues(takeoverControllerDead).Inc()
		d.log.Warn("took over a run from a dead controller", "run_id", h.RunID, "dead_owner", h.Owner,
			"dead_pid", h.Controller.PID, "attempt", c.Attempt)
		return c
	}
	return nil
}

// drive attaches to the runner until the run reaches a terminal state, the
// lease is lost, or the executor stops. Transport trouble (the gateway
// restarting) is retried with backoff under the same lease; an attempt that
// cannot go on is recorded as a failure and disposed of (E11): retried
// later, or failed for good.
func (d *Dispatcher) drive(ctx context.Context, c *store.Claim, cancelCh <-chan *executorv1.Cancellation) {
	// The attempt's span continues the trace the run was submitted in;
	// its Attach calls carry it to the gateway and on to runnerd.
	ctx, span := telemetry.Tracer().Start(telemetry.WithTraceParent(ctx, c.TraceParent), "executor drive",
		trace.WithAttributes(telemetry.AttrRunID.String(c.RunID), telemetry.AttrAttempt.Int64(int64(c.Attempt))))
	defer span.End()
	log := d.log.With(append([]any{"run_id", c.RunID, "attempt", c.Attempt}, telemetry.LogArgs(span)...)...)
	log.Info("run claimed", "turn_generation", c.TurnGeneration)
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	var first gatewayv1.RunnerGatewayClient // the gateway this attempt went to
	// What the claiming transaction read for the first attach (SPEC P4:
	// no round trip between the claim's commit and the Open).
	pre := c.Preread
	c.Preread = nil
	for failures := 0; ; {
		// Each attach asks where the scope is placed: a move (drain,
		// failover) that committed meanwhile is followed. The attach's
		// facts are read meanwhile (SPEC P4: one round trip less before
		// the Open); an attach that does not happen waits for them.
		var facts func() (*store.AttachFacts, error)
		if pre != nil {
			f := pre.Facts
			facts = func() (*store.AttachFacts, error) { return f, nil }
		} else {
			facts = d.readFacts(ctx, c)
		}
		endRoute := synctrace.Step("executor.route", c.RunID)
		gw, err := d.routeFrom(ctx, c, pre)
		endRoute()
		pre = nil
		if err == nil && first == nil {
			err = d.renewMovedTurn(ctx, c, log)
		}
		if err != nil || (first != nil && gw != first) {
			_, _ = facts()
		}
		if code := failure.CodeOf(err); code == failure.GatewayCapacityExhausted || code == failure.SessionScopeMoving ||
			code == failure.WaitingForGateway {
			if first != nil {
				// F7: this attempt attached to the gateway now lost; its
				// turn may have started there. It waits keeping its turn.
				d.waitRun(ctx, c, err, log)
			} else {
				d.deferRun(ctx, c, err, log)
			}
			return
		}
		if err == nil && first != nil && gw != first {
			// F3: the scope failed over while this attempt was driven on
			// its lost gateway, where the turn may have started. The
			// attempt ends retryably (E11); the retry restores the scope's
			// checkpoint on the new gateway and starts the turn there under
			// a new turn generation, so no turn command runs twice.
			d.recordFailure(ctx, c, failure.New(codes.Unavailable, failure.RunnerGatewayLost,
				"session scope %s moved off its lost gateway during attempt %d; the retry continues from its checkpoint", c.Scope(), c.Attempt), log)
			return
		}
		if first == nil {
			first = gw
		}
		done := false
		if err == nil {
			done, err = d.attachOnce(ctx, c, gw, facts, cancelCh, log)
		}
		if done || ctx.Err() != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				log.Warn("driver stopped", "cause", cause)
			}
			return
		}
		failures++
		if permanent(err) || failures >= d.cfg.MaxAttachFailures {
			d.recordFailure(ctx, c, err, log)
			return
		}
		wait := 10 * time.Millisecond
		if failure.CodeOf(err) != failure.NativeSessionSupervisorBusy {
			log.Warn("attach interrupted; retrying", "err", err, "failures", failures)
			wait = retry.Next()
		} // else the session's previous run is detaching from the runner
		// (its terminal was just persisted): retry promptly.
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// renewMovedTurn gives the claimed run c a new turn generation when its
// routing moved the session scope off its lost gateway and an earlier
// attempt of the run was served there (SPEC F3, R13): that attempt's runner
// may have journaled and started this generation's turn.start on the lost
// gateway's root, which the move leaves behind — the new gateway restores
// the checkpoint the attempt started from, whose journal lacks it, so the
// same command id would start the turn a second time (make test-chaos
// SEED=1: chaos-0-077's g0 turn.start executed on both gateways after its
// executor's lease lapsed while its gateway was judged lost). The attempt's
// own move (first attach) is the one case: a move during the attempt ends
// it retryably, which renews the generation too.
func (d *Dispatcher) renewMovedTurn(ctx context.Context, c *store.Claim, log *slog.Logger) error {
	mt, ok := d.cfg.Router.(MoveTaker)
	if !ok {
		return nil
	}
	from, moved := mt.TakeMove(c.RunID)
	if !moved {
		return nil
	}
	gen, renewed, err := d.store.RenewServedTurnGeneration(ctx, c.Fence)
	if err != nil || !renewed {
		return err
	}
	log.Warn("the run moved off its lost gateway, where an earlier attempt was served: its turn starts under a new turn generation",
		"lost_gateway_id", from, "turn_generation", gen, "previous_turn_generation", c.TurnGeneration)
	c.TurnGeneration = gen
	return nil
}

// readFacts starts reading the facts of an attach of c (store.AttachFacts)
// and returns the function that waits for them.
func (d *Dispatcher) readFacts(ctx context.Context, c *store.Claim) func() (*store.AttachFacts, error) {
	type read struct {
		facts *store.AttachFacts
		err   error
	}
	ch := make(chan read, 1)
	go func() {
		defer synctrace.Step("executor.facts", c.RunID)()
		f, err := d.store.AttachFacts(ctx, c.RunID, c.Scope(), c.Input, priorRunRecords)
		ch <- read{f, err}
	}()
	return sync.OnceValues(func() (*store.AttachFacts, error) {
		r := <-ch
		return r.facts, r.err
	})
}

// routeFrom returns the gateway of the claimed run's session scope, from
// the placement pre read in the claiming transaction when there is one.
func (d *Dispatcher) routeFrom(ctx context.Context, c *store.Claim, pre *store.Preread) (gatewayv1.RunnerGatewayClient, error) {
	if d.cfg.Router == nil {
		return d.cfg.Gateway, nil
	}
	if pr, ok := d.cfg.Router.(PlacedRouter); ok && pre != nil && pre.Placement != nil {
		return pr.RoutePlaced(ctx, c.RunID, c.Scope(), c.Input, pre.Placement)
	}
	return d.cfg.Router.Route(ctx, c.RunID, c.Scope(), c.Input)
}

// deferRun hands a run whose scope cannot be placed now (SPEC F2), or is
// being moved (F4), back to the queue: no attempt is spent and nothing fails; it shows the reason in
// GetRun and is claimed again after a poll interval, when capacity may
// have freed up.
func (d *Dispatcher) deferRun(ctx context.Context, c *store.Claim, cause error, log *slog.Logger) {
	log.Info("the run's session scope cannot be placed now; it stays queued", "reason", failure.CodeOf(cause), "err", cause)
	d.metrics.placementDeferrals.Inc()
	if err := d.store.DeferRun(context.WithoutCancel(ctx), c.Fence, failure.CodeOf(cause), status.Convert(cause).Message(), d.cfg.PollInterval); err != nil {
		log.Warn("handing the unplaced run back to the queue failed; it waits for its lease to lapse", "err", err)
	}
}

// waitRun hands a run whose attempt attached to a gateway that is now lost
// back to the queue (store.WaitRun, SPEC F7): nothing fails, the attempt
// stays spent and the turn generation is kept, so the run resumes the same
// turn when the gateway returns.
func (d *Dispatcher) waitRun(ctx context.Context, c *store.Claim, cause error, log *slog.Logger) {
	log.Warn("the run's gateway is lost and its session scope cannot move; the run waits for it", "reason", failure.CodeOf(cause), "err", cause)
	d.metrics.placementDeferrals.Inc()
	if err := d.store.WaitRun(context.WithoutCancel(ctx), c.Fence, failure.CodeOf(cause), status.Convert(cause).Message(), d.cfg.PollInterval); err != nil {
		log.Warn("handing the waiting run back to the queue failed; it waits for its lease to lapse", "err", err)
	}
}

// recordFailure applies the failure disposition to a failed attempt.
func (d *Dispatcher) recordFailure(ctx context.Context, c *store.Claim, err error, log *slog.Logger) {
	source := recovery.SourceCode(err)
	code := failure.CodeOf(err)
	if code == "" {
		code = failure.RunnerAttachFailed
	}
	dec := recovery.DispositionWithDelay(int(c.Attempt), d.cfg.Clock(), source, d.cfg.RetryDelay)
	if source == "" && permanent(err) {
		// A refusal that no retry can change (bad target, fencing): fail now
		// under its own code.
		dec = recovery.Decision{Phase: recovery.PhaseTerminalFailure, FailureCode: code}
	}
	proj := recovery.Projection(dec.Phase, string(dec.FailureCode), c.Input.GetBinding().GetAgentId())
	rec := &executorv1.Recovery{
		Exhausted: proj.Exhausted, IssueStatus: proj.IssueStatus, RecoveryOwnerKind: proj.RecoveryOwner.Kind,
		RecoveryOwnerAgentId: proj.RecoveryActionOwnerAgentID, RecoveryActionCause: proj.RecoveryActionCause,
		SupersedeOnIdentityChange: proj.SupersedeOnIdentityChange,
	}
	fd := store.FailureDecision{Retry: dec.Retry(), Code: string(dec.FailureCode), Message: err.Error(), Recovery: rec}
	if dec.NextAttemptAt != nil {
		fd.NextAttemptAt = *dec.NextAttemptAt
		rec.NextAttemptAt = timestamppb.New(*dec.NextAttemptAt)
	}
	log.Error("attempt failed", "code", dec.FailureCode, "source_code", source, "retry", fd.Retry, "err", err)
	if fd.Retry {
		d.metrics.retries.WithLabelValues(string(code)).Inc() // what failed, not "interrupted"
	} else {
		d.metrics.failures.WithLabelValues(string(dec.FailureCode)).Inc()
	}
	if ferr := d.store.RecordFailure(context.WithoutCancel(ctx), c.Fence, fd); ferr != nil {
		log.Error("recording failure", "err", ferr)
	} else if !fd.Retry {
		d.metrics.outcomes.WithLabelValues(store.StateFailed, outcomeCode(fd.Code)).Inc()
	}
}

// permanent reports errors that retrying the attach cannot fix.
func permanent(err error) bool {
	var ce *closedError
	if errors.As(err, &ce) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unimplemented, codes.NotFound:
		return true
	}
	return false
}

type closedError struct{ code, msg string }

func (e *closedError) Error() string { return failure.Message(failure.Reason(e.code), e.msg) }

// FailureReason implements failure.Reasoned: the gateway's close code.
func (e *closedError) FailureReason() failure.Reason { return failure.Reason(e.code) }

// maxCoalescedEvents bounds one group commit of relayed events.
const maxCoalescedEvents = 512

// maxReadAhead bounds the relayed messages read ahead of their handling.
const maxReadAhead = 64

// lostTurn returns the failure a runner's turn.lost event of run runID
// among evs carries (its code is the provider's loss, e.g.
// provider_process_exited, and its message names the provider's own
// signal or exit), or nil. Only the loss of the turn started by turnCmd
// (this turn generation's turn.start) counts: a turn an earlier
// generation lost — its loss replayed or announced again — was already
// retried and must not end the attempt that runs its successor.
func lostTurn(evs []*prpv1.Event, runID, turnCmd string) error {
	for _, ev := range evs {
		if ev.GetEventType() != prp.EventTurnLost || ev.GetRunId() != runID {
			continue
		}
		var p prpv1.TurnLost
		if err := prp.DecodePayload(ev, &p); err != nil {
			return failure.New(codes.Unavailable, failure.ProviderProcessExited, "turn.lost: %v", err)
		}
		if cmd := p.GetCommandId(); cmd != "" && cmd != turnCmd {
			continue
		}
		code := failure.Reason(p.GetCode())
		if code == "" {
			code = failure.ProviderProcessExited
		}
		return failure.New(codes.Unavailable, code, "%s", p.GetMessage())
	}
	return nil
}

// commandID names a command of the claim. It does not contain the attempt:
// a takeover resends the same ids and the runner, which executes an id at
// most once, answers with the stored result — the provider turn starts once.
// A retry after a recorded failure bumps the turn generation and so starts a
// new turn.
func commandID(c *store.Claim, typ string) string {
	return fmt.Sprintf("%s/g%d/%s", c.RunID, c.TurnGeneration, typ)
}

// newCommand is the claim's command of body (its type named by the body).
func newCommand(c *store.Claim, body proto.Message) *prpv1.Command {
	cmd := prp.NewCommand(body)
	cmd.Schema, cmd.CommandId, cmd.IssuedAt = prp.CommandSchema, commandID(c, cmd.GetType()), timestamppb.Now()
	cmd.RunId, cmd.Attempt = c.RunID, c.Attempt
	return cmd
}

// acknowledgeCancellation records the acknowledgement, retrying a failed
// write a few times: the provider was already told to stop, so only the
// record is missing. If every try fails the record stays pending; the next
// CancelRun re-dispatches by the same command id (no second provider
// effect) and the acknowledgement is written then. It reports whether the
// acknowledgement was written.
func (d *Dispatcher) acknowledgeCancellation(ctx context.Context, c *store.Claim, intent string, log *slog.Logger) bool {
	// The provider stopped: its acknowledgement is written even when the
	// driver stops meanwhile. The run's terminal, persisted beside it, ends
	// the lease's renewal, which cancels the driver's context; the
	// cancellation then stayed pending and CancelRun waited its whole bound
	// (tether-bench-stack -cancels failed one cancel in 20–80). The fence in
	// the database (owner, attempt) decides, as for any write of the driver.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	retry := backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for try := 1; ; try++ {
		err := d.store.AcknowledgeCancellation(ctx, c.Fence, intent)
		if err == nil {
			log.Info("cancellation acknowledged", "intent_id", intent)
			d.cancellationAcked(c.RunID, nil)
			return true
		}
		if try == 5 || failure.CodeOf(err) == failure.NativeSessionLeaseLost || ctx.Err() != nil {
			log.Error("acknowledging cancellation failed; it stays pending", "intent_id", intent, "err", err)
			return false
		}
		log.Warn("acknowledging cancellation failed; retrying", "intent_id", intent, "err", err)
		if !backoff.Sleep(ctx, retry.Next()) {
			return false
		}
	}
}

// ackTimeout bounds the writing of one cancellation acknowledgement.
const ackTimeout = 10 * time.Second

// CloseReasonConfigChanged is the E10 close reason for a warm session whose
// pinned configuration changed.
const CloseReasonConfigChanged = session.ReasonConfigChanged

// priorRunRecords bounds the prior-run records an Open carries.
const priorRunRecords = 16

// configChanged reports whether the previous run of the run's scope pinned
// another warm configuration.
func configChanged(c *store.Claim, f *store.AttachFacts) bool {
	if f.PreviousInput == nil {
		return false
	}
	return scope.ParamsOf(f.PreviousRunID, f.PreviousInput).ConfigDigest() != scope.ParamsOf(c.RunID, c.Input).ConfigDigest()
}

// resolveSecrets returns the values of the claim's secret references
// (SPEC T3), read and opened for this attach only.
func (d *Dispatcher) resolveSecrets(ctx context.Context, c *store.Claim) (map[string]string, error) {
	refs := c.Input.GetEnvironment().GetSecretRefs()
	if len(refs) == 0 {
		return nil, nil
	}
	if d.cfg.Secrets == nil {
		return nil, failure.New(codes.FailedPrecondition, failure.SecretUnreadable, "run %s names secrets and this executor keeps none (no -secrets-key-file)", c.RunID)
	}
	return d.cfg.Secrets.Resolve(ctx, c.Input.GetBinding().GetCompanyId(), refs)
}

// turnCommands are the claim's run.attach and turn.start. The run.attach
// carries the run's provider environment alone: the executor's policy
// (SPEC E2) with the values of its secret references (SPEC T3). This
// command, sent on the attach to the gateway that launches the run's
// provider, is the only place they travel; the gateway completes it with
// the run's input from the attach's Open (the input travels once) and
// runnerd keeps the values in memory only.
func turnCommands(c *store.Claim, resolved map[string]string) ([]*prpv1.Command, error) {
	in := proto.Clone(c.Input).(*prpv1.ExecutionInput)
	if len(resolved) > 0 {
		if in.Environment == nil {
			in.Environment = &prpv1.ProviderEnvironment{}
		}
		conf := maps.Clone(in.Environment.GetConfigured())
		if conf == nil {
			conf = map[string]string{}
		}
		maps.Copy(conf, resolved)
		in.Environment.Configured = conf
	}
	attach := newCommand(c, &prpv1.RunAttach{Environment: provenv.Policy(in)})
	turn := newCommand(c, &prpv1.TurnStart{Text: c.Input.GetTask().GetPrompt()})
	return []*prpv1.Command{attach, turn}, nil
}

// replaceThroughBackup closes the live warm session for run c's new
// configuration through the backup (E10): the scope's runner is suspended
// (verified: lifecycle suspended on disk, process gone), its profile is
// checkpointed and stamped, and its local state archived; the checkpoint is
// recorded for this run, and the returned error makes the driver re-attach,
// whereupon the gateway restores the stamped checkpoint and launches the
// runner with this run's configuration, resuming the provider thread. A
// gateway without a backup verifier makes the next attach replace the
// session on its local state instead.
func (d *Dispatcher) replaceThroughBackup(ctx context.Context, c *store.Claim, gw gatewayv1.RunnerGatewayClient, log *slog.Logger) error {
	prevID, prev, err := d.store.PreviousInScope(ctx, c.RunID)
	if err != nil {
		return err
	}
	if prev == nil {
		prevID, prev = c.RunID, c.Input
	}
	log.Info("closing the warm session for a configuration change through a verified suspension", "previous_run_id", prevID)
	var resp *gatewayv1.SuspendRunnerResponse
	// The gateway may not have seen this run detach yet: retry while it
	// is busy, 8 tries over about 2.5 s.
	retry := backoff.Backoff{Min: 20 * time.Millisecond, Max: 2 * time.Second}
	for {
		resp, err = gw.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{
			Input: prev, RunId: prevID, Reason: session.ReasonConfigChanged, ArchiveState: true})
		if err == nil || failure.CodeOf(err) != failure.NativeSessionSupervisorBusy || retry.Peek() >= 2*time.Second {
			break
		}
		if !backoff.Sleep(ctx, retry.Next()) {
			return ctx.Err()
		}
	}
	// Only a gateway without a verifier (FailedPrecondition) replaces the
	// session on its local state; a verifier that fails ends the attempt.
	if failure.CodeOf(err) == failure.RunnerHarnessBackupUnavailable && status.Code(err) == codes.FailedPrecondition {
		log.Warn("no backup verifier behind the gateway; replacing the warm session on its local state", "err", err)
		d.mu.Lock()
		d.localReplace[c.RunID] = true
		d.mu.Unlock()
		return failure.New(codes.Unavailable, failure.WarmSessionReplaced, "%s; re-attaching", CloseReasonConfigChanged)
	}
	if err != nil && failure.CodeOf(err) != failure.NativeSessionSupervisorBusy {
		return d.closeFailed(ctx, c, prevID, err, log)
	}
	if err != nil {
		return err
	}
	cp, err := suspend.Record(ctx, d.store, c.Fence, resp, c.Scope(), c.RunID, c.Input, session.ReasonConfigChanged, log)
	if err != nil {
		return err
	}
	if err := d.store.AppendControlEvent(ctx, c.Fence, prp.EventSessionClosed, &prpv1.SessionClosed{
		Reason: CloseReasonConfigChanged, CheckpointId: cp.GetCheckpointId(), PreviousRunId: prevID,
		ProviderThreadId: resp.GetProviderThreadId(),
	}); err != nil {
		return err
	}
	d.mu.Lock()
	d.replaced[c.RunID] = true
	d.mu.Unlock()
	log.Info("warm session checkpointed for its replacement", "checkpoint_id", cp.GetCheckpointId(), "provider_thread_id", resp.GetProviderThreadId())
	return failure.New(codes.Unavailable, failure.WarmSessionReplaced, "%s; re-attaching to restore checkpoint %s", CloseReasonConfigChanged, cp.GetCheckpointId())
}

// durableSourceFresh is the gateway's durable source of a runner launched
// on an empty root (nothing to replace).
const durableSourceFresh = "fresh"

// closeFailed records why the verified suspension for a configuration
// change failed (session.close_failed with the gateway's code) and returns
// WarmSessionCloseBackupFailed. A lost lease or an ended context is returned as
// is: nothing may be written then.
func (d *Dispatcher) closeFailed(ctx context.Context, c *store.Claim, prevID string, err error, log *slog.Logger) error {
	if ctx.Err() != nil || failure.CodeOf(err) == failure.NativeSessionLeaseLost {
		return err
	}
	code := failure.CodeOf(err)
	if code == "" {
		code = failure.Reason(status.Code(err).String())
	}
	log.Warn("the verified suspension for a configuration change failed; the attempt ends retryably", "code", code, "err", err)
	if aerr := d.store.AppendControlEvent(ctx, c.Fence, prp.EventSessionCloseFailed, &prpv1.SessionClosed{
		Reason: CloseReasonConfigChanged, PreviousRunId: prevID, Code: string(code), Message: status.Convert(err).Message(),
	}); aerr != nil {
		return aerr
	}
	return failure.Wrap(err, codes.Unavailable, failure.WarmSessionCloseBackupFailed,
		"%s; the session was not replaced: closing it through the backup failed: %s: %s", CloseReasonConfigChanged, code, status.Convert(err).Message())
}

// closeForReplacement closes the live provider session (the runner stops it
// and exits once its outbox is acknowledged), records why on the run, and
// returns an error so the driver re-attaches: the gateway then starts the
// runner again for this run's configuration, on the same state, so the
// provider thread resumes with its history.
func (d *Dispatcher) closeForReplacement(ctx context.Context, c *store.Claim, send func(*gatewayv1.AttachRequest) error,
	recv func() (*gatewayv1.AttachResponse, error), floor uint64, log *slog.Logger) error {
	cmd := newCommand(c, &prpv1.SessionClose{Reason: CloseReasonConfigChanged})
	log.Info("closing the warm session for a configuration change")
	if err := send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: cmd}}); err != nil {
		return err
	}
	if err := d.store.AppendControlEvent(ctx, c.Fence, prp.EventSessionClosed, &prpv1.SessionClosed{Reason: CloseReasonConfigChanged}); err != nil {
		return err
	}
	d.mu.Lock()
	d.replaced[c.RunID] = true
	d.mu.Unlock()
	// Keep persisting and acknowledging until the runner has gone, so it
	// exits promptly and nothing it emitted is lost.
	acks := newAckTracker()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		m, err := recv()
		if err != nil {
			break
		}
		if evs := m.GetEvents().GetEvents(); len(evs) > 0 {
			if _, err := d.store.AppendEvents(ctx, c.Fence, evs); err != nil {
				return err
			}
			for inst, seq := range acks.persisted(floor, evs) {
				_ = send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{SourceInstanceId: inst, PersistedThroughSeq: seq}}})
			}
		}
	}
	return failure.New(codes.Unavailable, failure.WarmSessionReplaced, "%s; re-attaching", CloseReasonConfigChanged)
}

// RunnerTarget maps the run's placement to the gateway's target: the
// transport mode (default dial_ws_loopback) and whether the caller
// authorised sandbox ingress for this run.
func RunnerTarget(in *prpv1.ExecutionInput) *gatewayv1.RunnerTarget {
	mode := gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK
	switch in.GetRunner().GetTransportMode() {
	case prp.ModeDialWSS:
		mode = gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS
	case prp.ModeListenWS:
		mode = gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS
	}
	return &gatewayv1.RunnerTarget{Mode: mode, RunnerIngressAuthorized: in.GetRunner().GetIngressAuthorized()}
}
