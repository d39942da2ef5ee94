package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/placement"
)

// Placement is the gateway a session scope runs on (SPEC F2).
type Placement struct {
	Scope     string
	GatewayID string
	// Address is where the gateway's registry entry says it serves; empty
	// when it is not registered (an executor's static -gateway-id).
	Address string
	// State is the gateway's registry state (active, draining, lost); empty
	// when it is not registered.
	State string
	// Moving: a drain is moving the scope (BeginMove); its runs wait.
	Moving bool
	// LostSince is when a lost gateway became lost (its last heartbeat
	// plus the TTL), and LostFor how long ago that was, both by the
	// database's clock (SPEC F7: a run waits for its lost gateway up to a
	// bound). Zero unless State is lost.
	LostSince time.Time
	LostFor   time.Duration
}

// placementColumns read a placement joined to its gateway's registry entry
// ($ttl names the gateway TTL parameter).
func placementColumns(ttlParam string) string {
	return `p.session_scope, p.gateway_id, coalesce(g.address, ''),
       CASE WHEN g.gateway_id IS NULL THEN ''
            WHEN g.heartbeat_at <= now() - ` + ttlParam + ` * interval '1 microsecond' THEN 'lost'
            WHEN g.draining OR g.drain_requested_at IS NOT NULL THEN 'draining' ELSE 'active' END,
       coalesce(p.moving_until > now(), false),
       CASE WHEN g.heartbeat_at <= now() - ` + ttlParam + ` * interval '1 microsecond'
            THEN g.heartbeat_at + ` + ttlParam + ` * interval '1 microsecond' END,
       CASE WHEN g.heartbeat_at <= now() - ` + ttlParam + ` * interval '1 microsecond'
            THEN (extract(epoch FROM now() - g.heartbeat_at) * 1000000 - ` + ttlParam + `)::bigint END`
}

// asyncCommit is a predicate, always true, that turns synchronous_commit
// off for the rest of the statement's own transaction: a read-only
// statement that only locks rows commits without waiting for a WAL flush.
const asyncCommit = `set_config('synchronous_commit', 'off', true) = 'off'`

func scanPlacement(row pgx.Row) (*Placement, error) {
	var (
		p         Placement
		lostSince *time.Time
		lostFor   *int64
	)
	if err := row.Scan(&p.Scope, &p.GatewayID, &p.Address, &p.State, &p.Moving, &lostSince, &lostFor); err != nil {
		return nil, err
	}
	if lostSince != nil && lostFor != nil {
		p.LostSince, p.LostFor = *lostSince, time.Duration(*lostFor)*time.Microsecond
	}
	return &p, nil
}

// ScopePlacement returns the scope's placement, or nil when it has none. It
// reads the row under a share lock: a move (RePlace) that has locked it is
// waited for, so a driver that claimed a run of the scope reads where the
// scope is once the move committed or was refused.
//
// The lock gives the statement's transaction an id, and PostgreSQL flushes
// the WAL at the commit of any transaction with one: a synced write on
// every attach of a warm run (SPEC P4; ≈ 9 ms per read under load on the
// shared box, 0.3 ms without the lock). The statement commits
// asynchronously instead (synchronous_commit off for its own transaction
// only, set_config(…, true)): it writes nothing but the row lock, which
// does not outlive the transaction, so a crash that loses the commit
// record loses nothing.
func (s *Store) ScopePlacement(ctx context.Context, scope string, ttl time.Duration) (*Placement, error) {
	return scanOptionalPlacement(s.pool.QueryRow(ctx, scopePlacementSQL+` AND `+asyncCommit+` FOR SHARE OF p`, scope, ttl.Microseconds()))
}

