// Package fleet routes an executor's calls to runner gateways: each session
// scope's calls go to the gateway it is placed on (SPEC F2), over one client
// connection per gateway that every run, suspension and session call
// shares; and it drains gateways (SPEC F4).
package fleet

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Static is the gateway an executor names with -gateway-id and
// -gateway-addr. While the registry is empty every scope is placed on it,
// so a single-gateway deployment needs no registry; a scope placed on it
// that is not registered is dialed at Addr.
type Static struct {
	ID, Addr string
}

// gatewayLost is store.Placement.State of a gateway past its heartbeat TTL.
const gatewayLost = "lost"

// DefaultLostWait is how long a run whose scope cannot leave its lost
// gateway waits for it by default (the executor's -gateway-lost-wait).
const DefaultLostWait = 30 * time.Minute

// Router hands out the gateway client of a session scope.
type Router struct {
	// Logger logs failovers (default slog.Default()).
	Logger *slog.Logger
	// LostWait bounds how long a run whose scope is on a lost gateway and
	// cannot move waits for it (SPEC F7): past it, the run fails with
	// gateway_lost_wait_exceeded. 0: no bound (it waits until the gateway
	// returns or an operator replaces the session). NewRouter sets
	// DefaultLostWait.
	LostWait time.Duration

	store  *store.Store
	signer *grant.Signer
	dial   func(addr string) (*grpc.ClientConn, error)
	static Static
	ttl    time.Duration

	mu    sync.Mutex
	conns map[string]*gatewayConn // by gateway id
	// moved are the runs whose routing moved their scope off its lost
	// gateway (failOver), until the driver takes the fact (TakeMove).
	moved map[string]string // run id -> the lost gateway's id
}

type gatewayConn struct {
	addr   string
	conn   *grpc.ClientConn
	client gatewayv1.RunnerGatewayClient
}

// NewRouter returns a Router that places scopes in st (a gateway silent
// for ttl is lost), dials gateways with dial (the executor's -gateway-* TLS
// settings) and signs every call's grant with signer for the called
// gateway's id.
func NewRouter(st *store.Store, signer *grant.Signer, dial func(addr string) (*grpc.ClientConn, error), static Static, ttl time.Duration) *Router {
	return &Router{store: st, signer: signer, dial: dial, static: static, ttl: ttl, LostWait: DefaultLostWait,
		conns: map[string]*gatewayConn{}, moved: map[string]string{}}
}

// TakeMove reports whether routing run runID moved its session scope off
// its lost gateway (from), and forgets it. The run's driver asks after each
// routing: a run an earlier attempt drove on that gateway may have started
// its turn there, under the turn generation the move leaves behind (SPEC
// F3, R13).
func (r *Router) TakeMove(runID string) (from string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	from, ok = r.moved[runID]
	delete(r.moved, runID)
	return from, ok
}

func (r *Router) noteMove(runID, from string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.moved[runID] = from
}

// TTL is the gateway TTL placements are decided with.
func (r *Router) TTL() time.Duration { return r.ttl }

// Static is the executor's static gateway.
func (r *Router) Static() Static { return r.static }

// Client returns the (shared) client of gateway id at addr; an empty addr
// is the static gateway's when id is its id. A gateway that re-registered
// at another address gets a new connection; the old one is closed.
func (r *Router) Client(id, addr string) (gatewayv1.RunnerGatewayClient, error) {
	if addr == "" && id == r.static.ID {
		addr = r.static.Addr
	}
	if addr == "" {
		return nil, failure.New(codes.Unavailable, failure.RunnerGatewayUnavailable,
			"gateway %s is not in the registry and is not this executor's -gateway-id", id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.conns[id]; c != nil && c.addr == addr {
		return c.client, nil
	}
	conn, err := r.dial(addr)
	if err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.RunnerGatewayUnavailable, "dialing gateway %s at %s: %v", id, addr, err)
	}
	if old := r.conns[id]; old != nil {
		_ = old.conn.Close()
	}
	c := &gatewayConn{addr: addr, conn: conn, client: grant.Client(gatewayv1.NewRunnerGatewayClient(conn), r.signer, id)}
	r.conns[id] = c
	return c.client, nil
}

// Route returns the gateway client for a claimed run of scope, placing the
// scope first when it has no placement (store.PlaceScope: labels from the
// run's placement). A scope that cannot be placed now is
// gateway_capacity_exhausted.
func (r *Router) Route(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput) (gatewayv1.RunnerGatewayClient, error) {
	p, err := r.store.PlaceScope(ctx, store.PlaceRequest{Scope: scope, RunID: runID, Labels: in.GetRunner().GetLabels(),
		TTL: r.ttl, Fallback: r.static.ID})
	if err != nil {
		return nil, err
	}
	return r.RoutePlaced(ctx, runID, scope, in, p)
}

