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
// Self-fencing: a driver stops acting on its own when it has gone longer than
// selfFence = TTL*2/3 without a successful renewal, which is < TTL, so it
// stops before any other replica can claim the run (claims need the lease to
// have expired in the database clock).
type leaseKeeper struct {
	store *store.Store
	owner string
	ttl   time.Duration
	log   *slog.Logger

	mu    sync.Mutex
	held  map[string]*heldLease
	kicks chan struct{}
}

type heldLease struct {
	attempt   uint64
	cancel    context.CancelCauseFunc
	renewedAt time.Time
}

func newLeaseKeeper(s *store.Store, owner string, ttl time.Duration, log *slog.Logger) *leaseKeeper {
	return &leaseKeeper{store: s, owner: owner, ttl: ttl, log: log, held: map[string]*heldLease{}, kicks: make(chan struct{}, 1)}
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

func (k *leaseKeeper) renew(ctx context.Context) {
	k.mu.Lock()
	leases := make([]store.Lease, 0, len(k.held))
	for id, h := range k.held {
		leases = append(leases, store.Lease{RunID: id, Attempt: h.attempt})
	}
	k.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, k.ttl/3)
	renewed, err := k.store.RenewLeases(rctx, k.owner, leases, k.ttl)
	cancel()
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range leases {
		h, ok := k.held[l.RunID]
		if !ok || h.attempt != l.Attempt {
			continue
		}
		switch {
		case err == nil && renewed[l.RunID]:
			h.renewedAt = now
		case err == nil:
			k.log.Warn("lease lost", "run_id", l.RunID, "attempt", l.Attempt)
			h.cancel(store.ErrLeaseLost(store.Fence{RunID: l.RunID, Owner: k.owner, Attempt: l.Attempt}))
			delete(k.held, l.RunID)
		case now.Sub(h.renewedAt) > k.ttl*2/3:
			k.log.Warn("lease renewal failing past the self-fence bound", "run_id", l.RunID, "attempt", l.Attempt, "err", err)
			h.cancel(store.ErrLeaseLost(store.Fence{RunID: l.RunID, Owner: k.owner, Attempt: l.Attempt}))
			delete(k.held, l.RunID)
		}
	}
}