// scanOptionalPlacement is scanPlacement with no row a nil placement.
func scanOptionalPlacement(row pgx.Row) (*Placement, error) {
	p, err := scanPlacement(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return p, err
}

// scopePlacementSQL reads scope $1's placement, with its gateway's state
// for the gateway TTL $2 (in microseconds).
var scopePlacementSQL = `SELECT ` + placementColumns("$2") + `
  FROM executor.placements p LEFT JOIN executor.gateways g ON g.gateway_id = p.gateway_id
 WHERE p.session_scope = $1`

// PlaceRequest asks for a gateway for a session scope.
type PlaceRequest struct {
	Scope string
	// RunID is the run being placed: its queued reason is cleared once the
	// scope is placed.
	RunID string
	// Labels the gateway must carry (the run's placement labels).
	Labels map[string]string
	// TTL after which a silent gateway is lost.
	TTL time.Duration
	// Fallback is the gateway scopes are placed on while the registry is
	// empty (the executor's static -gateway-id); empty: none.
	Fallback string
}

// lockPlacements serialises placement decisions fleet-wide for the rest of
// the transaction, so two replicas placing at once count each other's
// placements.
const lockPlacements = `SELECT pg_advisory_xact_lock(hashtext('tether.executor.placement'))`

// candidatesSQL lists the active gateways (heartbeat within $1, neither
// draining nor being drained) with their load: the sessions each announced
// in its last heartbeat plus the scopes placed on it since — or, when more,
// its placed scopes with a run queued or in flight or one that ended since
// shortly before that heartbeat. The second count covers the heartbeat's
// lag: a scope placed just before a heartbeat whose runner came up after
// it is in neither of the first two counts (a burst of first runs was
// skewed, and a capacity-1 gateway took a second scope while the first
// one's runner was still up), but its run started after the heartbeat's
// count was taken, so it is in flight or ended after it. The slack covers
// the time between the gateway counting and the heartbeat arriving.
const candidatesSQL = `
SELECT g.gateway_id, g.labels, g.capacity,
       greatest(g.sessions + (SELECT count(*) FROM executor.placements p
                               WHERE p.gateway_id = g.gateway_id AND p.placed_at >= g.heartbeat_at)::int,
                (SELECT count(*) FROM executor.placements p
                  WHERE p.gateway_id = g.gateway_id
                    AND EXISTS (SELECT 1 FROM executor.runs r
                                 WHERE r.session_scope = p.session_scope
                                   AND (r.ended_at IS NULL OR r.ended_at >= g.heartbeat_at - interval '2 seconds')))::int)
  FROM executor.gateways g
 WHERE g.heartbeat_at > now() - $1 * interval '1 microsecond' AND NOT g.draining AND g.drain_requested_at IS NULL
 ORDER BY g.gateway_id`

// choose decides a gateway for req inside tx (placements locked), never
// exclude. It returns gateway_capacity_exhausted when no active gateway
// satisfying the labels has room; with an empty registry, req.Fallback.
func choose(ctx context.Context, tx pgx.Tx, req PlaceRequest, exclude string) (string, error) {
	rows, err := tx.Query(ctx, candidatesSQL, req.TTL.Microseconds())
	if err != nil {
		return "", err
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (placement.Candidate, error) {
		var (
			c   placement.Candidate
			raw []byte
		)
		if err := row.Scan(&c.ID, &raw, &c.Capacity, &c.Load); err != nil {
			return c, err
		}
		return c, json.Unmarshal(raw, &c.Labels)
	})
	if err != nil {
		return "", err
	}
	cs = dropCandidate(cs, exclude)
	out := placement.Choose(cs, req.Labels)
	if out.GatewayID != "" {
		return out.GatewayID, nil
	}
	var registered int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM executor.gateways`).Scan(&registered); err != nil {
		return "", err
	}
	if registered == 0 && req.Fallback != "" && req.Fallback != exclude {
		return req.Fallback, nil
	}
	if out.Matching == 0 {
		return "", failure.New(codes.ResourceExhausted, failure.GatewayCapacityExhausted,
			"no active gateway has the labels %s (%d active, %d registered); the run stays queued until one does",
			labelsText(req.Labels), len(cs), registered)
	}
	return "", failure.New(codes.ResourceExhausted, failure.GatewayCapacityExhausted,
		"every active gateway with the labels %s is at capacity (%d of them); the run stays queued until one has room",
		labelsText(req.Labels), out.Matching)
}

func dropCandidate(cs []placement.Candidate, id string) []placement.Candidate {
	if id == "" {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if c.ID != id {
			out = append(out, c)
		}
	}
	return out
}

// PlaceScope returns the scope's placement, placing it first when it has
// none (SPEC F2): on the active gateway whose labels satisfy req.Labels,
// least loaded relative to its capacity (placement.Choose), decided under a
// fleet-wide lock so concurrent placements count each other. Every later
// run of the scope goes to that gateway. No gateway fits:
// gateway_capacity_exhausted (ResourceExhausted), nothing written.
func (s *Store) PlaceScope(ctx context.Context, req PlaceRequest) (*Placement, error) {
	if p, err := s.ScopePlacement(ctx, req.Scope, req.TTL); p != nil || err != nil {
		return p, err
	}
	var p *Placement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockPlacements); err != nil {
			return err
		}
		gw, err := req.Fallback, error(nil)
		var ranBefore bool
		if req.Fallback != "" {
			// A scope that ran before placements existed has its root on
			// the static gateway: it stays there. The scope's runs are
			// found by runs_session_idx: coordinators has no index of
			// every run's scope (only of open ones), and a scan of it
			// under the placement lock made every new scope's placement
			// cost as much as the runs stored, 100,000 queued ones of
			// another company included (SPEC Q3, tether-bench-stack
			// -fairness).
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
 WHERE r.session_scope = $1 AND r.run_id <> $2 AND c.started_at IS NOT NULL)`, req.Scope, req.RunID).Scan(&ranBefore); err != nil {
				return err
			}
		}
		if !ranBefore {
			if gw, err = choose(ctx, tx, req, ""); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO executor.placements (session_scope, gateway_id) VALUES ($1, $2) ON CONFLICT (session_scope) DO NOTHING`,
			req.Scope, gw); err != nil {
			return err
		}
		if req.RunID != "" {
			if _, err := tx.Exec(ctx, `UPDATE executor.runs SET queued_reason = NULL, queued_message = NULL, queued_since = NULL
 WHERE run_id = $1 AND queued_reason IS NOT NULL`, req.RunID); err != nil {
				return err
			}
		}
		p, err = scanPlacement(tx.QueryRow(ctx, `SELECT `+placementColumns("$2")+`
  FROM executor.placements p LEFT JOIN executor.gateways g ON g.gateway_id = p.gateway_id
 WHERE p.session_scope = $1`, req.Scope, req.TTL.Microseconds()))
		return err
	})
	return p, err
}

// Move says when RePlace may move a scope.
type Move struct {
	// From is the gateway the scope must still be placed on.
	From string
	// Idle: only while no run of the scope is in flight (claimed).
	Idle bool
	// Checkpoint: only while this is still the scope's current
	// (unsuperseded) checkpoint, i.e. no run attached a runner since the
	// suspension that made it. Empty: not checked.
	Checkpoint string
	// Drained counts the move as progress of From's drain.
	Drained bool
}

// ErrMoveRefused is RePlace's answer when the move's conditions no longer
// hold (the scope moved already, a run took it, the checkpoint was
// superseded); nothing was written.
var ErrMoveRefused = errors.New("store: the scope's move conditions no longer hold")

// RePlace moves a scope off m.From to another gateway chosen as PlaceScope
// does (never m.From), under m's conditions: the placement row is locked
// first, so a driver that claimed a run of the scope (ScopePlacement reads
// under a share lock) sees either the old placement with its run in flight
// here (and the move is refused) or the new one. ErrMoveRefused when a
// condition fails; gateway_capacity_exhausted when no other gateway fits.
func (s *Store) RePlace(ctx context.Context, req PlaceRequest, m Move) (*Placement, error) {
	var p *Placement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var cur string
		err := tx.QueryRow(ctx, `SELECT gateway_id FROM executor.placements WHERE session_scope = $1 FOR UPDATE`, req.Scope).Scan(&cur)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && cur != m.From) {
			return ErrMoveRefused
		}
		if err != nil {
			return err
		}
		var blocked bool
		if err := tx.QueryRow(ctx, `
SELECT ($2 AND EXISTS (SELECT 1 FROM executor.coordinators c WHERE c.session_scope = $1 AND c.phase = 'observed'))
    OR ($3 <> '' AND NOT EXISTS (SELECT 1 FROM executor.session_checkpoints k
                                  WHERE k.session_scope = $1 AND k.checkpoint_id = $3 AND k.superseded_at IS NULL))`,
			req.Scope, m.Idle, m.Checkpoint).Scan(&blocked); err != nil {
			return err
		}
		if blocked {
			return ErrMoveRefused
		}
		if _, err := tx.Exec(ctx, lockPlacements); err != nil {
			return err
		}
		gw, err := choose(ctx, tx, req, m.From)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
UPDATE executor.placements SET gateway_id = $2, placed_at = now(), moved_from = $3, moves = moves + 1, moving_until = NULL
 WHERE session_scope = $1`, req.Scope, gw, m.From); err != nil {
			return err
		}
		if m.Drained {
			if _, err := tx.Exec(ctx, `UPDATE executor.gateways SET drain_moved = drain_moved + 1 WHERE gateway_id = $1`, m.From); err != nil {
				return err
			}
		}
		p, err = scanPlacement(tx.QueryRow(ctx, `SELECT `+placementColumns("$2")+`
  FROM executor.placements p LEFT JOIN executor.gateways g ON g.gateway_id = p.gateway_id
 WHERE p.session_scope = $1`, req.Scope, req.TTL.Microseconds()))
		return err
	})
	return p, err
}

