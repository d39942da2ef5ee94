package dispatch

import (
	"context"
	"sync/atomic"
	"time"
)

// Fair claims (SPEC F6): replicas heartbeat their capacity, and while more
// than one lives, a replica claims only while it drives less than its share
// of the fleet's runs (by capacity). A replica that receives the
// submissions (and so hears of them first) no longer takes most of them:
// the others, woken by the same notification, claim the rest.

// replicaHeartbeat is how often a replica announces itself; a replica
// silent for replicaLive is no longer counted in the fleet.
const (
	replicaHeartbeat = time.Second
	replicaLive      = 3 * replicaHeartbeat
)

// fairRetry is how soon a replica over its share looks again (the others'
// runs end, or they stop).
const fairRetry = 50 * time.Millisecond

// FairShareAllows reports whether a replica driving mine of the fleet's
// active runs, with capacity myCap of the live fleet's fleetCap, may claim
// one more: mine must stay below its share of the runs driven once it
// claimed, ⌈(active+1)·myCap/fleetCap⌉. Alone (fleetCap ≤ myCap) it always
// may. Some replica is always allowed — the shares sum to at least active+1
// while the replicas drive active runs — and a replica at its capacity
// (full) leaves its share to the others.
func FairShareAllows(mine, active, myCap, fleetCap int) bool {
	if myCap <= 0 || fleetCap <= myCap {
		return true
	}
	share := ((active+1)*myCap + fleetCap - 1) / fleetCap // ceil
	return mine < share
}

// fleetView is the last heartbeat's view of the live replicas.
type fleetView struct {
	replicas atomic.Int64
}

// heartbeat announces this replica until ctx ends, then forgets it.
func (d *Dispatcher) heartbeat(ctx context.Context) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
		defer cancel()
		if err := d.store.RemoveReplica(rctx, d.cfg.Owner); err != nil {
			d.log.Warn("leaving the replica registry", "err", err)
		}
	}()
	t := time.NewTicker(replicaHeartbeat)
	defer t.Stop()
	for {
		f, err := d.store.HeartbeatReplica(ctx, d.cfg.Owner, d.cfg.AdvertiseAddr, d.cfg.MaxActive, replicaLive)
		switch {
		case err == nil:
			d.fleet.replicas.Store(int64(f.Replicas))
		case ctx.Err() == nil:
			d.log.Warn("replica heartbeat failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// overShare reports whether this replica holds its fair share of the
// fleet's runs already (and so leaves the next claim to another). The last
// heartbeat only says whether other replicas live; the decision reads the
// leases and the live replicas' capacities afresh, so a replica that just
// stopped (and left the registry) no longer takes a share.
func (d *Dispatcher) overShare(ctx context.Context) bool {
	if d.fleet.replicas.Load() <= 1 {
		return false
	}
	f, err := d.store.FairShare(ctx, d.cfg.Owner, replicaLive)
	if err != nil {
		return false // claim: fairness must not stop work
	}
	return !FairShareAllows(f.Mine, f.Active, d.cfg.MaxActive, d.cfg.MaxActive+f.OtherCapacity)
}
