package dispatch

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newStore(t *testing.T) *store.Store {
	t.Helper()
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	s, err := store.Open(context.Background(), dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func input(session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "x"},
		Session:  &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

// probeGateway records every Attach and, at that moment, what another
// connection sees of the run in the database.
type probeGateway struct {
	gatewayv1.RunnerGatewayClient
	store *store.Store
	mu    sync.Mutex
	seen  []*executorv1.Run
}

func (g *probeGateway) Attach(ctx context.Context, _ ...grpc.CallOption) (gatewayv1.RunnerGateway_AttachClient, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	// Read through the pool (another connection): only committed state shows.
	runs, _, err := g.store.ListRuns(context.Background(), store.ListFilter{}, 10, "")
	if err == nil {
		for _, r := range runs {
			if r.GetLeaseOwner() != "" {
				g.seen = append(g.seen, r)
			}
		}
	}
	return nil, status.Error(codes.InvalidArgument, "probe: no runner here")
}

func (g *probeGateway) attaches() []*executorv1.Run {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*executorv1.Run(nil), g.seen...)
}

func TestE7_NoRunnerIsContactedBeforeTheClaimCommitsOrWhenTheClaimIsRefused(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	for _, id := range []string{"has-result", "cancelled", "fresh"} {
		_, _, err := s.SubmitRun(ctx, id, input("s-"+id))
		require.NoError(t, err)
	}
	_, err := s.Pool().Exec(ctx, `UPDATE executor.coordinators SET phase = 'workspace_finalizing', result_id = 'native-result-1' WHERE run_id = 'has-result'`)
	require.NoError(t, err)
	_, err = s.RecordCancellation(ctx, store.CancelRequest{RunID: "cancelled", Scope: "run", Reason: "stop"})
	require.NoError(t, err)

	gw := &probeGateway{store: s}
	d := New(s, Config{Owner: "probe", LeaseTTL: time.Minute, PollInterval: 20 * time.Millisecond, Gateway: gw,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	require.Eventually(t, func() bool { return len(gw.attaches()) > 0 }, 10*time.Second, 10*time.Millisecond)
	// The refusal is recorded once the attach's facts (read beside it) are in.
	require.Eventually(t, func() bool {
		run, err := s.GetRun(context.Background(), "fresh")
		return err == nil && run.GetState() == executorv1.RunState_RUN_STATE_FAILED
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // give refused runs every chance to be (wrongly) picked
	cancel()
	<-done

	seen := gw.attaches()
	require.Len(t, seen, 1, "only the claimable run reached the gateway")
	require.Equal(t, "fresh", seen[0].GetRunId())
	require.Equal(t, "probe", seen[0].GetLeaseOwner(), "the claim was committed before the gateway was contacted")
	require.EqualValues(t, 1, seen[0].GetAttempt())
	run, err := s.GetRun(context.Background(), "fresh")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_FAILED, run.GetState(), "a permanent refusal fails the run under its code")
	require.Equal(t, "runner_attach_failed", run.GetFailure().GetCode())
	require.Contains(t, run.GetFailure().GetMessage(), "probe: no runner here")
}

// claimedRun is a store holding run "r", claimed by "me".
func claimedRun(t *testing.T) (*store.Store, *store.Claim) {
	t.Helper()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "me", time.Minute, store.Controller{})
	require.NoError(t, err)
	return s, c
}

func TestE7_LostRenewalSelfFencesTheDriver(t *testing.T) {
	t.Parallel()
	s, c := claimedRun(t)
	ctx := context.Background()
	k := newLeaseKeeper(s, "me", 3*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(nil, s))
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	k.add("r", c.Attempt, cancel)
	k.renew(ctx)
	require.NoError(t, runCtx.Err(), "a held lease is renewed")

	// Another replica took the run over (expired, claimed with attempt+1).
	_, err := s.Pool().Exec(ctx, `UPDATE executor.coordinators SET attempt = attempt + 1, lease_owner = 'other' WHERE run_id = 'r'`)
	require.NoError(t, err)
	k.renew(ctx)
	require.Error(t, runCtx.Err())
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(context.Cause(runCtx)))
}

func TestE7_DriverSelfFencesWhenRenewalsKeepFailing(t *testing.T) {
	t.Parallel()
	s, c := claimedRun(t)
	ctx := context.Background()
	k := newLeaseKeeper(s, "me", 3*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(nil, s))
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	k.add("r", c.Attempt, cancel)
	s.Close() // the database becomes unreachable: renewals fail
	k.renew(ctx)
	require.NoError(t, runCtx.Err(), "one failed renewal is within the bound")
	k.mu.Lock()
	k.held["r"].renewedAt = time.Now().Add(-2 * time.Second) // > TTL/2 since the last good renewal
	k.mu.Unlock()
	k.renew(ctx)
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(context.Cause(runCtx)), "the driver stopped on its own")
}

// SubmitAndClaim claims a run that can start at once in its submitting
// commit and drives it, without the claim loop (SPEC P4); before Run claims
// anything it only stores the run.
func TestP4_SubmitAndClaimDrivesARunItClaimedInTheSubmittingCommit(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	gw := &probeGateway{store: s}
	d := New(s, Config{Owner: "probe", LeaseTTL: time.Minute, PollInterval: time.Hour, Gateway: gw,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	created, stored, err := d.SubmitAndClaim(ctx, "early", input("s-early"))
	require.NoError(t, err)
	require.True(t, created)
	require.Nil(t, stored, "not claimed here: SubmitRun reads the run")
	run, err := s.GetRun(ctx, "early")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState(), "no dispatcher runs yet: only stored")
	_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET phase = 'completed', scope_head = false WHERE run_id = 'early'`)
	require.NoError(t, err)

	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.sem != nil
	}, 10*time.Second, 5*time.Millisecond)
	created, claimed, err := d.SubmitAndClaim(ctx, "fresh", input("s-fresh"))
	require.NoError(t, err)
	require.True(t, created)
	// The run as its claim committed, read in the same round trip (SubmitRun
	// answers it without another read).
	require.NotNil(t, claimed)
	require.Equal(t, "fresh", claimed.GetRunId())
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, claimed.GetState())
	require.Equal(t, "probe", claimed.GetLeaseOwner())
	require.EqualValues(t, 1, claimed.GetAttempt())
	// The claim loop sleeps (an hour's poll, no kick): the run reached the
	// gateway through the submission's own claim.
	require.Eventually(t, func() bool { return len(gw.attaches()) > 0 }, 10*time.Second, 10*time.Millisecond)
	seen := gw.attaches()
	require.Equal(t, "fresh", seen[0].GetRunId())
	require.Equal(t, "probe", seen[0].GetLeaseOwner(), "the claim was committed before the gateway was contacted")
	require.EqualValues(t, 1, seen[0].GetAttempt())
	cancel()
	<-done
	d.mu.Lock()
	require.Nil(t, d.sem, "no run is claimed on submission once Run stopped")
	d.mu.Unlock()
}

// placedRouter routes every run to gw and records how each was routed.
type placedRouter struct {
	gw    gatewayv1.RunnerGatewayClient
	mu    sync.Mutex
	calls []string
}

func (r *placedRouter) record(call string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
}

func (r *placedRouter) routed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *placedRouter) Route(_ context.Context, runID, _ string, _ *prpv1.ExecutionInput) (gatewayv1.RunnerGatewayClient, error) {
	r.record("route " + runID)
	return r.gw, nil
}

func (r *placedRouter) TTL() time.Duration { return 15 * time.Second }

func (r *placedRouter) RoutePlaced(_ context.Context, runID, _ string, _ *prpv1.ExecutionInput, p *store.Placement) (gatewayv1.RunnerGatewayClient, error) {
	r.record("placed " + runID + " on " + p.GatewayID)
	return r.gw, nil
}

// A run claimed in its submitting commit goes to its gateway with what that
// commit read (SPEC P4): the scope's placement is not read again before the
// Open; a scope with no placement yet is placed as before.
func TestP4_ARunClaimedOnSubmissionIsRoutedFromThePlacementItsClaimRead(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.PlaceScope(ctx, store.PlaceRequest{Scope: scope.OfRun("warm", input("s-warm")), TTL: time.Minute, Fallback: "gw-1"})
	require.NoError(t, err)
	gw := &probeGateway{store: s}
	router := &placedRouter{gw: gw}
	d := New(s, Config{Owner: "probe", LeaseTTL: time.Minute, PollInterval: time.Hour, Router: router,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.sem != nil
	}, 10*time.Second, 5*time.Millisecond)
	for _, id := range []string{"warm", "new"} {
		created, _, err := d.SubmitAndClaim(ctx, id, input("s-"+id))
		require.NoError(t, err)
		require.True(t, created)
		require.Eventually(t, func() bool {
			run, err := s.GetRun(ctx, id)
			return err == nil && run.GetState() == executorv1.RunState_RUN_STATE_FAILED // the probe refuses it
		}, 10*time.Second, 10*time.Millisecond)
	}
	cancel()
	<-done
	require.Equal(t, []string{"placed warm on gw-1", "route new"}, router.routed())
}

// SPEC P2: CancelRun waits for a local driver's acknowledgement on a
// signal, not by polling the record: every waiter of the run is woken once.
func TestP2_ACancellationAcknowledgementWakesTheRunsWaiters(t *testing.T) {
	t.Parallel()
	d := New(newStore(t), Config{Owner: "o", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	a, stopA := d.AwaitCancellationAck("r")
	b, stopB := d.AwaitCancellationAck("r")
	other, stopOther := d.AwaitCancellationAck("other")
	defer stopOther()
	stopB() // gave up: not woken, nothing left behind
	rec := &executorv1.Cancellation{IntentId: "i", DispatchState: "acknowledged"}
	d.cancellationAcked("r", rec)
	require.Same(t, rec, <-a, "the record as the acknowledging commit left it")
	stopA() // after the wake-up: a no-op
	select {
	case <-b:
		t.Fatal("a waiter that stopped waiting was woken")
	case <-other:
		t.Fatal("another run's waiter was woken")
	default:
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Len(t, d.ackWaiters, 1, "only the other run's waiter is left")
}

// A claim statement that reaches the database as the dispatcher stops may
// still commit. Its outcome must not be lost: the statement is not
// cancelled with the dispatcher, and a claim that committed after the stop
// is handed back at once, so another replica claims the run now instead of
// after the lease (here ten minutes) lapses. Nothing is claimed once the
// stop is seen. (TestF5_SIGTERMHandsEveryLeaseBack… once left a run under
// a dead replica's lease this way.)
func TestF5_AClaimThatCommitsWhileTheDispatcherStopsIsHandedBackAtOnce(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	bg := context.Background()
	_, _, err := s.SubmitRun(bg, "r", input("s"))
	require.NoError(t, err)
	d := New(s, Config{Owner: "stopping", LeaseTTL: 10 * time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	ctx, stop := context.WithCancel(bg)
	c, err := d.claim(ctx, func(cctx context.Context) (*store.Claim, error) {
		stop() // the dispatcher stops while the statement is on its way
		require.NoError(t, cctx.Err(), "the statement is not cancelled with the dispatcher")
		return s.ClaimNext(cctx, "stopping", 10*time.Minute, store.Controller{})
	})
	require.Nil(t, c)
	require.ErrorIs(t, err, context.Canceled)
	next, err := s.ClaimNext(bg, "successor", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NotNil(t, next, "the lease was handed back: claimable at once")
	require.Equal(t, "r", next.RunID)
	require.EqualValues(t, 2, next.Attempt)

	called := false
	c, err = d.claim(ctx, func(context.Context) (*store.Claim, error) { called = true; return nil, nil })
	require.Nil(t, c)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, called, "nothing is claimed once the stop is seen")
}

func TestP2_AnInterruptTheProviderAcknowledgedIsRecordedEvenWhenTheDriverStopped(t *testing.T) {
	t.Parallel()
	s, c := claimedRun(t)
	ctx := context.Background()
	out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "stop"})
	require.NoError(t, err)
	require.True(t, out.NeedsDispatch)
	d := New(s, Config{Owner: "me", LeaseTTL: time.Minute, Gateway: &probeGateway{store: s},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	// The run's terminal was persisted beside the acknowledgement: the
	// lease's renewal found it ended and stopped the driver.
	stopped, stop := context.WithCancelCause(ctx)
	stop(failure.New(codes.FailedPrecondition, failure.NativeSessionLeaseLost, "run r ended"))
	d.acknowledgeCancellation(stopped, c, out.Record.GetIntentId(), d.log)

	rec, err := s.Cancellation(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "acknowledged", rec.GetDispatchState())
	require.True(t, rec.GetDispatched())
}