// BeginMove marks scope as moving off gateway from for at most ttl (SPEC
// F4), only while it is still placed there and no run of it is in flight
// (claimed) or queued; ok is false otherwise. Until RePlace or EndMove, a
// run of the scope that is claimed waits in the queue (Placement.Moving),
// so nothing attaches to the scope's runner while it is suspended and
// moved. The row lock orders it with claims as RePlace does.
func (s *Store) BeginMove(ctx context.Context, scope, from string, ttl time.Duration) (ok bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var cur string
		err := tx.QueryRow(ctx, `SELECT gateway_id FROM executor.placements WHERE session_scope = $1 FOR UPDATE`, scope).Scan(&cur)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && cur != from) {
			return nil
		}
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE executor.placements SET moving_until = now() + $2 * interval '1 microsecond'
 WHERE session_scope = $1 AND NOT EXISTS (SELECT 1 FROM executor.coordinators c
                    WHERE c.session_scope = $1 AND c.phase NOT IN ('completed', 'terminal_failure'))`, scope, ttl.Microseconds())
		ok = err == nil && tag.RowsAffected() == 1
		return err
	})
	return ok, err
}

// EndMove ends a move that did not happen (the scope stays where it is).
func (s *Store) EndMove(ctx context.Context, scope, from string) error {
	_, err := s.pool.Exec(ctx, `UPDATE executor.placements SET moving_until = NULL WHERE session_scope = $1 AND gateway_id = $2`, scope, from)
	return err
}

// DeferRun hands a claimed run back to the queue without spending an
// attempt: it is due again after placement.DeferDelay of poll and shows reason (a stable code)
// and message while it waits (GetRun's queued_reason). The fence must
// hold: the claim is undone (attempt back to its previous value, no lease,
// not started when it never was).
func (s *Store) DeferRun(ctx context.Context, f Fence, reason failure.Reason, message string, poll time.Duration) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		delay, err := markQueued(ctx, tx, f.RunID, reason, message, poll)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLeaseLost(f)
		}
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE executor.coordinators c
   SET attempt = c.attempt - 1, lease_owner = NULL, lease_expires_at = NULL,
       phase = CASE WHEN c.attempt <= 1 THEN 'queued' ELSE 'retryable_failure' END,
       started_at = CASE WHEN c.attempt <= 1 THEN NULL ELSE c.started_at END,
       next_attempt_at = now() + $4 * interval '1 microsecond'
 WHERE c.run_id = $1 AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'`,
			f.RunID, f.Owner, int64(f.Attempt), delay.Microseconds())
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrLeaseLost(f)
		}
		return nil
	})
}

