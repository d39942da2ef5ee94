package fleet_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/fleet"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { pgtest.MainCheckingLeaks(m) }

var migrator = pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version"))

const ttl = 15 * time.Second

type dialer struct {
	mu    sync.Mutex
	addrs []string
}

func (d *dialer) dial(addr string) (*grpc.ClientConn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, addr)
	d.mu.Unlock()
	return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func newRouter(t *testing.T) (*fleet.Router, *store.Store, *dialer) {
	t.Helper()
	st, err := store.Open(context.Background(), pgtest.NewDB(t, migrator), runrules.New())
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	d := &dialer{}
	r := fleet.NewRouter(st, grant.NewSigner(key, 0, nil), d.dial, fleet.Static{ID: "runnergw", Addr: "127.0.0.1:7401"}, ttl)
	t.Cleanup(r.Close)
	return r, st, d
}

func TestF2_RouterKeepsOneConnectionPerGatewayAndFollowsTheScopesPlacement(t *testing.T) {
	t.Parallel()
	r, st, d := newRouter(t)
	ctx := context.Background()

	// No registry: every scope is on the static gateway, one connection.
	static, err := r.Route(ctx, "run-1", "scope-1", &prpv1.ExecutionInput{})
	require.NoError(t, err)
	again, err := r.ForScope(ctx, "scope-1")
	require.NoError(t, err)
	require.Same(t, static, again)
	unplaced, err := r.ForScope(ctx, "never-ran")
	require.NoError(t, err)
	require.Same(t, static, unplaced)

	for _, id := range []string{"gw-a", "gw-b"} {
		_, err := st.RegisterGateway(ctx, store.GatewayAnnouncement{ID: id, Address: "10.0.0.1:" + id, Capacity: 4,
			Labels: map[string]string{"zone": id}}, ttl)
		require.NoError(t, err)
	}
	b, err := r.Route(ctx, "run-2", "scope-2", &prpv1.ExecutionInput{Runner: &prpv1.RunnerPlacement{Labels: map[string]string{"zone": "gw-b"}}})
	require.NoError(t, err)
	b2, err := r.Client("gw-b", "10.0.0.1:gw-b")
	require.NoError(t, err)
	require.Same(t, b, b2, "one client per gateway, reused")
	b3, err := r.Route(ctx, "run-3", "scope-2", &prpv1.ExecutionInput{})
	require.NoError(t, err)
	require.Same(t, b, b3, "a later run of the scope goes to its gateway")
	require.Equal(t, []string{"127.0.0.1:7401", "10.0.0.1:gw-b"}, d.addrs)

	// A gateway that re-registered at another address is dialed there.
	moved, err := r.Client("gw-b", "10.0.0.9:7401")
	require.NoError(t, err)
	require.NotSame(t, b, moved)

	_, err = r.Route(ctx, "run-4", "scope-4", &prpv1.ExecutionInput{Runner: &prpv1.RunnerPlacement{Labels: map[string]string{"zone": "c"}}})
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err))
	_, err = r.Client("gw-unknown", "")
	require.EqualValues(t, failure.RunnerGatewayUnavailable, failure.CodeOf(err))

	// A scope being moved (a drain) makes its runs wait.
	ok, err := st.BeginMove(ctx, "scope-2", "gw-b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = r.Route(ctx, "run-5", "scope-2", &prpv1.ExecutionInput{})
	require.EqualValues(t, failure.SessionScopeMoving, failure.CodeOf(err))
}

