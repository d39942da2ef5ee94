package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// fleetSessions is the fleet test's number of warm sessions: 12 in make
// test (bounded wall time on a shared machine); TETHER_F3_SESSIONS=30 runs
// the acceptance size.
func fleetSessions(t *testing.T) int {
	if v := os.Getenv("TETHER_F3_SESSIONS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 12
}

// killHost kills -9 a gateway together with every runnerd and provider
// process of its state root ("the host died") and returns how many of
// those it killed.
func (h *harness) killHost(name string) int {
	h.t.Helper()
	p := h.st.Proc(name)
	require.NoError(h.t, syscall.Kill(p.Pid(), syscall.SIGKILL))
	<-p.Done()
	return stack.KillProcessesUnder(h.st.RunnerStateRootOf(name))
}

// placements counts the stack's session scopes per gateway.
func (h *harness) placements(ctx context.Context) (map[string]int, map[string]string) {
	h.t.Helper()
	rows, err := h.store().Pool().Query(ctx, `SELECT session_scope, gateway_id FROM executor.placements`)
	require.NoError(h.t, err)
	defer rows.Close()
	count, by := map[string]int{}, map[string]string{}
	for rows.Next() {
		var sc, gw string
		require.NoError(h.t, rows.Scan(&sc, &gw))
		count[gw]++
		by[sc] = gw
	}
	require.NoError(h.t, rows.Err())
	return count, by
}

// runAll submits one run per session (runID fmt with the session index)
// through client, but for the sessions in skip (submitted already), and
// waits until each of the n runs succeeded.
func (h *harness) runAll(ctx context.Context, client executorv1.ExecutorServiceClient, n int, runID, prompt string, skip map[int]bool) []*executorv1.Run {
	h.t.Helper()
	for i := range n {
		if skip[i] {
			continue
		}
		in := h.submitInput(fmt.Sprintf("fleet-%02d", i), prompt)
		_, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf(runID, i), Input: in})
		require.NoError(h.t, err)
	}
	out := make([]*executorv1.Run, n)
	for i := range n {
		out[i] = h.waitState(ctx, client, fmt.Sprintf(runID, i), executorv1.RunState_RUN_STATE_SUCCEEDED)
	}
	return out
}

