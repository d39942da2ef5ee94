package fleet

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
)

// ReasonDrained is the suspension reason of a scope moved off a drained
// gateway.
const ReasonDrained = "gateway drained"

// Drainer moves the scopes of drained gateways to others (SPEC F4). Every
// executor replica runs one; the store serialises them (a scope's move is
// claimed, its suspension too).
type Drainer struct {
	Store     *store.Store
	Suspender *suspend.Suspender
	Router    *Router
	// Interval between sweeps (default 1s).
	Interval time.Duration
	// MoveTTL bounds how long a scope's runs wait for its move (default
	// 3m, the bound of a verified suspension); a replica that dies
	// mid-move leaves the scope where it was after it.
	MoveTTL time.Duration
	// RetryDelay separates failed moves of a scope (default 10s).
	RetryDelay time.Duration
	Logger     *slog.Logger

	failed map[string]time.Time // scope → when a failed move may be tried again
}

func (d *Drainer) defaults() {
	if d.Interval <= 0 {
		d.Interval = time.Second
	}
	if d.MoveTTL <= 0 {
		d.MoveTTL = 3 * time.Minute
	}
	if d.RetryDelay <= 0 {
		d.RetryDelay = 10 * time.Second
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.failed == nil {
		d.failed = map[string]time.Time{}
	}
}

// Run sweeps every Interval until ctx ends.
func (d *Drainer) Run(ctx context.Context) {
	d.defaults()
	suspend.Every(ctx, d.Interval, d.Logger, "gateway drain sweep failed", d.Sweep)
}

// Sweep moves the idle scopes of drained gateways (a bounded batch) and
// returns how many it moved. A scope with a run queued or in flight is
// left for a later sweep: its run finishes where it is.
func (d *Drainer) Sweep(ctx context.Context) (int, error) {
	d.defaults()
	scopes, err := d.Store.ScopesToMove(ctx, d.Router.TTL(), 64)
	if err != nil {
		return 0, err
	}
	moved, now := 0, time.Now()
	for scope, at := range d.failed {
		if now.After(at) {
			delete(d.failed, scope)
		}
	}
	for _, m := range scopes {
		if ctx.Err() != nil {
			return moved, ctx.Err()
		}
		if _, wait := d.failed[m.Scope]; wait {
			continue
		}
		ok, err := d.Move(ctx, m)
		if err != nil {
			d.failed[m.Scope] = now.Add(d.RetryDelay)
			d.Logger.Warn("moving a scope off a drained gateway failed; retried later", "session_scope", m.Scope,
				"gateway_id", m.GatewayID, "retry_in", d.RetryDelay, "code", failure.CodeOf(err), "err", err)
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

// Move moves one idle scope off its drained gateway: the scope is marked
// moving (its new runs wait), suspended there with a verified checkpoint
// (its state then archived on that gateway), and re-placed; its next run
// restores the checkpoint on the new gateway. A scope without runner state
// there (it never ran) is re-placed as it is. ok is false when the scope
// is no longer movable (a run took it, another replica moves it).
func (d *Drainer) Move(ctx context.Context, m store.ScopeToMove) (ok bool, err error) {
	ok, err = d.Store.BeginMove(ctx, m.Scope, m.GatewayID, d.MoveTTL)
	if !ok || err != nil {
		return false, err
	}
	defer func() {
		if !ok {
			if eerr := d.Store.EndMove(context.WithoutCancel(ctx), m.Scope, m.GatewayID); eerr != nil {
				d.Logger.Warn("ending a move that did not happen", "session_scope", m.Scope, "err", eerr)
			}
		}
	}()
	gw, err := d.Router.Client(m.GatewayID, m.Address)
	if err != nil {
		return false, err
	}
	checkpoint := ""
	cp, err := d.Suspender.SuspendToMove(ctx, gw, m.Scope, m.LastRunID, m.Input, ReasonDrained)
	switch {
	case failure.CodeOf(err) == failure.RunnerStateMissing:
		// Nothing of the scope on that gateway: nothing to carry over.
	case err != nil:
		return false, err
	default:
		checkpoint = cp.GetCheckpointId()
	}
	p, err := d.Store.RePlace(ctx, store.PlaceRequest{Scope: m.Scope, Labels: m.Input.GetRunner().GetLabels(), TTL: d.Router.TTL()},
		store.Move{From: m.GatewayID, Idle: true, Checkpoint: checkpoint, Drained: true})
	if errors.Is(err, store.ErrMoveRefused) {
		return false, nil
	}
	if err != nil {
		// No other gateway has room: the scope stays; its checkpoint is
		// current, so its next run there restores it.
		return false, err
	}
	d.Logger.Info("scope moved off a drained gateway", "session_scope", m.Scope, "from", m.GatewayID, "to", p.GatewayID,
		"checkpoint_id", checkpoint)
	return true, nil
}