func TestF3_RouterFailsAScopeOverOffALostGatewayOnce(t *testing.T) {
	t.Parallel()
	r, st, _ := newRouter(t)
	ctx := context.Background()
	for _, id := range []string{"gw-a", "gw-b"} {
		_, err := st.RegisterGateway(ctx, store.GatewayAnnouncement{ID: id, Address: "10.0.0.1:" + id, Capacity: 4}, ttl)
		require.NoError(t, err)
	}
	first, err := r.Route(ctx, "run-1", "scope-1", &prpv1.ExecutionInput{})
	require.NoError(t, err)
	p, err := st.ScopePlacement(ctx, "scope-1", ttl)
	require.NoError(t, err)
	lost := p.GatewayID
	silence := func(id string) {
		_, err := st.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - interval '1 hour' WHERE gateway_id = $1`, id)
		require.NoError(t, err)
	}
	silence(lost)

	// The next run of the scope moves it to the live gateway, once.
	moved, err := r.Route(ctx, "run-2", "scope-1", &prpv1.ExecutionInput{})
	require.NoError(t, err)
	require.NotSame(t, first, moved)
	again, err := r.Route(ctx, "run-2", "scope-1", &prpv1.ExecutionInput{})
	require.NoError(t, err)
	require.Same(t, moved, again)
	var (
		moves int
		from  string
		now   string
	)
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT moves, moved_from, gateway_id FROM executor.placements WHERE session_scope = 'scope-1'`).
		Scan(&moves, &from, &now))
	require.Equal(t, 1, moves)
	require.Equal(t, lost, from)
	require.NotEqual(t, lost, now)

	// No live gateway left: the run waits, visibly, nothing fails.
	silence(now)
	_, err = r.Route(ctx, "run-3", "scope-1", &prpv1.ExecutionInput{})
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err), "%v", err)
}

// A scope whose thread is only on its lost gateway's disk (a runner served
// it, no verified checkpoint) does not move: its run waits (SPEC F7), and the
// scope stays placed there, so the gateway coming back resumes it; an
// operator's ReplaceSession lets it move (a fresh provider session). Moved
// without either, it would fail closed elsewhere and its old root could be
// resumed stale should it ever be placed back.
func TestF3_AScopeWithoutACheckpointStaysOnItsLostGatewayUntilItReturnsOrIsReplaced(t *testing.T) {
	t.Parallel()
	r, st, _ := newRouter(t)
	ctx := context.Background()
	register := func(id string) {
		_, err := st.RegisterGateway(ctx, store.GatewayAnnouncement{ID: id, Address: "10.0.0.1:" + id, Capacity: 4}, ttl)
		require.NoError(t, err)
	}
	silence := func(id string) {
		_, err := st.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - interval '1 minute' WHERE gateway_id = $1`, id)
		require.NoError(t, err)
	}
	register("gw-a")
	register("gw-b")
	in := &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "x"},
		Session:  &prpv1.Session{NormalizedSessionId: "thread", Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
	for _, id := range []string{"run-1", "run-2"} {
		_, err := st.Submit(ctx, id, in)
		require.NoError(t, err)
	}
	var scope string
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT session_scope FROM executor.runs WHERE run_id = 'run-1'`).Scan(&scope))
	first, err := r.Route(ctx, "run-1", scope, in)
	require.NoError(t, err)
	p, err := st.ScopePlacement(ctx, scope, ttl)
	require.NoError(t, err)
	home := p.GatewayID
	_, err = st.Pool().Exec(ctx, `UPDATE executor.runs SET runner_instance_id = 'runner-1', state = 'succeeded', ended_at = now() WHERE run_id = 'run-1'`)
	require.NoError(t, err)

	silence(home)
	_, err = r.Route(ctx, "run-2", scope, in)
	require.EqualValues(t, failure.WaitingForGateway, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "bring it back")
	require.Contains(t, err.Error(), "gateway "+home+", lost since ")
	p, err = st.ScopePlacement(ctx, scope, ttl)
	require.NoError(t, err)
	require.Equal(t, home, p.GatewayID, "the scope stays where its thread is")

	// The gateway comes back: the scope's runs go there again.
	register(home)
	back, err := r.Route(ctx, "run-2", scope, in)
	require.NoError(t, err)
	require.Same(t, first, back)

	// Lost again, and an operator gives the thread up: the scope moves.
	silence(home)
	_, err = st.RecordReplacement(ctx, store.ReplacementRequest{Scope: scope, CompanyID: "acme", SessionID: "thread",
		RequestedBy: "operator", Reason: "host gone for good"})
	require.NoError(t, err)
	moved, err := r.Route(ctx, "run-2", scope, in)
	require.NoError(t, err)
	require.NotSame(t, first, moved)
	p, err = st.ScopePlacement(ctx, scope, ttl)
	require.NoError(t, err)
	require.NotEqual(t, home, p.GatewayID)
}

