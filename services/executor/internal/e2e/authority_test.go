package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

// store is the test's store of the stack's database: one pool for the
// whole test (opened on first use, closed with the test), not a new pool —
// and PostgreSQL connections — on every poll of a wait loop.
func (h *harness) store() *store.Store {
	h.t.Helper()
	h.dbMu.Lock()
	defer h.dbMu.Unlock()
	if h.db == nil {
		h.db = h.openStore()
	}
	return h.db
}

// openStore opens a store of its own (closed with the test): for hooks
// that must not apply to the test's other queries.
func (h *harness) openStore() *store.Store {
	h.t.Helper()
	s, err := store.Open(context.Background(), h.dsn, runrules.New())
	require.NoError(h.t, err)
	h.t.Cleanup(s.Close)
	return s
}

func (h *harness) actions(runID string) map[string]int {
	h.t.Helper()
	as, err := h.store().Activities(context.Background(), runID)
	require.NoError(h.t, err)
	out := map[string]int{}
	for _, a := range as {
		out[a.Action]++
	}
	return out
}

// waitForDelta watches a run until its first streamed delta, then returns.
func (h *harness) waitForDelta(ctx context.Context, client executorv1.ExecutorServiceClient, runID string) {
	h.t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: runID})
	require.NoError(h.t, err)
	for {
		m, err := stream.Recv()
		require.NoError(h.t, err, "run ended before streaming a delta")
		if m.GetEvent().GetEventType() == "item.delta" {
			return
		}
	}
}

func (h *harness) waitState(ctx context.Context, client executorv1.ExecutorServiceClient, runID string, want executorv1.RunState) *executorv1.Run {
	h.t.Helper()
	for {
		resp, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: runID})
		require.NoError(h.t, err)
		if resp.GetRun().GetState() == want {
			return resp.GetRun()
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s: want %s, have %s (%v)", runID, want, resp.GetRun().GetState(), resp.GetRun().GetFailure())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

const slowTurn = "a long answer with many words so that it streams for a while before it ends and can be interrupted"

// stalledTurn is slowTurn held after its first delta until the test
// releases it (releaseStall) or interrupts it: a stack started with
// --die-once-dir.
const stalledTurn = "[stall:mid-stream] " + slowTurn

func TestE6_CancelDuringATurnInterruptsTheProviderOnceAndAuditsIntentAndAckOnce(t *testing.T) {
	t.Parallel()
	// The turn is held after its first delta ("[stall:mid-stream]") until
	// it is cancelled, however slow the machine.
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("c1", "cancel", stalledTurn)
	h.waitForDelta(ctx, h.client, "c1")

	// Waits for the acknowledgement longer than the 5 s default: a loaded
	// machine may take that long.
	resp, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c1",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "budget hard stop", WaitTimeout: durationpb.New(30 * time.Second)})
	require.NoError(t, err)
	require.True(t, resp.GetActive())
	rec := resp.GetCancellation()
	require.Equal(t, "acknowledged", rec.GetDispatchState())
	require.True(t, rec.GetDispatched())
	require.Equal(t, "ISS-1", rec.GetIssueId())

	run := h.waitState(ctx, h.client, "c1", executorv1.RunState_RUN_STATE_CANCELLED)
	require.Equal(t, "acknowledged", run.GetCancellation().GetDispatchState(), "visible in GetRun")
	again, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c1",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "duplicate budget stop"})
	require.NoError(t, err)
	require.Equal(t, rec.GetIntentAuditId(), again.GetCancellation().GetIntentAuditId())

	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/interrupt"), "the provider was interrupted once")
	require.Equal(t, map[string]int{"native.cancellation_intent_recorded": 1, "native.cancellation_acknowledged": 1}, h.actions("c1"))
	evs := h.watch(ctx, "c1", 0, nil)
	requireContiguous(t, evs)
	require.Equal(t, "cancelled", evs[len(evs)-1].GetEvent().GetPayload().AsMap()["runTerminalState"])
}

// inProcessExecutor runs the executor's dispatcher and API in this process
// (so tests can install store hooks), against the stack's gateway.
func (h *harness) inProcessExecutor(owner string, hooks store.Hooks) executorv1.ExecutorServiceClient {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(h.t, store.Migrate(ctx, h.dsn))
	st := h.openStore()
	st.SetHooks(hooks)
	// Its log sits beside the stack's processes' logs: a failing test
	// shows it with theirs.
	logFile, err := os.Create(h.st.LogPath(owner))
	require.NoError(h.t, err)
	h.t.Cleanup(func() { logFile.Close() })
	log := slog.New(slog.NewJSONHandler(logFile, nil)).With("service", owner)
	d := dispatch.New(st, dispatch.Config{Owner: owner, LeaseTTL: 10 * time.Second, PollInterval: 100 * time.Millisecond,
		Gateway: h.gatewayClient(), Logger: log})
	hub := watch.NewHub(st)
	srv, err := grpcx.New(grpcx.Config{Name: "executor", GRPCAddr: "127.0.0.1:0", Logger: log})
	require.NoError(h.t, err)
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), &api.Server{Store: st, Hub: hub, Kick: d.Kick, Draining: srv.Draining()})
	require.NoError(h.t, srv.Listen())
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = srv.Serve(ctx) }()
	go func() {
		defer wg.Done()
		hub.Listen(ctx, st.Pool(), watch.Handlers{RunsDue: d.Kick, Cancel: d.CancelKick}, log)
	}()
	go func() { defer wg.Done(); _ = d.Run(ctx) }()
	conn, err := grpcx.Dial(srv.Addr().String(), "")
	require.NoError(h.t, err)
	h.t.Cleanup(func() {
		conn.Close()
		cancel()
		wg.Wait()
	})
	return executorv1.NewExecutorServiceClient(conn)
}

