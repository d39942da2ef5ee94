package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
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
            WHEN draining THEN 'draining' ELSE 'active' END,
       registered_at, heartbeat_at`
}

func scanGateway(row pgx.Row) (*executorv1.Gateway, error) {
	var (
		g          executorv1.Gateway
		labels     []byte
		state      string
		reg, heard time.Time
	)
	if err := row.Scan(&g.GatewayId, &g.Address, &labels, &g.Capacity, &g.Sessions, &state, &reg, &heard); err != nil {
		return nil, err
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
// heartbeat) in one transaction. A capacity of 0 or less is
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
       registered_at = CASE WHEN g.address = excluded.address THEN g.registered_at ELSE now() END
RETURNING `+gatewayColumns("$7"), a.ID, a.Address, labels, a.Capacity, a.Sessions, a.Draining, ttl.Microseconds()))
		return err
	})
	return g, err
}

// ListGateways lists every registered gateway, its state derived with ttl.
func (s *Store) ListGateways(ctx context.Context, ttl time.Duration) ([]*executorv1.Gateway, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+gatewayColumns("$1")+` FROM executor.gateways ORDER BY gateway_id`, ttl.Microseconds())
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
