package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestE1_Stack_RunUsageIsTheTurnsDeltaNotTheSessionTotal: two warm turns of
// one session through executor, runnergw, runnerd and the fake codex (whose
// thread total grows over the turns). Each run's result carries its own
// usage (the runner's runDelta) and the session's total beside it — on
// GetRun and on WatchRun's final message — no cost (codex reports none),
// and tetherctl's rendering shows the two on separate lines.
func TestE1_Stack_RunUsageIsTheTurnsDeltaNotTheSessionTotal(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("usage-1", "usage", "the first turn of a session")
	h.submit("usage-2", "usage", "the second turn, which reads the first")

	var sum executorv1.Usage
	for i, id := range []string{"usage-1", "usage-2"} {
		var out bytes.Buffer
		r := &cli.Renderer{W: &out}
		evs := h.watch(ctx, id, 0, r.Event)
		r.Flush()
		final := evs[len(evs)-1]
		require.Equal(t, "run.terminal", final.GetEvent().GetEventType())
		run := h.get(id)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
		res := run.GetResult()
		require.True(t, proto.Equal(res, final.GetResult()), "WatchRun's final message carries the recorded result")

		u, total := res.GetUsage(), res.GetSessionUsage()
		require.NotNil(t, u, "turn %d usage", i+1)
		require.NotNil(t, total, "turn %d session total", i+1)
		require.Positive(t, u.GetInputTokens())
		require.Positive(t, u.GetOutputTokens())
		require.Nil(t, res.CostUsd, "codex reports no cost")
		sum.InputTokens += u.GetInputTokens()
		sum.CachedInputTokens += u.GetCachedInputTokens()
		sum.OutputTokens += u.GetOutputTokens()
		require.True(t, proto.Equal(&sum, total), "turn %d: the session total (%v) is the sum of the turns' usage (%v)", i+1, total, &sum)
		if i == 1 {
			require.False(t, proto.Equal(u, total), "the second turn's usage is not the session total")
			require.Positive(t, u.GetCachedInputTokens(), "the second turn reads the first from the prompt cache")
		}

		text := out.String()
		turnLine := fmt.Sprintf("  turn usage: input %d (cached %d), output %d tokens\n", u.GetInputTokens(), u.GetCachedInputTokens(), u.GetOutputTokens())
		totalLine := fmt.Sprintf("  session total: input %d (cached %d), output %d tokens\n", total.GetInputTokens(), total.GetCachedInputTokens(), total.GetOutputTokens())
		require.Contains(t, text, turnLine, "rendered:\n%s", text)
		require.Contains(t, text, totalLine, "rendered:\n%s", text)
		require.Equal(t, 1, strings.Count(text, "usage:"), "one usage line per turn, rendered:\n%s", text)
	}
}