// SPEC F7: what a run whose scope is on a lost gateway does.
func TestF7_LostDecisionMovesWaitsWithinTheBoundAndFailsAfterItUnlessTheRunWasInFlight(t *testing.T) {
	t.Parallel()
	const bound = 10 * time.Minute
	for _, tc := range []struct {
		name           string
		canMove, serve bool
		lostFor, bound time.Duration
		want           fleet.LostAction
	}{
		{"a checkpoint covers the newest turn: move at once", true, false, 0, bound, fleet.MoveOff},
		{"moves even past the bound", true, true, time.Hour, bound, fleet.MoveOff},
		{"cannot move: waits within the bound", false, false, time.Minute, bound, fleet.WaitForGateway},
		{"cannot move: fails at the bound", false, false, bound, bound, fleet.FailRun},
		{"cannot move: fails past the bound", false, false, time.Hour, bound, fleet.FailRun},
		{"no bound: waits", false, false, 100 * time.Hour, 0, fleet.WaitForGateway},
		{"in flight there: waits past the bound", false, true, time.Hour, bound, fleet.WaitForGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, fleet.LostDecision(tc.canMove, tc.serve, tc.lostFor, tc.bound))
		})
	}
}

// SPEC F7: past -gateway-lost-wait a run that never attached fails with
// gateway_lost_wait_exceeded, naming the gateway, since when and the bound;
// the scope stays placed where its thread is.
func TestF7_PastTheBoundARunOfAScopeThatCannotMoveFailsWithAStableReason(t *testing.T) {
	t.Parallel()
	r, st, _ := newRouter(t)
	r.LostWait = time.Minute
	ctx := context.Background()
	_, err := st.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "10.0.0.1:1", Capacity: 4}, ttl)
	require.NoError(t, err)
	_, err = st.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-b", Address: "10.0.0.2:1", Capacity: 4}, ttl)
	require.NoError(t, err)
	in := &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "x"},
		Session:  &prpv1.Session{NormalizedSessionId: "thread", Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
	for _, id := range []string{"run-1", "run-2"} {
		_, err := st.Submit(ctx, id, in)
		require.NoError(t, err)
	}
	var scope string
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT session_scope FROM executor.runs WHERE run_id = 'run-1'`).Scan(&scope))
	_, err = r.Route(ctx, "run-1", scope, in)
	require.NoError(t, err)
	p, err := st.ScopePlacement(ctx, scope, ttl)
	require.NoError(t, err)
	_, err = st.Pool().Exec(ctx, `UPDATE executor.runs SET runner_instance_id = 'runner-1', state = 'succeeded', ended_at = now() WHERE run_id = 'run-1'`)
	require.NoError(t, err)

	// Lost for 30 s (heartbeat TTL + 30 s ago): within the bound, it waits.
	_, err = st.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - $2 * interval '1 microsecond' WHERE gateway_id = $1`,
		p.GatewayID, (ttl + 30*time.Second).Microseconds())
	require.NoError(t, err)
	_, err = r.Route(ctx, "run-2", scope, in)
	require.EqualValues(t, failure.WaitingForGateway, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "(-gateway-lost-wait 1m0s)")
	// Lost for two minutes: past the bound, it fails.
	_, err = st.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - $2 * interval '1 microsecond' WHERE gateway_id = $1`,
		p.GatewayID, (ttl + 2*time.Minute).Microseconds())
	require.NoError(t, err)
	_, err = r.Route(ctx, "run-2", scope, in)
	require.EqualValues(t, failure.GatewayLostWaitExceeded, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "gateway "+p.GatewayID+", lost since ")
	require.Contains(t, err.Error(), "-gateway-lost-wait 1m0s")
	// A run a runner on it served (in flight when the host died) waits on.
	_, err = st.Pool().Exec(ctx, `UPDATE executor.runs SET runner_instance_id = 'runner-1' WHERE run_id = 'run-2'`)
	require.NoError(t, err)
	_, err = r.Route(ctx, "run-2", scope, in)
	require.EqualValues(t, failure.WaitingForGateway, failure.CodeOf(err), "%v", err)
	p2, err := st.ScopePlacement(ctx, scope, ttl)
	require.NoError(t, err)
	require.Equal(t, p.GatewayID, p2.GatewayID, "the scope stays where its thread is")
}
