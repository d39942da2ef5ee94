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
	"github.com/tether-run/tether/pkg/pgtest"
	"github.com/tether-run/tether/services/executor/internal/fleet"
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
	st, err := store.Open(context.Background(), pgtest.NewDB(t, migrator))
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
// it, no verified checkpoint) does not move: its run fails closed, and the
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
		_, err := st.Pool().Exec(ctx, `UPDATE executor.gateways SET heartbeat_at = now() - interval '1 hour' WHERE gateway_id = $1`, id)
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
	require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "bring the gateway back")
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
