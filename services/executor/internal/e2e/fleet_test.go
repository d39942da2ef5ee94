package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// waitAttempt polls GetRun until the run's attempt reaches want.
func (h *harness) waitAttempt(ctx context.Context, client executorv1.ExecutorServiceClient, runID string, want uint64) *executorv1.Run {
	h.t.Helper()
	for {
		resp, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: runID})
		require.NoError(h.t, err)
		if resp.GetRun().GetAttempt() >= want {
			return resp.GetRun()
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s: want attempt %d, have %d", runID, want, resp.GetRun().GetAttempt())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// releaseStall ends the fake provider's "[stall:<phase>]" holds of a stack
// started with --die-once-dir dir (fakecodex.ReleaseFile).
func releaseStall(t *testing.T, dir, phase string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "release-"+phase), nil, 0o600))
}

// requireOneTerminal checks a run's log: contiguous, one run.terminal.
func (h *harness) requireOneTerminal(ctx context.Context, runID string) {
	h.t.Helper()
	evs := h.watch(ctx, runID, 0, nil)
	requireContiguous(h.t, evs)
	terminals := 0
	for _, e := range evs {
		if e.GetEvent().GetEventType() == "run.terminal" {
			terminals++
		}
	}
	require.Equal(h.t, 1, terminals, runID)
}

