package store

import (
	"context"
	"time"
)

// Fleet is what a replica's heartbeat reads back: the live replicas (this
// one included) and their summed capacity.
type Fleet struct {
	Replicas int
	Capacity int
}

// HeartbeatReplica records that owner lives, serves at addr and drives up
// to capacity runs at once (and writes events.run_created_at: SPEC L2), drops replicas silent for an hour, and returns
// the replicas whose last heartbeat is younger than live.
func (s *Store) HeartbeatReplica(ctx context.Context, owner, addr string, capacity int, live time.Duration) (Fleet, error) {
	var f Fleet
	err := s.pool.QueryRow(ctx, `
WITH beat AS (
  INSERT INTO executor.replicas (owner, capacity, addr, writes_run_created_at) VALUES ($1, $2, nullif($3, ''), true)
  ON CONFLICT (owner) DO UPDATE SET capacity = excluded.capacity, addr = excluded.addr, heartbeat_at = now(), writes_run_created_at = true
), gone AS (
  DELETE FROM executor.replicas WHERE heartbeat_at < now() - interval '1 hour'
)
SELECT 1 + count(*), $2 + coalesce(sum(capacity), 0) FROM executor.replicas
 WHERE owner <> $1 AND heartbeat_at > now() - $4 * interval '1 microsecond'`,
		owner, capacity, addr, live.Microseconds()).Scan(&f.Replicas, &f.Capacity)
	return f, err
}

// RemoveReplica forgets owner (it stopped).
func (s *Store) RemoveReplica(ctx context.Context, owner string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM executor.replicas WHERE owner = $1`, owner)
	return err
}

// FairShareFacts are what a fair-share decision reads, all from one
// snapshot: the unexpired leases owner holds and the whole fleet holds, and
// the summed capacity of the other replicas heard from within live.
type FairShareFacts struct {
	Mine, Active  int
	OtherCapacity int
}

// FairShare reads the facts of a fair-share decision for owner.
func (s *Store) FairShare(ctx context.Context, owner string, live time.Duration) (FairShareFacts, error) {
	var f FairShareFacts
	err := s.pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE lease_owner = $1), count(*),
       (SELECT coalesce(sum(capacity), 0) FROM executor.replicas
         WHERE owner <> $1 AND heartbeat_at > now() - $2 * interval '1 microsecond')
  FROM executor.coordinators WHERE phase = 'observed' AND lease_expires_at > now()`,
		owner, live.Microseconds()).Scan(&f.Mine, &f.Active, &f.OtherCapacity)
	return f, err
}