func TestE6_CancellationSurvivesAnInjectedAcknowledgementFailure(t *testing.T) {
	t.Parallel()
	// The turn is held after its first delta until it is cancelled.
	h := newHarnessWith(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}}, "runnergw")
	var mu sync.Mutex
	failures := 0
	client := h.inProcessExecutor("in-process", store.Hooks{BeforeCancellationAck: func(string) error {
		mu.Lock()
		defer mu.Unlock()
		failures++
		if failures == 1 {
			return errors.New("injected: acknowledgement write lost")
		}
		return nil
	}})
	h.client = client
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("c2", "cancel-fault", stalledTurn)
	h.waitForDelta(ctx, client, "c2")

	resp, err := client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c2",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "budget hard stop", WaitTimeout: durationpb.New(30 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, "acknowledged", resp.GetCancellation().GetDispatchState(), "the failed write was recovered")
	require.True(t, resp.GetCancellation().GetDispatched())
	mu.Lock()
	require.GreaterOrEqual(t, failures, 2, "the injected failure happened")
	mu.Unlock()
	h.waitState(ctx, client, "c2", executorv1.RunState_RUN_STATE_CANCELLED)
	third, err := client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c2",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "budget hard stop"})
	require.NoError(t, err)
	require.Equal(t, resp.GetCancellation().GetAcknowledgementAuditId(), third.GetCancellation().GetAcknowledgementAuditId(), "a pure no-op")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/interrupt"), "no second provider cancel")
	require.Equal(t, map[string]int{"native.cancellation_intent_recorded": 1, "native.cancellation_acknowledged": 1}, h.actions("c2"))
}

