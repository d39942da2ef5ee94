package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// GatewayAnnouncement is what a gateway says of itself in a heartbeat.
type GatewayAnnouncement struct {
	ID, Address string
	Labels      map[string]string
	Capacity    int
	Sessions    int
	Draining    bool
}

// gatewayColumns are a gateway row's columns, its state derived with $ttl
// (the parameter named by ttlParam).
func gatewayColumns(ttlParam string) string {
	return `gateway_id, address, labels, capacity, sessions,
       CASE WHEN heartbeat_at <= now() - ` + ttlParam + ` * interval '1 microsecond' THEN 'lost'
            WHEN draining OR drain_requested_at IS NOT NULL THEN 'draining' ELSE 'active' END,
       registered_at, heartbeat_at,
       (SELECT count(*) FROM executor.placements p WHERE p.gateway_id = g.gateway_id)::int,
       drain_requested_at, coalesce(drain_reason, ''), drain_moved, coalesce(drain_requested_by, ''),
       CASE WHEN drain_requested_at IS NULL THEN 0 ELSE
         (SELECT count(DISTINCT p.session_scope) FROM executor.placements p
            JOIN executor.coordinators c ON c.session_scope = p.session_scope
           WHERE p.gateway_id = g.gateway_id AND c.phase NOT IN ('completed', 'terminal_failure'))::int END`
}

func scanGateway(row pgx.Row) (*executorv1.Gateway, error) {
	var (
		g           executorv1.Gateway
		labels      []byte
		state       string
		reg, heard  time.Time
		drainAt     *time.Time
		drainReason string
		drainBy     string
		moved, busy int32
	)
	if err := row.Scan(&g.GatewayId, &g.Address, &labels, &g.Capacity, &g.Sessions, &state, &reg, &heard,
		&g.PlacedScopes, &drainAt, &drainReason, &moved, &drainBy, &busy); err != nil {
		return nil, err
	}
	if drainAt != nil {
		g.Drain = &executorv1.DrainProgress{RequestedAt: timestamppb.New(*drainAt), Reason: drainReason,
			MovedScopes: moved, RemainingScopes: g.PlacedScopes, BusyScopes: busy, Done: g.PlacedScopes == 0, RequestedBy: drainBy}
	}
	if err := json.Unmarshal(labels, &g.Labels); err != nil {
		return nil, err
	}
	g.State = map[string]executorv1.GatewayState{
		"active": executorv1.GatewayState_GATEWAY_STATE_ACTIVE, "draining": executorv1.GatewayState_GATEWAY_STATE_DRAINING,
		"lost": executorv1.GatewayState_GATEWAY_STATE_LOST,
	}[state]
	g.RegisteredAt, g.LastHeartbeatAt = timestamppb.New(reg), timestamppb.New(heard)
	return &g, nil
}

// RegisterGateway records a gateway's announcement (its first or a
// heartbeat) in one transaction. A gateway that comes back after its
// shutdown (it announced draining) or after it was lost starts afresh: an
// operator's drain of it (DrainGateway) ends. A capacity of 0 or less is
// gateway_capacity_invalid; an id whose gateway lives (heartbeat within
// ttl) at another address is gateway_id_conflict and changes nothing; a
// lost gateway's id is taken over by the new address.
func (s *Store) RegisterGateway(ctx context.Context, a GatewayAnnouncement, ttl time.Duration) (*executorv1.Gateway, error) {
	if a.Capacity <= 0 {
		return nil, failure.New(codes.InvalidArgument, failure.GatewayCapacityInvalid,
			"gateway %s announced a capacity of %d sessions; it must be at least 1", a.ID, a.Capacity)
	}
	labels, err := json.Marshal(a.Labels)
	if err != nil {
		return nil, err
	}
	if a.Labels == nil {
		labels = []byte("{}")
	}
	var g *executorv1.Gateway
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var addr string
		var live bool
		err := tx.QueryRow(ctx, `
SELECT address, heartbeat_at > now() - $2 * interval '1 microsecond' FROM executor.gateways WHERE gateway_id = $1 FOR UPDATE`,
			a.ID, ttl.Microseconds()).Scan(&addr, &live)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case live && addr != a.Address:
			return failure.New(codes.AlreadyExists, failure.GatewayIDConflict,
				"gateway id %s is held by the live gateway at %s; %s must use another -gateway-id", a.ID, addr, a.Address)
		}
		g, err = scanGateway(tx.QueryRow(ctx, `
INSERT INTO executor.gateways AS g (gateway_id, address, labels, capacity, sessions, draining)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (gateway_id) DO UPDATE SET address = excluded.address, labels = excluded.labels, capacity = excluded.capacity,
       sessions = excluded.sessions, draining = excluded.draining, heartbeat_at = now(),
       -- An operator's drain lasts until the gateway restarts: it
       -- announced its shutdown (draining) or was lost, and is back.
       -- A gateway that goes on heartbeating after it announced its
       -- shutdown (-drain-wait) waits for its scopes to be moved: that
       -- is a drain it requested itself (SPEC D4).
       drain_requested_at = CASE WHEN NOT excluded.draining AND (g.draining OR g.heartbeat_at <= now() - $7 * interval '1 microsecond')
                                 THEN NULL
                                 WHEN excluded.draining AND g.draining THEN coalesce(g.drain_requested_at, now())
                                 ELSE g.drain_requested_at END,
       drain_reason = CASE WHEN excluded.draining AND g.draining AND g.drain_requested_at IS NULL THEN 'gateway stopping'
                           ELSE g.drain_reason END,
       drain_requested_by = CASE WHEN excluded.draining AND g.draining AND g.drain_requested_at IS NULL THEN 'gateway ' || excluded.gateway_id
                                 ELSE g.drain_requested_by END,
       drain_moved = CASE WHEN NOT excluded.draining AND (g.draining OR g.heartbeat_at <= now() - $7 * interval '1 microsecond')
                          THEN 0 ELSE g.drain_moved END,
       registered_at = CASE WHEN g.address = excluded.address THEN g.registered_at ELSE now() END
RETURNING `+gatewayColumns("$7"), a.ID, a.Address, labels, a.Capacity, a.Sessions, a.Draining, ttl.Microseconds()))
		return err
	})
	return g, err
}

