package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestE10_PerTurnRunnersStopOnceTheirRunsSettle: a per_turn run has no warm
// session to keep, so once it settled its runnerd and provider stop — the
// executor closes the session (session.close) and waits for the runner's
// answer — instead of living until the gateway's idle timeout (here 10
// minutes, far beyond the test). Each runner settles suspended (a later run
// of its scope continues it), and what it emitted while closing is filed
// (parked for the scope's next run), so its outbox is empty.
func TestE10_PerTurnRunnersStopOnceTheirRunsSettle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{GatewayArgs: []string{"-idle-timeout", "10m"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 8
	for i := range n {
		in, err := cli.InputSpec{Prompt: "per-turn " + fmt.Sprint(i), Company: "acme", Agent: "agent-1",
			Session: fmt.Sprintf("pt-%d", i), Lifecycle: "per_turn"}.Input()
		require.NoError(t, err)
		_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("pt-%d", i), Input: in})
		require.NoError(t, err)
	}
	for i := range n {
		h.waitState(ctx, h.client, fmt.Sprintf("pt-%d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
	}

	gw := h.gatewayClient()
	var runners []*gatewayv1.Runner
	live := func() []string {
		resp, err := gw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
		require.NoError(t, err)
		runners = resp.GetRunners()
		var out []string
		for _, r := range runners {
			if r.GetConnected() || r.GetLifecycle() != "exited" || alive(r.GetRunnerProcess().GetPid()) {
				out = append(out, fmt.Sprintf("%s %s connected=%v pid=%d", r.GetSessionScope()[:12], r.GetLifecycle(),
					r.GetConnected(), r.GetRunnerProcess().GetPid()))
			}
		}
		return out
	}
	// The runs settled; their runners are closing. A runner that was never
	// closed idles for ten minutes.
	deadline := time.Now().Add(30 * time.Second)
	for left := live(); len(left) > 0; left = live() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d per-turn runners still live after their runs settled:\n%s", len(left), n, strings.Join(left, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Len(t, runners, n)
	for _, r := range runners {
		require.False(t, alive(r.GetProviderProcess().GetPid()), "the provider of %s stopped", r.GetSessionScope())
		st, err := runnerstate.Read(filepath.Join(h.st.RunnerStateRoot(), r.GetSessionScope()))
		require.NoError(t, err)
		require.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle, "closed as a resumable suspension")
		require.Equal(t, "session_closed", st.LifecycleReason)
	}
	require.Equal(t, n, h.count(`SELECT count(DISTINCT session_scope) FROM executor.parked_events`),
		"what each runner emitted as it closed (runner.suspended) is filed for its scope's next run")
}

// alive reports whether process pid exists (0: no process).
func alive(pid int32) bool {
	return pid > 0 && syscall.Kill(int(pid), 0) == nil
}
