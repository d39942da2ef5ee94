package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestQ3_ARealExecutorStartsAnotherCompanysRunAheadOfABacklog: the executor
// drives one run at a time (-max-active-runs 1). acme holds the slot with a
// slow turn (about 4 s) and queues 8 more runs, each heading a session of its own (all
// due); globex then submits one run. When the slot frees, fair share gives
// it to globex at the latest after one more of acme's runs (the two
// companies tie and acme's id sorts first): a FIFO claim would have started
// all 8 of acme's runs first. Every run still succeeds, each once.
func TestQ3_ARealExecutorStartsAnotherCompanysRunAheadOfABacklog(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "40"}, ExecutorArgs: []string{"-max-active-runs", "1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	submit := func(runID, company, session, prompt string) {
		in := h.submitInput(session, prompt)
		in.Binding.CompanyId = company
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
		require.NoError(t, err)
	}
	submit("fair-acme-hold", "acme", "fair-acme-hold", "hold the slot: "+strings.Repeat(slowTurn+" ", 5))
	h.waitState(ctx, h.client, "fair-acme-hold", executorv1.RunState_RUN_STATE_RUNNING)
	const backlog = 8
	for i := range backlog {
		submit(fmt.Sprintf("fair-acme-%d", i), "acme", fmt.Sprintf("fair-acme-%d", i), "hi")
	}
	submit("fair-globex", "globex", "fair-globex", "hi")
	// The premise: acme's backlog and globex's run all wait for the slot.
	held, err := h.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "fair-acme-hold"})
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, held.GetRun().GetState(), "the slow turn still holds the slot after every submission")

	hold := h.waitState(ctx, h.client, "fair-acme-hold", executorv1.RunState_RUN_STATE_SUCCEEDED)
	globex := h.waitState(ctx, h.client, "fair-globex", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 1, globex.GetAttempt())
	ahead := 0
	for i := range backlog {
		run := h.waitState(ctx, h.client, fmt.Sprintf("fair-acme-%d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt())
		require.True(t, run.GetStartedAt().AsTime().After(hold.GetStartedAt().AsTime()), "the backlog starts after the run holding the slot")
		if run.GetStartedAt().AsTime().Before(globex.GetStartedAt().AsTime()) {
			ahead++
		}
	}
	t.Logf("acme's queued runs started before globex's run: %d of %d", ahead, backlog)
	require.LessOrEqual(t, ahead, 1, "globex's run waits for at most one of acme's queued runs, not for the backlog")
	require.Equal(t, backlog+2, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
}