func TestF5_SIGTERMHandsEveryLeaseBackAndAnotherReplicaResumesEachTurnAtOnce(t *testing.T) {
	// A 10-minute lease and no same-host takeover on the successor: the
	// runs can only move within the test's deadline if the stopping
	// replica hands its leases back.
	// Each turn is held after its first delta ("[stall:mid-stream]")
	// until every run was taken over, however slow the machine.
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{LeaseTTL: 10 * time.Minute, FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const runs = 3
	for i := range runs {
		h.submit(fmt.Sprintf("handback-%d", i), fmt.Sprintf("handback-session-%d", i), fmt.Sprintf("[stall:mid-stream] turn %d: %s", i, slowTurn))
	}
	for i := range runs {
		h.waitForDelta(ctx, h.client, fmt.Sprintf("handback-%d", i))
	}
	require.NoError(t, h.st.AddExecutor("executor-2", "-same-host-takeover=false"))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	successor := h.clientFor("executor-2")

	stopped := time.Now()
	h.st.Proc("executor").Stop(30 * time.Second) // SIGTERM, waits for the exit
	for i := range runs {
		id := fmt.Sprintf("handback-%d", i)
		run := h.waitAttempt(ctx, successor, id, 2)
		t.Logf("%s resumed by %s %s after the SIGTERM", id, run.GetLeaseOwner(), time.Since(stopped).Round(time.Millisecond))
	}
	h.client = successor
	releaseStall(t, dir, "mid-stream")
	for i := range runs {
		id := fmt.Sprintf("handback-%d", i)
		run := h.waitState(ctx, successor, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 2, run.GetAttempt(), "taken over once, after the hand-back")
		require.Equal(t, "executor-2", run.GetLeaseOwner())
		h.requireOneTerminal(ctx, id)
	}
	require.Equal(t, runs, countLines(t, h.st.CallLog(), "turn/start"), "each provider turn started exactly once")
	require.Equal(t, runs, strings.Count(readFile(t, h.st.LogPath("executor")), `"msg":"lease handed back"`),
		"the stopping replica released every lease under its fence")
}

func TestF5_ExecutorsInDifferentPIDNamespacesNeverTakeALiveRunFromEachOther(t *testing.T) {
	t.Parallel()
	// "executor" runs in a PID namespace of its own (pid 1 there, as in a
	// container on this host); "executor-2" in the host's. Both keep
	// same-host takeover on and the lease is 10 minutes: a pid read in the
	// wrong namespace would "prove" the other dead and take its live run.
	h := newHarnessWith(t, stack.Options{LeaseTTL: 10 * time.Minute, FakeArgs: []string{"--delta-delay-ms", "60"}},
		"backup-verifier", "runnergw")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.st.SetOwnPIDNamespace("executor")
	h.st.SetExtraArgs("executor", "-max-active-runs", "1")
	_, err := h.st.Start(ctx, "executor")
	require.NoError(t, err)
	h.client = h.clientFor("executor")
	// "[shell]": the contained run waits for a command approval, so the
	// contained replica (it drives at most one run) is busy until the test
	// answers, however slow the machine: the next run can only be the host
	// replica's.
	h.submit("in-container", "pidns-a", "[shell] "+slowTurn)
	created := h.awaitRuntimeRequest(ctx, "in-container")

	// The host replica drives a longer run while the contained one is
	// busy, probing the contained one's lease on every idle poll; once the
	// contained run ends, the contained replica probes the host replica's
	// lease until its run ends.
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err = h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	host := h.clientFor("executor-2")
	long := strings.Repeat(slowTurn+" ", 3)
	_, err = host.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "on-host", Input: h.submitInput("pidns-b", long)})
	require.NoError(t, err)
	h.waitForDelta(ctx, host, "on-host")

	var nsA, nsB string
	var pidA int
	require.NoError(t, h.store().Pool().QueryRow(ctx, `
SELECT (SELECT controller_pid_ns FROM executor.coordinators WHERE run_id = 'in-container'),
       (SELECT controller_pid FROM executor.coordinators WHERE run_id = 'in-container'),
       (SELECT controller_pid_ns FROM executor.coordinators WHERE run_id = 'on-host')`).Scan(&nsA, &pidA, &nsB))
	require.NotEqual(t, nsA, nsB, "the replicas run in two PID namespaces")
	require.Equal(t, 1, pidA, "the contained replica is pid 1 in its namespace")
	accept, err := structpb.NewStruct(map[string]any{"decision": "accept"})
	require.NoError(t, err)
	_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "in-container",
		RequestId: created["requestId"].(string), TurnId: created["turnId"].(string), Resolution: accept})
	require.NoError(t, err)

	for id, owner := range map[string]string{"in-container": "executor", "on-host": "executor-2"} {
		run := h.waitState(ctx, host, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt(), "%s was never taken over", id)
		require.Equal(t, owner, run.GetLeaseOwner(), id)
	}
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// waitFleet waits until the named replicas all heartbeat and each has done
// so again after all were registered, so each one's view holds them all.
func (h *harness) waitFleet(ctx context.Context, owners ...string) {
	h.t.Helper()
	var since time.Time
	for {
		var n int
		var first time.Time
		require.NoError(h.t, h.store().Pool().QueryRow(ctx, `
SELECT count(*), coalesce(min(heartbeat_at), now()) FROM executor.replicas
 WHERE owner = ANY($1) AND heartbeat_at > now() - interval '2 seconds'`, owners).Scan(&n, &first))
		switch {
		case n == len(owners) && since.IsZero():
			require.NoError(h.t, h.store().Pool().QueryRow(ctx, `SELECT now()`).Scan(&since))
		case n == len(owners) && first.After(since):
			return
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("replicas %v did not all heartbeat", owners)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestF6_ClaimsSpreadFairlyOverThreeReplicasWhenOneReceivesEverySubmission(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "15"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	owners := []string{"executor", "executor-2", "executor-3"}
	for _, name := range owners[1:] {
		require.NoError(t, h.st.AddExecutor(name))
		_, err := h.st.Start(ctx, name)
		require.NoError(t, err)
	}
	h.waitFleet(ctx, owners...)
	// Every run is submitted to the first replica, which hears of each at
	// once (the others a notification later): 12 sessions of 5 turns.
	const runs, sessions = 60, 12
	for i := range runs {
		h.submit(fmt.Sprintf("fair-%02d", i), fmt.Sprintf("fair-session-%d", i%sessions), fmt.Sprintf("fair turn %d: %s", i, slowTurn))
	}
	claims := map[string]int{}
	for i := range runs {
		run := h.waitState(ctx, h.client, fmt.Sprintf("fair-%02d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt())
		claims[run.GetLeaseOwner()]++
	}
	t.Logf("claims per replica over %d runs: %v", runs, claims)
	for _, o := range owners {
		require.LessOrEqual(t, claims[o], runs/len(owners)*3/2, "no replica above 1.5× its fair share: %v", claims)
	}
	require.Equal(t, runs, countLines(t, h.st.CallLog(), "turn/start"))
}

// gateways lists the registry through the executor's GatewayRegistry.
func (h *harness) gateways(ctx context.Context) map[string]*executorv1.Gateway {
	h.t.Helper()
	conn, err := h.st.DialAs(h.st.Addr("executor"), stack.Operator)
	require.NoError(h.t, err)
	defer conn.Close()
	resp, err := executorv1.NewGatewayRegistryClient(conn).ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	require.NoError(h.t, err)
	out := map[string]*executorv1.Gateway{}
	for _, g := range resp.GetGateways() {
		out[g.GetGatewayId()] = g
	}
	return out
}

func TestF1_GatewaysOnThreeHostsAnnounceThemselvesAndOneThatDiesIsLost(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{ExecutorArgs: []string{"-gateway-ttl", "6s"}}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zones := map[string]string{"runnergw": "a", "runnergw-2": "b", "runnergw-3": "c"}
	for name, zone := range zones {
		args := append(h.st.RegistryArgs("executor"), "-labels", "zone="+zone+",gpu=false", "-capacity", map[string]string{"a": "10", "b": "20", "c": "30"}[zone])
		if name == "runnergw" {
			h.st.SetExtraArgs(name, args...)
		} else {
			require.NoError(t, h.st.AddGateway(name, args...))
		}
		_, err := h.st.Start(ctx, name)
		require.NoError(t, err)
	}
	gs := h.gateways(ctx)
	require.Len(t, gs, 3, "each gateway registered before it reported healthy")
	for name, zone := range zones {
		g := gs[stack.GatewayIDOf(name)]
		require.NotNil(t, g, name)
		require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, g.GetState(), name)
		require.Equal(t, map[string]string{"zone": zone, "gpu": "false"}, g.GetLabels())
		require.Equal(t, h.st.Addr(name), g.GetAddress())
	}
	require.EqualValues(t, 30, gs["runnergw-3"].GetCapacity())

	// A warm session on the first gateway shows as its load.
	h.submitWith(ctx, "load", "f1-load", "hello", map[string]string{"zone": "a"}, 0)
	h.waitState(ctx, h.client, "load", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Eventually(t, func() bool { return h.gateways(ctx)[stack.GatewayID].GetSessions() == 1 }, time.Minute, 100*time.Millisecond)

	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "tetherctl"), "-addr", h.st.Addr("executor"), "gateways").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `(?m)^runnergw-3\s+active\s+0%\s+0/30\s`, string(out))
	require.Regexp(t, `(?m)^runnergw\s+active\s+10%\s+1/10\s`, string(out))

	// The host dies: no heartbeat, lost after the TTL; the others stay.
	h.st.Proc("runnergw-3").Kill()
	require.Eventually(t, func() bool {
		return h.gateways(ctx)["runnergw-3"].GetState() == executorv1.GatewayState_GATEWAY_STATE_LOST
	}, time.Minute, 100*time.Millisecond)
	gs = h.gateways(ctx)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, gs["runnergw-2"].GetState())

	// A stopping gateway announces itself draining.
	stopping := h.st.Proc("runnergw-2")
	go stopping.Stop(30 * time.Second)
	require.Eventually(t, func() bool {
		return h.gateways(ctx)["runnergw-2"].GetState() == executorv1.GatewayState_GATEWAY_STATE_DRAINING
	}, time.Minute, 50*time.Millisecond)
	<-stopping.Done()
}

func TestF1_AGatewayWithABadCapacityAnotherLiveGatewaysIDOrItsStateRootDoesNotStart(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.st.SetExtraArgs("runnergw", h.st.RegistryArgs("executor")...)
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)

	// Another host claims the live gateway's id.
	require.NoError(t, h.st.AddGateway("runnergw-2", append(h.st.RegistryArgs("executor"), "-gateway-id", stack.GatewayID)...))
	_, err = h.st.Start(ctx, "runnergw-2")
	require.Error(t, err)
	require.Contains(t, readFile(t, h.st.LogPath("runnergw-2")), "gateway_id_conflict")
	for _, capacity := range []string{"0", "-1"} {
		require.NoError(t, h.st.AddGateway("runnergw-3", append(h.st.RegistryArgs("executor"), "-capacity", capacity)...))
		_, err = h.st.Start(ctx, "runnergw-3")
		require.Error(t, err)
		require.Contains(t, readFile(t, h.st.LogPath("runnergw-3")), "gateway_capacity_invalid")
	}
	// A second gateway pointed at the live gateway's state root.
	require.NoError(t, h.st.AddGateway("runnergw-4", append(h.st.RegistryArgs("executor"), "-state-root", h.st.RunnerStateRoot())...))
	_, err = h.st.Start(ctx, "runnergw-4")
	require.Error(t, err)
	require.Contains(t, readFile(t, h.st.LogPath("runnergw-4")), "is in use by another runnergw")
	gs := h.gateways(ctx)
	require.Len(t, gs, 1, "nothing of the refused gateways was registered")
	require.Equal(t, h.st.Addr("runnergw"), gs[stack.GatewayID].GetAddress())
}