// TestF3_Fleet_AHostDiesAGatewayDrainsAndAnExecutorStops: the fleet
// end-to-end test (issue #11's acceptance), all real processes: three
// gateways on loopback (own state roots, ports, runner addresses: three
// simulated hosts), two executors, the backup verifier with a shared file
// blob store, PostgreSQL.
//   - 12 (TETHER_F3_SESSIONS=30: 30) warm sessions are spread by capacity (max/min ≤ 1.5), each
//     with a verified checkpoint.
//   - One gateway's host dies (kill -9 of runnergw, its runnerd and provider
//     processes): once it is lost, every affected session's next run is
//     re-placed and continues its thread on another gateway from its
//     verified checkpoint (same runner identity, the provider history);
//     no provider thread is started anew; tetherctl audit is clean.
//   - A second gateway is drained: its sessions move; no run fails.
//   - An executor is stopped (SIGTERM): its runs resume on the other one.
func TestF3_Fleet_AHostDiesAGatewayDrainsAndAnExecutorStops(t *testing.T) {
	t.Parallel()
	n := fleetSessions(t)
	// The turns in flight when the host dies and when the executor stops
	// are held after their first delta ("[stall:mid-stream]", once per
	// prompt: each names its session) instead of streaming slow deltas:
	// the host's are never released (their retries on another gateway run
	// at full speed), the stopping executor's once it stopped.
	dir := t.TempDir()
	h := newFleet(t, stack.Options{
		LeaseTTL: 10 * time.Minute, FakeArgs: []string{"--die-once-dir", dir},
		ExecutorArgs: []string{"-gateway-ttl", "3s", "-retry-delay", "1s", "-same-host-takeover=false"},
	}, []string{"executor", "executor-2"}, map[string][]string{
		"runnergw": {"-capacity", "30", "-labels", "zone=a"}, "runnergw-2": {"-capacity", "30", "-labels", "zone=b"},
		"runnergw-3": {"-capacity", "30", "-labels", "zone=c"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	gateways := []string{"runnergw", "runnergw-2", "runnergw-3"}
	began := time.Now()

	// 30 warm sessions, spread by capacity.
	first := h.runAll(ctx, h.client, n, "f3-%02d-1", "Remember the word tether.", nil)
	count, by := h.placements(ctx)
	t.Logf("%d sessions placed: %v (%s)", n, count, time.Since(began).Round(time.Millisecond))
	lo, hi := n, 0
	for _, g := range gateways {
		lo, hi = min(lo, count[stack.GatewayIDOf(g)]), max(hi, count[stack.GatewayIDOf(g)])
	}
	require.Positive(t, lo, "every gateway got sessions: %v", count)
	require.LessOrEqual(t, float64(hi)/float64(lo), 1.5, "spread by capacity: %v", count)

	// Each session gets a verified checkpoint (what -checkpoint-after does
	// on its own, TestF3_Stack_AWarmSessionIsCheckpointedSoonAfterASettledRun;
	// asked for here so that placement above saw only live sessions).
	for i := range n {
		resp, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme",
			NormalizedSessionId: fmt.Sprintf("fleet-%02d", i), Reason: "checkpoint", Suspend: true})
		require.NoError(t, err)
		require.Len(t, resp.GetCheckpoints(), 1)
	}
	// The host of runnergw-2 dies while two of its sessions run a turn.
	dead := "runnergw-2"
	affected, inFlight := map[string]bool{}, map[int]bool{}
	for i := range n {
		sc := scope.OfRun(first[i].GetRunId(), h.submitInput(fmt.Sprintf("fleet-%02d", i), ""))
		if by[sc] != dead {
			continue
		}
		affected[sc] = true
		if len(inFlight) < 2 {
			inFlight[i] = true
			in := h.submitInput(fmt.Sprintf("fleet-%02d", i), fmt.Sprintf("[stall:mid-stream] fleet-%02d: Which word did I ask you to remember?", i))
			_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("f3-%02d-2", i), Input: in})
			require.NoError(t, err)
		}
	}
	for i := range inFlight {
		h.waitForDelta(ctx, h.client, fmt.Sprintf("f3-%02d-2", i))
	}
	killed := h.killHost(dead)
	t.Logf("host %s died: the gateway and %d runnerd/provider processes killed; %d sessions on it, %d with a turn in flight",
		dead, killed, len(affected), len(inFlight))
	require.Positive(t, killed, "the runners of the turns in flight died with the host")
	require.Eventually(t, func() bool {
		return h.gateways(ctx)[dead].GetState() == executorv1.GatewayState_GATEWAY_STATE_LOST
	}, time.Minute, 100*time.Millisecond, "the gateway is lost")

	second := h.runAll(ctx, h.client, n, "f3-%02d-2", "Which word did I ask you to remember?", inFlight)
	_, by = h.placements(ctx)
	for i, run := range second {
		sc := scope.OfRun(run.GetRunId(), h.submitInput(fmt.Sprintf("fleet-%02d", i), ""))
		require.Contains(t, run.GetResult().GetFinalMessage(), "2 earlier messages", "%s continued its thread", run.GetRunId())
		require.Equal(t, first[i].GetRunnerInstanceId(), run.GetRunnerInstanceId(), "%s: the same runner identity", run.GetRunId())
		if affected[sc] {
			require.NotEqual(t, dead, by[sc], "%s was re-placed", run.GetRunId())
		}
		if !inFlight[i] {
			require.EqualValues(t, 1, run.GetAttempt(), run.GetRunId())
			continue
		}
		// The turn in flight on the dead host: its attempt ended
		// retryably once the scope moved (E11), the retry restored the
		// checkpoint on the new gateway and ran the turn there.
		require.EqualValues(t, 2, run.GetAttempt(), run.GetRunId())
		retried := h.controlEvents(ctx, run.GetRunId(), "run.retry_scheduled")
		require.Len(t, retried, 1, run.GetRunId())
		require.Contains(t, retried[0]["message"], "runner_gateway_lost", run.GetRunId())
		h.requireOneTerminal(ctx, run.GetRunId())
	}
	require.Equal(t, n, countLines(t, h.st.CallLog(), "thread/start"), "no provider thread was started anew")
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	t.Logf("failover: %d sessions continued from their checkpoints on other gateways (%s)", len(affected), time.Since(began).Round(time.Millisecond))

	// A second gateway drains: its sessions move, no run fails.
	drained := "runnergw-3"
	conn, err := h.st.DialAs(h.st.Addr("executor"), stack.Operator)
	require.NoError(t, err)
	defer conn.Close()
	_, err = executorv1.NewGatewayRegistryClient(conn).DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: drained, Reason: "test"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.gateways(ctx)[drained].GetDrain().GetDone() }, 3*time.Minute, 200*time.Millisecond, "the drain ends")
	third := h.runAll(ctx, h.client, n, "f3-%02d-3", "And now?", nil)
	count, _ = h.placements(ctx)
	require.Equal(t, map[string]int{stack.GatewayID: n}, count, "every session on the one gateway left")
	for _, run := range third {
		require.EqualValues(t, 1, run.GetAttempt(), run.GetRunId())
		require.Contains(t, run.GetResult().GetFinalMessage(), "4 earlier messages", run.GetRunId())
	}

	// An executor stops (SIGTERM): the runs it drives resume on the other.
	const slow = 6
	for i := range slow {
		in := h.submitInput(fmt.Sprintf("fleet-%02d", i), fmt.Sprintf("[stall:mid-stream] fleet-%02d: %s", i, slowTurn))
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("f3-%02d-4", i), Input: in})
		require.NoError(t, err)
	}
	for i := range slow {
		h.waitForDelta(ctx, h.client, fmt.Sprintf("f3-%02d-4", i))
	}
	stopped := time.Now()
	h.st.Proc("executor").Stop(30 * time.Second)
	other := h.clientFor("executor-2")
	h.client = other
	releaseStall(t, dir, "mid-stream")
	moved := 0
	for i := range slow {
		run := h.waitState(ctx, other, fmt.Sprintf("f3-%02d-4", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		if run.GetEndedAt().AsTime().After(stopped) {
			require.Equal(t, "executor-2", run.GetLeaseOwner(), run.GetRunId())
		}
		if run.GetAttempt() == 2 {
			moved++
		}
		h.requireOneTerminal(ctx, run.GetRunId())
	}
	t.Logf("SIGTERM of an executor: %d of %d runs resumed on the other, all done %s after the SIGTERM", moved, slow, time.Since(stopped).Round(time.Millisecond))
	require.Positive(t, moved, "the stopped executor's runs were handed back")
	rep, code = auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	require.Equal(t, n, countLines(t, h.st.CallLog(), "thread/start"))
	t.Logf("fleet test: %d sessions, %s", n, time.Since(began).Round(time.Millisecond))
}
