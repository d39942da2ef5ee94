package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/plan"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// E3: plan updates are stored rendered (a replay of the runner's bytes is a
// duplicate, not a conflict), the run keeps its latest plan, an oversized
// plan is refused with nothing of it written, and the result's plan
// artifact becomes the run's plan when it ends.
func TestE3_PlanUpdatesAreStoredRenderedAndTheRunKeepsItsLatestPlan(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	planOf := func() string {
		t.Helper()
		run, err := s.GetRun(ctx, "r")
		require.NoError(t, err)
		return run.GetPlan()
	}

	update := event("r", "ri", 1, plan.EventPlanUpdated, map[string]any{"source": "turn_plan", "explanation": "Fix it.",
		"steps": []any{map[string]any{"step": "Read", "status": "completed"}, map[string]any{"step": "Write", "status": "inProgress"}}})
	_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{update})
	require.NoError(t, err)
	checklist := "Fix it.\n\n- [x] Read\n- [ ] Write _(in progress)_"
	require.Equal(t, checklist, planOf())
	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{update})
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Duplicates: 1}, res, "the runner's replay is a duplicate")

	big := strings.Repeat("- [ ] a step\n", plan.MaxRefBytes/13+1)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{
		event("r", "ri", 2, plan.EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": big}),
	})
	require.NoError(t, err)
	require.Equal(t, checklist, planOf(), "an oversized plan is not kept")

	ref := "native-provider-plan:health-check-endpoint-v1#1-register-GET-health;2-add-API-tests"
	res, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{
		event("r", "ri", 3, plan.EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": ref}),
		event("r", "ri", 4, store.EventTerminal, map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed",
			"artifacts": []any{map[string]any{"kind": prp.ArtifactKindPlan, "ref": ref}}}),
	})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	want := "# Health check endpoint\n\n1. Register GET /health\n2. Add API tests"
	require.Equal(t, want, run.GetResult().GetPlan())
	require.Equal(t, want, run.GetPlan(), "the result's plan is the run's plan")

	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	var types []string
	for _, e := range evs {
		types = append(types, e.Event.GetEventType())
		require.NotContains(t, e.Event.GetPayload().String(), "a step", "nothing of the oversized plan is stored")
	}
	require.Equal(t, []string{plan.EventPlanUpdated, "harness.diagnostic", plan.EventPlanUpdated, store.EventTerminal}, types)
	require.Equal(t, failure.NativeProviderPlanTooLarge, evs[1].Event.GetPayload().GetFields()["code"].GetStringValue())
}
