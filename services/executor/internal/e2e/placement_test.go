package e2e

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// newFleet starts the backup verifier, the named executors and the named
// gateways (separate hosts on loopback: own ports, state roots and runner
// addresses), each gateway announcing itself to every executor with its
// extra flags (e.g. -capacity, -labels). The harness's client is the first
// executor's.
func newFleet(t *testing.T, opts stack.Options, executors []string, gateways map[string][]string) *harness {
	t.Helper()
	h := newHarnessWith(t, opts, "backup-verifier")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, e := range executors {
		if e != "executor" {
			require.NoError(t, h.st.AddExecutor(e))
		}
	}
	for _, e := range executors {
		_, err := h.st.Start(ctx, e)
		require.NoError(t, err)
	}
	h.client = h.clientFor(executors[0])
	for _, name := range slices.Sorted(maps.Keys(gateways)) {
		args := append(h.st.RegistryArgs(executors...), gateways[name]...)
		if name == "runnergw" {
			h.st.SetExtraArgs(name, args...)
		} else {
			require.NoError(t, h.st.AddGateway(name, args...))
		}
		_, err := h.st.Start(ctx, name)
		require.NoError(t, err)
	}
	return h
}

// submitWith submits a warm run of session with placement labels and an
// idle timeout (0: the default).
func (h *harness) submitWith(ctx context.Context, runID, session, prompt string, labels map[string]string, idleSeconds int64) {
	h.t.Helper()
	in := h.submitInput(session, prompt)
	if labels != nil {
		in.Runner = &prpv1.RunnerPlacement{Labels: labels}
	}
	if idleSeconds > 0 {
		in.Session.Lifecycle.IdleTimeout = durationpb.New(time.Duration(idleSeconds) * time.Second)
	}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(h.t, err)
}

// session returns the session's one scope as GetSession describes it.
func (h *harness) session(ctx context.Context, session string) *executorv1.Session {
	h.t.Helper()
	resp, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: session})
	require.NoError(h.t, err)
	require.Len(h.t, resp.GetSessions(), 1)
	return resp.GetSessions()[0]
}

// gatewayNames maps a gateway id to its stack name.
func gatewayName(id string) string {
	if id == stack.GatewayID {
		return "runnergw"
	}
	return id
}

// hasRoot reports whether the named gateway holds runner state of the
// scope (in its durable root; state moved aside does not count).
func (h *harness) hasRoot(gateway, scope string) bool {
	_, ok := readRunnerState(h.t, filepath.Join(h.st.RunnerStateRootOf(gateway), scope))
	return ok
}

// tetherctl runs tetherctl against the first executor.
func (h *harness) tetherctl(ctx context.Context, args ...string) string {
	h.t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "tetherctl"), append([]string{"-addr", h.st.Addr("executor")}, args...)...).CombinedOutput()
	require.NoError(h.t, err, "%s", out)
	return string(out)
}

// registry is a GatewayRegistry client of the first executor.
func (h *harness) registry() executorv1.GatewayRegistryClient {
	h.t.Helper()
	conn, err := h.st.DialAs(h.st.Addr("executor"), stack.Operator)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return executorv1.NewGatewayRegistryClient(conn)
}

// requireNoFailedRun checks that no run of the stack failed.
func (h *harness) requireNoFailedRun(ctx context.Context) {
	h.t.Helper()
	var failed int
	require.NoError(h.t, h.store().Pool().QueryRow(ctx, `SELECT count(*) FROM executor.runs WHERE state <> 'succeeded'`).Scan(&failed))
	require.Zero(h.t, failed, "every run succeeded")
}