// markQueued shows reason and message on the run (GetRun's queued_reason)
// and returns how long it waits before its next claim: placement.DeferDelay
// of poll and the time it has waited for this reason (queued_since, kept
// while the reason stays the same).
func markQueued(ctx context.Context, tx pgx.Tx, runID string, reason failure.Reason, message string, poll time.Duration) (time.Duration, error) {
	var waited time.Duration
	err := tx.QueryRow(ctx, `
UPDATE executor.runs
   SET queued_since = CASE WHEN queued_reason IS NOT DISTINCT FROM $2 AND queued_since IS NOT NULL THEN queued_since ELSE now() END,
       queued_reason = $2, queued_message = $3
 WHERE run_id = $1
RETURNING now() - queued_since`, runID, string(reason), message).Scan(&waited)
	if err != nil {
		return 0, err
	}
	return placement.DeferDelay(poll, waited), nil
}

// WaitRun hands a run whose attempt attached (its turn may have started)
// back to the queue while its scope waits for a lost gateway (SPEC F7):
// the lease is released and the run is due again after placement.DeferDelay of poll, showing
// reason and message (GetRun's queued_reason). Unlike DeferRun the attempt
// stays spent and the turn generation is kept, so the next claim is a new
// attempt that resumes the same turn once the gateway is back (runnerd
// reconciles it from its journal, the way a takeover does); unlike
// RecordFailure no failure is recorded. The fence must hold.
func (s *Store) WaitRun(ctx context.Context, f Fence, reason failure.Reason, message string, poll time.Duration) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		delay, err := markQueued(ctx, tx, f.RunID, reason, message, poll)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLeaseLost(f)
		}
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE executor.coordinators c
   SET lease_owner = NULL, lease_expires_at = NULL, phase = 'retryable_failure',
       next_attempt_at = now() + $4 * interval '1 microsecond'
 WHERE c.run_id = $1 AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'`,
			f.RunID, f.Owner, int64(f.Attempt), delay.Microseconds())
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrLeaseLost(f)
		}
		return nil
	})
}

// labelsText renders wanted labels for a message.
func labelsText(l map[string]string) string {
	if len(l) == 0 {
		return "(any)"
	}
	return placement.FormatLabels(l)
}
