package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestD4_AGatewayStoppedWithDrainWaitHandsEveryWarmSessionOnBeforeItExits:
// a gateway started with -drain-wait (as the Kubernetes StatefulSet runs
// it) that receives SIGTERM — a pod deletion, an eviction, a rolling
// update — announces itself draining, keeps serving while the executors
// move its warm sessions through verified checkpoints to the other
// gateway, and exits as soon as none is left, well before the wait is
// over. Each session's next turn continues its thread there, started once.
// Without it the gateway stopped at once: its warm sessions, with no
// checkpoint of their newest turn, waited for the host to come back.
func TestD4_AGatewayStoppedWithDrainWaitHandsEveryWarmSessionOnBeforeItExits(t *testing.T) {
	t.Parallel()
	const drainWait = 90 * time.Second
	h := newFleet(t, stack.Options{}, []string{"executor"}, map[string][]string{
		"runnergw": {"-capacity", "10"}, "runnergw-2": {"-capacity", "10", "-drain-wait", drainWait.String()},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sessions = 4
	for i := range sessions {
		h.submitWith(ctx, fmt.Sprintf("stop-%d-1", i), fmt.Sprintf("stop-%d", i), "first", nil, 0)
	}
	onStopped := map[int]bool{}
	for i := range sessions {
		h.waitState(ctx, h.client, fmt.Sprintf("stop-%d-1", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		onStopped[i] = h.session(ctx, fmt.Sprintf("stop-%d", i)).GetGatewayId() == "runnergw-2"
	}
	moved := 0
	for _, on := range onStopped {
		if on {
			moved++
		}
	}
	require.Positive(t, moved, "runnergw-2 holds warm sessions")

	start := time.Now()
	h.st.Proc("runnergw-2").Stop(drainWait + 30*time.Second)
	took := time.Since(start)
	t.Logf("runnergw-2 drained %d warm sessions and stopped in %s", moved, took.Round(time.Millisecond))
	require.Less(t, took, drainWait, "the gateway stopped because it was drained, not because the wait ran out")
	log, err := os.ReadFile(h.st.LogPath("runnergw-2"))
	require.NoError(t, err)
	require.Contains(t, string(log), "drained: no session scope left")

	for i := range sessions {
		s := h.session(ctx, fmt.Sprintf("stop-%d", i))
		require.Equal(t, stack.GatewayID, s.GetGatewayId(), "every session is on the remaining gateway")
		if onStopped[i] {
			require.Equal(t, "gateway drained", s.GetCheckpoint().GetReason())
		}
	}
	for i := range sessions {
		h.submitWith(ctx, fmt.Sprintf("stop-%d-2", i), fmt.Sprintf("stop-%d", i), "second", nil, 0)
	}
	for i := range sessions {
		second := h.waitState(ctx, h.client, fmt.Sprintf("stop-%d-2", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, second.GetAttempt())
		require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages", "the thread kept its history")
	}
	calls := h.st.CallLog()
	require.Equal(t, sessions, countLines(t, calls, "thread/start"), "no session started a new thread")
	require.Equal(t, moved, countLines(t, calls, "thread/resume"))
	require.Equal(t, 2*sessions, countLines(t, calls, "turn/start"), "each turn started once")
	require.False(t, strings.Contains(string(log), "drain wait over"), "nothing was left behind")
	h.requireNoFailedRun(ctx)
}