// killDriverMidTurn starts a slow run on the first executor, kills that
// executor with SIGKILL once the turn streams, then starts executor-2 with
// the given flags and waits for the run to succeed through it.
func killDriverMidTurn(t *testing.T, ttl time.Duration, successorArgs ...string) *executorv1.Run {
	h := newHarness(t, stack.Options{LeaseTTL: ttl, FakeArgs: []string{"--delta-delay-ms", "60"}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("crash", "crash", slowTurn)
	h.waitForDelta(ctx, h.client, "crash")
	h.st.Proc("executor").Kill()

	require.NoError(t, h.st.AddExecutor("executor-2", successorArgs...))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	successor := h.clientFor("executor-2")
	run := h.waitState(ctx, successor, "crash", executorv1.RunState_RUN_STATE_SUCCEEDED)
	// Taken over by the successor. (Usually attempt 2; on an overloaded
	// machine the first executor may first fence itself off for want of a
	// renewal within a short lease and claim the run again, attempt 2,
	// before it is killed: still one provider turn, below.)
	require.GreaterOrEqual(t, run.GetAttempt(), uint64(2), "taken over")
	require.Equal(t, "executor-2", run.GetLeaseOwner())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"), "the provider turn started exactly once")
	h.client = successor
	evs := h.watch(ctx, "crash", 0, nil)
	requireContiguous(t, evs)
	terminals := 0
	for _, e := range evs {
		if e.GetEvent().GetEventType() == "run.terminal" {
			terminals++
		}
	}
	require.Equal(t, 1, terminals)
	return run
}

func TestE7_KilledExecutorsRunIsTakenOverAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	killDriverMidTurn(t, 2*time.Second, "-same-host-takeover=false")
}

func TestE7_SameHostSuccessorTakesOverWithProofOfDeathBeforeExpiry(t *testing.T) {
	t.Parallel()
	// A 10-minute lease: the run can only finish within the test's deadline
	// if the successor proves the old controller dead instead of waiting.
	killDriverMidTurn(t, 10*time.Minute)
}

func TestE7_TwoExecutorsRacing200RunsCompleteEachOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "0"}, LeaseTTL: 30 * time.Second})
	require.NoError(t, h.st.AddExecutor("executor-2"))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	second := h.clientFor("executor-2")
	const runs, sessions = 200, 20
	for i := 0; i < runs; i++ {
		c := h.client
		if i%2 == 1 {
			c = second // submissions arrive at both replicas
		}
		in := h.submitInput(fmt.Sprintf("race-session-%d", i%sessions), fmt.Sprintf("race turn %d", i))
		_, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("race-%03d", i), Input: in})
		require.NoError(t, err)
	}
	owners := map[string]int{}
	for i := 0; i < runs; i++ {
		run := h.waitState(ctx, h.client, fmt.Sprintf("race-%03d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt(), "claimed exactly once")
		owners[run.GetLeaseOwner()]++
	}
	require.Equal(t, runs, countLines(t, h.st.CallLog(), "turn/start"), "one provider turn per run")
	require.Equal(t, sessions, countLines(t, h.st.CallLog(), "process-start"), "one provider per warm session")
	t.Logf("runs per executor: %v", owners)
	var stale, terminals int
	require.NoError(t, h.store().Pool().QueryRow(ctx, `
SELECT count(*) FILTER (WHERE e.writer_attempt <> c.attempt), count(*) FILTER (WHERE e.event_type = 'run.terminal')
  FROM executor.events e JOIN executor.coordinators c ON c.run_id = e.run_id`).Scan(&stale, &terminals))
	require.Zero(t, stale, "no row was written by a stale attempt")
	require.Equal(t, runs, terminals, "exactly one terminal event per run")
}

func TestE12_RunnerAndProviderProcessIdentityIsPersisted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h.submit("ident", "ident", "who runs me?")
	h.watch(ctx, "ident", 0, nil)
	run := h.get("ident")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState())
	for name, p := range map[string]interface {
		GetPid() int32
		GetPgid() int32
		GetStartTicks() uint64
	}{"runner": run.GetRunnerProcess(), "provider": run.GetProviderProcess()} {
		require.Positive(t, p.GetPid(), name)
		require.Equal(t, p.GetPid(), p.GetPgid(), "%s leads its own process group", name)
		require.Positive(t, p.GetStartTicks(), name)
	}
	require.NotEqual(t, run.GetRunnerProcess().GetPid(), run.GetProviderProcess().GetPid())
}

func TestE6_ACancellationWhoseDispatchFailedIsDispatchedOnRetry(t *testing.T) {
	t.Parallel()
	// The turn must outlast the gateway's restart and the re-attach: at 600
	// ms a delta (≈ 12 s) it ended first on a loaded box (the restart took 11
	// s), its run.terminal acknowledged the cancellation and the run
	// succeeded instead of being cancelled. Held after its first delta
	// ("[stall:mid-stream]", never released) it lasts until interrupted
	// (at most fakecodex.StallLimit, a minute).
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("c3", "cancel-retry", stalledTurn)
	h.waitForDelta(ctx, h.client, "c3")
	// The gateway is down: the driver cannot reach the runner.
	h.st.Proc("runnergw").Kill()
	first, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c3",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "budget hard stop", WaitTimeout: durationpb.New(500 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, "pending", first.GetCancellation().GetDispatchState(), "not dispatched while the runner is unreachable")
	require.False(t, first.GetCancellation().GetDispatched())

	_, err = h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	retry, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "c3",
		Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "retry budget stop", WaitTimeout: durationpb.New(20 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, "acknowledged", retry.GetCancellation().GetDispatchState(), "the retry dispatched")
	require.True(t, retry.GetCancellation().GetDispatched())
	require.Equal(t, first.GetCancellation().GetIntentAuditId(), retry.GetCancellation().GetIntentAuditId())
	h.waitState(ctx, h.client, "c3", executorv1.RunState_RUN_STATE_CANCELLED)
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/interrupt"))
	require.Equal(t, map[string]int{"native.cancellation_intent_recorded": 1, "native.cancellation_acknowledged": 1}, h.actions("c3"))
}