// ListGateways lists every registered gateway, its state derived with ttl.
func (s *Store) ListGateways(ctx context.Context, ttl time.Duration) ([]*executorv1.Gateway, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+gatewayColumns("$1")+` FROM executor.gateways g ORDER BY gateway_id`, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*executorv1.Gateway
	for rows.Next() {
		g, err := scanGateway(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

// ListGatewaysPage is ListGateways a page at a time, by gateway id; the
// token of the next page is "" on the last one.
func (s *Store) ListGatewaysPage(ctx context.Context, ttl time.Duration, pageSize int, pageToken string) ([]*executorv1.Gateway, string, error) {
	if pageSize <= 0 {
		pageSize = 100
	}
	filter := filterDigest("gateways", nil)
	cur, _, err := decodePageToken(pageToken, filter)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+gatewayColumns("$1")+` FROM executor.gateways g WHERE g.gateway_id > $2 ORDER BY gateway_id LIMIT $3`,
		ttl.Microseconds(), cur.ID, pageSize+1)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []*executorv1.Gateway
	for rows.Next() {
		g, err := scanGateway(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > pageSize {
		out = out[:pageSize]
		next = encodePageToken(filter, pageCursor{ID: out[pageSize-1].GetGatewayId()})
	}
	return out, next, nil
}

// DrainGateway records an operator's drain of a gateway (SPEC F4): no new
// placements there from now on, and its scopes are moved off (fleet
// drainer). Repeating it changes nothing (the first request's time and
// reason stay). An unknown id is gateway_not_found.
func (s *Store) DrainGateway(ctx context.Context, id, reason string, ttl time.Duration) (*executorv1.Gateway, error) {
	g, err := scanGateway(s.pool.QueryRow(ctx, `
UPDATE executor.gateways g SET drain_requested_at = coalesce(g.drain_requested_at, now()),
       drain_reason = CASE WHEN g.drain_requested_at IS NULL THEN nullif($2, '') ELSE g.drain_reason END,
       drain_requested_by = CASE WHEN g.drain_requested_at IS NULL THEN nullif($4, '') ELSE g.drain_requested_by END
 WHERE g.gateway_id = $1
RETURNING `+gatewayColumns("$3"), id, reason, ttl.Microseconds(), ActorOf(ctx)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, failure.New(codes.NotFound, failure.GatewayNotFound, "no registered gateway has the id %q", id)
	}
	return g, err
}

// ScopeToMove is an idle scope placed on a gateway being drained.
type ScopeToMove struct {
	Scope, GatewayID string
	// Address is the gateway's registered address.
	Address string
	// LastRunID and Input are the scope's newest run, which has ended.
	LastRunID string
	Input     *prpv1.ExecutionInput
}

// ScopesToMove lists up to limit scopes placed on drained gateways that
// still heartbeat (within ttl; a lost gateway's scopes are failover's) and
// whose newest run has ended (no run queued or in flight), the oldest
// placement first.
func (s *Store) ScopesToMove(ctx context.Context, ttl time.Duration, limit int) ([]ScopeToMove, error) {
	rows, err := s.pool.Query(ctx, `
SELECT p.session_scope, p.gateway_id, g.address, r.run_id, r.input
  FROM executor.gateways g
  JOIN executor.placements p ON p.gateway_id = g.gateway_id
  JOIN LATERAL (SELECT l.run_id, l.input FROM executor.runs l
                 WHERE l.session_scope = p.session_scope ORDER BY l.submit_seq DESC LIMIT 1) r ON true
 WHERE g.drain_requested_at IS NOT NULL AND g.heartbeat_at > now() - $2 * interval '1 microsecond'
   AND NOT EXISTS (SELECT 1 FROM executor.coordinators c
                    WHERE c.session_scope = p.session_scope AND c.phase NOT IN ('completed', 'terminal_failure'))
 ORDER BY p.placed_at LIMIT $1`, limit, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeToMove, error) {
		var (
			m   ScopeToMove
			raw []byte
		)
		if err := row.Scan(&m.Scope, &m.GatewayID, &m.Address, &m.LastRunID, &raw); err != nil {
			return m, err
		}
		m.Input = &prpv1.ExecutionInput{}
		return m, proto.Unmarshal(raw, m.Input)
	})
}