func TestF2_ScopesSpreadOverThreeGatewaysByCapacityAndEveryLaterRunGoesToTheScopesGateway(t *testing.T) {
	t.Parallel()
	h := newFleet(t, stack.Options{}, []string{"executor", "executor-2"}, map[string][]string{
		"runnergw":   {"-capacity", "4", "-labels", "zone=a"},
		"runnergw-2": {"-capacity", "8", "-labels", "zone=b"},
		"runnergw-3": {"-capacity", "12", "-labels", "zone=c"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sessions = 12
	for i := range sessions {
		h.submitWith(ctx, fmt.Sprintf("spread-%02d-1", i), fmt.Sprintf("spread-%02d", i), "first", nil, 0)
	}
	first := map[int]*executorv1.Run{}
	for i := range sessions {
		first[i] = h.waitState(ctx, h.client, fmt.Sprintf("spread-%02d-1", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
	}
	placed := map[string]int{}
	where := map[int]*executorv1.Session{}
	for i := range sessions {
		s := h.session(ctx, fmt.Sprintf("spread-%02d", i))
		require.NotEmpty(t, s.GetGatewayId())
		placed[s.GetGatewayId()]++
		where[i] = s
		require.True(t, h.hasRoot(gatewayName(s.GetGatewayId()), s.GetSessionScope()), "the scope's root is on its gateway")
	}
	t.Logf("placements of %d scopes over capacities 4/8/12: %v", sessions, placed)
	capacity := map[string]int{stack.GatewayID: 4, "runnergw-2": 8, "runnergw-3": 12}
	lo, hi := 10.0, 0.0
	for id, c := range capacity {
		require.LessOrEqual(t, placed[id], c, "no gateway above its capacity")
		r := float64(placed[id]) / float64(c)
		lo, hi = min(lo, r), max(hi, r)
	}
	require.Positive(t, lo, "every gateway took scopes: %v", placed)
	require.LessOrEqual(t, hi/lo, 2.0, "spread by capacity: %v", placed)
	gs := h.gateways(ctx)
	for id, n := range placed {
		require.EqualValues(t, n, gs[id].GetPlacedScopes(), id)
	}

	// Every later run of a scope goes to its gateway, through either
	// executor: the same warm runner and provider thread.
	other := h.clientFor("executor-2")
	for i := range sessions {
		_, err := other.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("spread-%02d-2", i),
			Input: h.submitInput(fmt.Sprintf("spread-%02d", i), "second")})
		require.NoError(t, err)
	}
	for i := range sessions {
		second := h.waitState(ctx, h.client, fmt.Sprintf("spread-%02d-2", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages")
		require.Equal(t, first[i].GetRunnerProcess().GetPid(), second.GetRunnerProcess().GetPid(), "the same warm runner")
		require.Equal(t, where[i].GetGatewayId(), h.session(ctx, fmt.Sprintf("spread-%02d", i)).GetGatewayId())
	}
	require.Equal(t, sessions, countLines(t, h.st.CallLog(), "thread/start"), "one provider thread per session")
	require.Equal(t, 2*sessions, countLines(t, h.st.CallLog(), "turn/start"))
	h.requireNoFailedRun(ctx)
}

func TestF2_ARunNoGatewayCanTakeStaysQueuedWithItsReasonAndIsPlacedWhenCapacityFreesUp(t *testing.T) {
	t.Parallel()
	// Heartbeats every second (a third of the TTL): freed capacity shows
	// soon.
	h := newFleet(t, stack.Options{ExecutorArgs: []string{"-gateway-ttl", "3s"}}, []string{"executor"}, map[string][]string{
		"runnergw": {"-capacity", "1", "-labels", "zone=a"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitQueued := func(runID string) *executorv1.Run {
		t.Helper()
		var run *executorv1.Run
		require.Eventually(t, func() bool {
			run = h.get(runID)
			return run.GetQueuedReason().GetCode() == failure.GatewayCapacityExhausted
		}, time.Minute, 50*time.Millisecond, "%s shows why it waits", runID)
		require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
		require.Zero(t, run.GetAttempt(), "waiting spends no attempt")
		require.Nil(t, run.GetFailure())
		return run
	}

	// Labels no gateway has: queued, with the reason.
	h.submitWith(ctx, "zone-b-1", "zone-b", "first", map[string]string{"zone": "b"}, 0)
	run := waitQueued("zone-b-1")
	require.Contains(t, run.GetQueuedReason().GetMessage(), "zone=b")

	// The one zone=a gateway holds one session at most: a second session
	// waits until the first one's idle suspension frees its place.
	h.submitWith(ctx, "zone-a-1", "zone-a-first", "first", map[string]string{"zone": "a"}, 1)
	h.waitState(ctx, h.client, "zone-a-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	h.submitWith(ctx, "zone-a-2", "zone-a-second", "first", map[string]string{"zone": "a"}, 0)
	h.waitState(ctx, h.client, "zone-a-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, stack.GatewayID, h.session(ctx, "zone-a-second").GetGatewayId())
	require.NotNil(t, h.session(ctx, "zone-a-first").GetCheckpoint(), "its place freed by a verified suspension")

	// A zone=b gateway registers: the waiting run is placed there.
	require.NoError(t, h.st.AddGateway("runnergw-2", append(h.st.RegistryArgs("executor"), "-labels", "zone=b")...))
	_, err := h.st.Start(ctx, "runnergw-2")
	require.NoError(t, err)
	run = h.waitState(ctx, h.client, "zone-b-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, run.GetAttempt())
	require.Nil(t, run.GetQueuedReason())
	require.Equal(t, "runnergw-2", h.session(ctx, "zone-b").GetGatewayId())
	h.requireNoFailedRun(ctx)
}

func TestF2_ASingleGatewayWithoutARegistryServesEveryScopeAsBefore(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Placement labels mean nothing without a registry: the static
	// gateway (-gateway-addr, -gateway-id) takes every scope.
	h.submitWith(ctx, "static-1", "static", "first", map[string]string{"zone": "x"}, 0)
	h.submitWith(ctx, "static-2", "static", "second", nil, 0)
	h.waitState(ctx, h.client, "static-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	second := h.waitState(ctx, h.client, "static-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages")
	s := h.session(ctx, "static")
	require.Equal(t, stack.GatewayID, s.GetGatewayId())
	require.True(t, s.GetRunnerConnected(), "runner lookups reach the scope's gateway")
	require.Empty(t, h.gateways(ctx), "nothing registered")
}

// drainAll drains the named gateway with `tetherctl gateways drain -wait`
// and returns its output.
func (h *harness) drainAll(ctx context.Context, gateway string) string {
	h.t.Helper()
	out := h.tetherctl(ctx, "gateways", "drain", stack.GatewayIDOf(gateway), "-reason", "maintenance", "-wait", "-timeout", "2m")
	require.Contains(h.t, out, "drained,")
	return out
}

func TestF4_DrainMovesIdleSessionsThroughVerifiedCheckpointsAndEachContinuesItsThreadElsewhere(t *testing.T) {
	t.Parallel()
	h := newFleet(t, stack.Options{}, []string{"executor", "executor-2"}, map[string][]string{
		"runnergw": {"-capacity", "10"}, "runnergw-2": {"-capacity", "10"}, "runnergw-3": {"-capacity", "10"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sessions = 6
	for i := range sessions {
		h.submitWith(ctx, fmt.Sprintf("drain-%d-1", i), fmt.Sprintf("drain-%d", i), "first", nil, 0)
	}
	before := map[int]*executorv1.Session{}
	first := map[int]*executorv1.Run{}
	onDrained := 0
	for i := range sessions {
		first[i] = h.waitState(ctx, h.client, fmt.Sprintf("drain-%d-1", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		before[i] = h.session(ctx, fmt.Sprintf("drain-%d", i))
		if before[i].GetGatewayId() == "runnergw-2" {
			onDrained++
		}
	}
	require.Positive(t, onDrained, "runnergw-2 holds sessions")

	out := h.drainAll(ctx, "runnergw-2")
	t.Logf("tetherctl gateways drain -wait:\n%s", out)
	require.Contains(t, out, fmt.Sprintf("drained, %d moved", onDrained))
	g := h.gateways(ctx)["runnergw-2"]
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_DRAINING, g.GetState())
	require.Zero(t, g.GetPlacedScopes())
	require.True(t, g.GetDrain().GetDone())
	require.Equal(t, "maintenance", g.GetDrain().GetReason())
	list := h.tetherctl(ctx, "gateways")
	require.Regexp(t, `(?m)^runnergw-2\s+draining\s.*drained, \d+ moved`, list)

	for i := range sessions {
		s := h.session(ctx, fmt.Sprintf("drain-%d", i))
		require.NotEqual(t, "runnergw-2", s.GetGatewayId())
		if before[i].GetGatewayId() == "runnergw-2" {
			require.Equal(t, "gateway drained", s.GetCheckpoint().GetReason())
			require.False(t, h.hasRoot("runnergw-2", s.GetSessionScope()), "the drained gateway keeps no root to resume")
		} else {
			require.Equal(t, before[i].GetGatewayId(), s.GetGatewayId(), "sessions elsewhere stay")
		}
	}

	// Every session's next run continues its provider thread; a moved one
	// restores its checkpoint on its new gateway (same runner identity,
	// new process).
	for i := range sessions {
		h.submitWith(ctx, fmt.Sprintf("drain-%d-2", i), fmt.Sprintf("drain-%d", i), "second", nil, 0)
	}
	for i := range sessions {
		second := h.waitState(ctx, h.client, fmt.Sprintf("drain-%d-2", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, second.GetAttempt())
		require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages", "the thread kept its history")
		require.Equal(t, first[i].GetRunnerInstanceId(), second.GetRunnerInstanceId())
		if before[i].GetGatewayId() == "runnergw-2" {
			s := h.session(ctx, fmt.Sprintf("drain-%d", i))
			require.True(t, h.hasRoot(gatewayName(s.GetGatewayId()), s.GetSessionScope()), "restored on its new gateway")
		}
	}
	require.Equal(t, sessions, countLines(t, h.st.CallLog(), "thread/start"), "no session started a new provider thread")
	require.Equal(t, onDrained, countLines(t, h.st.CallLog(), "thread/resume"))
	require.Equal(t, 2*sessions, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")

	// New sessions are never placed on the drained gateway.
	for i := range 3 {
		h.submitWith(ctx, fmt.Sprintf("after-%d", i), fmt.Sprintf("after-drain-%d", i), "hello", nil, 0)
	}
	for i := range 3 {
		h.waitState(ctx, h.client, fmt.Sprintf("after-%d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.NotEqual(t, "runnergw-2", h.session(ctx, fmt.Sprintf("after-drain-%d", i)).GetGatewayId())
	}
	h.requireNoFailedRun(ctx)
}

func TestF4_AnActiveRunFinishesOnTheDrainedGatewayAndItsScopeMovesOnceItEnded(t *testing.T) {
	t.Parallel()
	// The turn is held after its first delta ("[stall:mid-stream]") until
	// the drain was checked, however slow the machine. Equal gateways:
	// the tie goes to the lower id, runnergw.
	dir := t.TempDir()
	h := newFleet(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}}, []string{"executor"}, map[string][]string{
		"runnergw": {"-labels", "zone=a,host=1"}, "runnergw-2": {"-labels", "zone=a,host=2"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.submitWith(ctx, "busy-1", "busy", "[stall:mid-stream] "+slowTurn, map[string]string{"zone": "a"}, 0)
	h.waitForDelta(ctx, h.client, "busy-1")
	require.Equal(t, stack.GatewayID, h.session(ctx, "busy").GetGatewayId())

	resp, err := h.registry().DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: stack.GatewayID, Reason: "host maintenance"})
	require.NoError(t, err)
	d := resp.GetGateway().GetDrain()
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_DRAINING, resp.GetGateway().GetState())
	require.EqualValues(t, 1, d.GetRemainingScopes())
	require.EqualValues(t, 1, d.GetBusyScopes(), "its run is in flight")
	require.False(t, d.GetDone())
	// Draining twice is safe.
	_, err = h.registry().DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: stack.GatewayID})
	require.NoError(t, err)

	// The run finishes where it runs, then the scope moves.
	releaseStall(t, dir, "mid-stream")
	run := h.waitState(ctx, h.client, "busy-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, run.GetAttempt())
	require.Eventually(t, func() bool { return h.gateways(ctx)[stack.GatewayID].GetDrain().GetDone() }, time.Minute, 100*time.Millisecond)
	s := h.session(ctx, "busy")
	require.Equal(t, "runnergw-2", s.GetGatewayId())
	require.Equal(t, "gateway drained", s.GetCheckpoint().GetReason())

	h.submitWith(ctx, "busy-2", "busy", "and now?", map[string]string{"zone": "a"}, 0)
	second := h.waitState(ctx, h.client, "busy-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages")
	require.Equal(t, run.GetResult().GetProviderThreadId(), second.GetResult().GetProviderThreadId(), "the same provider thread")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"))
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"))

	// Bad input: an unknown gateway.
	_, err = h.registry().DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: "no-such-gateway"})
	require.EqualValues(t, failure.GatewayNotFound, failure.CodeOf(err))
	h.requireNoFailedRun(ctx)
}

func TestF4_ARollingRestartOfEveryGatewayOneAtATimeLosesNoTurn(t *testing.T) {
	t.Parallel()
	gateways := []string{"runnergw", "runnergw-2"}
	h := newFleet(t, stack.Options{}, []string{"executor", "executor-2"}, map[string][]string{
		"runnergw": {"-capacity", "8"}, "runnergw-2": {"-capacity", "8"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const sessions = 4
	turn := 0
	runTurn := func() {
		turn++
		for i := range sessions {
			h.submitWith(ctx, fmt.Sprintf("roll-%d-%d", i, turn), fmt.Sprintf("roll-%d", i), fmt.Sprintf("turn %d", turn), nil, 0)
		}
		for i := range sessions {
			run := h.waitState(ctx, h.client, fmt.Sprintf("roll-%d-%d", i, turn), executorv1.RunState_RUN_STATE_SUCCEEDED)
			require.EqualValues(t, 1, run.GetAttempt())
			require.Contains(t, run.GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*(turn-1)), "the thread kept every turn")
		}
	}
	runTurn()
	for _, gw := range gateways {
		h.drainAll(ctx, gw)
		for i := range sessions {
			require.NotEqual(t, stack.GatewayIDOf(gw), h.session(ctx, fmt.Sprintf("roll-%d", i)).GetGatewayId())
		}
		h.st.Proc(gw).Stop(30 * time.Second)
		_, err := h.st.Start(ctx, gw)
		require.NoError(t, err)
		require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, h.gateways(ctx)[stack.GatewayIDOf(gw)].GetState(),
			"the restarted gateway takes placements again")
		runTurn()
	}
	require.Equal(t, sessions, countLines(t, h.st.CallLog(), "thread/start"))
	require.Equal(t, sessions*turn, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
	h.requireNoFailedRun(ctx)
}