// RoutePlaced is Route for a scope whose placement p the caller read under
// its share lock, with the gateways' state for TTL (store.Claim's
// Preread): no read of its own unless the gateway is lost.
func (r *Router) RoutePlaced(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput, p *store.Placement) (gatewayv1.RunnerGatewayClient, error) {
	var err error
	if p.State == gatewayLost {
		if p, err = r.failOver(ctx, runID, scope, in, p); err != nil {
			return nil, err
		}
	}
	if p.Moving {
		return nil, failure.New(codes.Unavailable, failure.SessionScopeMoving,
			"session scope %s is being moved off gateway %s; the run stays queued until it is placed", scope, p.GatewayID)
	}
	return r.Client(p.GatewayID, p.Address)
}

// failOver re-places a scope whose gateway is lost (SPEC F3) on another
// active gateway chosen as a first placement is (its labels, least loaded);
// the scope's next attach restores its latest verified checkpoint there. A
// move another replica made first is followed. A scope that cannot follow
// (store.CanFailOver) stays placed there and its run waits for the gateway
// (waiting_for_gateway, SPEC F7) up to LostWait, then fails with
// gateway_lost_wait_exceeded (LostDecision).
func (r *Router) failOver(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput, from *store.Placement) (*store.Placement, error) {
	ok, err := r.store.CanFailOver(ctx, scope, runID)
	if err != nil {
		return nil, err
	}
	served := false
	if !ok {
		if served, err = r.store.RunServed(ctx, runID); err != nil {
			return nil, err
		}
	}
	switch LostDecision(ok, served, from.LostFor, r.LostWait) {
	case WaitForGateway:
		// The thread is only on the lost gateway's disk: the scope stays
		// placed there, so bringing that gateway back resumes it.
		until := "until it returns or the session is replaced"
		if served {
			until += " (a runner on it served this run: its turn may be in flight there)"
		} else if r.LostWait > 0 {
			until = "until " + from.LostSince.Add(r.LostWait).UTC().Format(time.RFC3339) + " (-gateway-lost-wait " + r.LostWait.String() + ")"
		}
		return nil, failure.New(codes.Unavailable, failure.WaitingForGateway,
			"session scope %s is on gateway %s, lost since %s; no verified checkpoint covers its newest turn, so the run "+
				"waits for the gateway %s: bring it back (the same -gateway-id and -state-root) or call ReplaceSession "+
				"(a fresh provider session)", scope, from.GatewayID, from.LostSince.UTC().Format(time.RFC3339), until)
	case FailRun:
		return nil, failure.New(codes.FailedPrecondition, failure.GatewayLostWaitExceeded,
			"session scope %s is on gateway %s, lost since %s, longer than -gateway-lost-wait %s, and has no verified "+
				"checkpoint to continue from elsewhere; nothing was started: bring the gateway back (the same -gateway-id and "+
				"-state-root) or call ReplaceSession (a fresh provider session)",
			scope, from.GatewayID, from.LostSince.UTC().Format(time.RFC3339), r.LostWait)
	}
	p, err := r.store.RePlace(ctx, store.PlaceRequest{Scope: scope, RunID: runID, Labels: in.GetRunner().GetLabels(), TTL: r.ttl},
		store.Move{From: from.GatewayID})
	if errors.Is(err, store.ErrMoveRefused) {
		// Followed: moved off the lost gateway all the same.
		r.noteMove(runID, from.GatewayID)
		return r.store.ScopePlacement(ctx, scope, r.ttl)
	}
	if err != nil {
		return nil, err
	}
	r.noteMove(runID, from.GatewayID)
	r.log().Warn("session scope failed over: its gateway is lost", "session_scope", scope, "run_id", runID,
		"lost_gateway_id", from.GatewayID, "gateway_id", p.GatewayID)
	return p, nil
}

// LostAction is what a run whose session scope is on a lost gateway does.
type LostAction int

const (
	// MoveOff: the scope moves to another gateway (its verified
	// checkpoint covers its newest turn, or it has no state to keep).
	MoveOff LostAction = iota
	// WaitForGateway: the run stays queued, waiting for the gateway.
	WaitForGateway
	// FailRun: the wait bound passed; the run fails.
	FailRun
)

// LostDecision decides for a run whose scope is on a gateway lost for
// lostFor (SPEC F7): a scope that can move (store.CanFailOver) moves at
// once; one that cannot waits for its gateway while lostFor is within bound
// (0: no bound), and its run fails after. A run a runner on the lost
// gateway served (served: it was in flight there when the host died) waits
// without bound: failing it would leave its turn unsettled on that host's
// root, which the host's return must reconcile from runnerd's journal
// (SPEC F8); ReplaceSession lets it move.
func LostDecision(canMove, served bool, lostFor, bound time.Duration) LostAction {
	switch {
	case canMove:
		return MoveOff
	case served || bound <= 0 || lostFor < bound:
		return WaitForGateway
	default:
		return FailRun
	}
}

func (r *Router) log() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

// ForScope returns the gateway client of a scope's placement; a scope
// never placed (it never ran) is the static gateway's.
func (r *Router) ForScope(ctx context.Context, scope string) (gatewayv1.RunnerGatewayClient, error) {
	p, err := r.store.ScopePlacement(ctx, scope, r.ttl)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return r.Client(r.static.ID, "")
	}
	return r.Client(p.GatewayID, p.Address)
}

// Close closes every gateway connection.
func (r *Router) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.conns {
		_ = c.conn.Close()
		delete(r.conns, id)
	}
}
