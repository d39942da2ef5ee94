package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// leaseKeeper renews every lease this executor holds in one statement per
// tick (every TTL/3). A lease that was not renewed is lost: its driver is
// cancelled and never writes again (its writes are fenced in SQL anyway).
//
// Self-fencing: a driver also stops on its own, without hearing from the
// database, once more than TTL/2 has passed since the start of its last
// successful renewal. The check runs at every tick, before the renewal
// request, so the driver stops at the latest at (last start) + 2·TTL/3 —
// the first tick past TTL/2. The lease, extended by the database during that
// last renewal, expires no earlier than (last start) + TTL, and no replica
// can claim it before it expires. Hence:
//
//	renew interval TTL/3  <  self-fence bound TTL/2  <  stop at ≤ 2·TTL/3  <  expiry ≥ TTL
//
// which leaves TTL/3 of margin for scheduling delays.
type leaseKeeper struct {
	store   *store.Store
	owner   string
	ttl     time.Duration
	log     *slog.Logger
	metrics *metrics

	mu   sync.Mutex
	held map[string]*heldLease
}

type heldLease struct {
	attempt uint64
	cancel  context.CancelCauseFunc
	// renewedAt is when the last successful renewal (or the claim) started.
	renewedAt time.Time
}

func newLeaseKeeper(s *store.Store, owner string, ttl time.Duration, log *slog.Logger, m *metrics) *leaseKeeper {
	return &leaseKeeper{store: s, owner: owner, ttl: ttl, log: log, metrics: m, held: map[string]*heldLease{}}
}

func (k *leaseKeeper) add(runID string, attempt uint64, cancel context.CancelCauseFunc) {
	k.mu.Lock()
	k.held[runID] = &heldLease{attempt: attempt, cancel: cancel, renewedAt: time.Now()}
	k.mu.Unlock()
}

func (k *leaseKeeper) remove(runID string) {
	k.mu.Lock()
	delete(k.held, runID)
	k.mu.Unlock()
}

func (k *leaseKeeper) run(ctx context.Context) {
	t := time.NewTicker(k.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k.renew(ctx)
		}
	}
}

func (k *leaseKeeper) lost(id string, h *heldLease, why string) {
	k.log.Warn(why, "run_id", id, "attempt", h.attempt)
	h.cancel(store.ErrLeaseLost(store.Fence{RunID: id, Owner: k.owner, Attempt: h.attempt}))
	delete(k.held, id)
}

func (k *leaseKeeper) renew(ctx context.Context) {
	start := time.Now()
	k.mu.Lock()
	leases := make([]store.Lease, 0, len(k.held))
	for id, h := range k.held {
		if start.Sub(h.renewedAt) > k.ttl/2 {
			k.lost(id, h, "no successful lease renewal within the self-fence bound; stopping the driver")
			continue
		}
		leases = append(leases, store.Lease{RunID: id, Attempt: h.attempt})
	}
	k.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, k.ttl/3)
	sent := time.Now()
	renewed, err := k.store.RenewLeases(rctx, k.owner, leases, k.ttl)
	k.metrics.renewalSeconds.Observe(time.Since(sent).Seconds())
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range leases {
		h, ok := k.held[l.RunID]
		if !ok || h.attempt != l.Attempt {
			continue
		}
		switch {
		case err == nil && renewed[l.RunID]:
			h.renewedAt = start
			k.metrics.renewals.WithLabelValues(renewalRenewed).Inc()
		case err == nil:
			k.metrics.renewals.WithLabelValues(renewalLost).Inc()
			k.lost(l.RunID, h, "lease lost")
		default:
			k.metrics.renewals.WithLabelValues(renewalFailed).Inc()
			k.log.Warn("lease renewal failed; the self-fence bound decides", "run_id", l.RunID, "err", err)
		}
	}
}
