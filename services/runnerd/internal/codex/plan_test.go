package codex

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/testing/fakecodex"
)

// E3: turn/plan/updated and completed plan items become run.plan_updated
// events with the provider's data; the turn's last plan item is its
// native_provider_plan artifact.
func TestE3_PlanUpdatesAndPlanItemsBecomeRunPlanUpdatedEvents(t *testing.T) {
	t.Parallel()
	bin, root, codexHome, workspace := fakeDirs(t)
	ctx := context.Background()
	s, rec := startSession(t, fakeConfig(t, bin, codexHome, workspace, filepath.Join(root, "calls.log")))
	_, _, err := s.OpenThread(ctx, "")
	require.NoError(t, err)

	turnID, err := s.StartTurn(ctx, "plan this [plan] [plan-item:# Plan\n\n1. a]")
	require.NoError(t, err)
	res := waitTurn(t, s)
	require.Equal(t, TurnCompleted, res.Status)
	require.Equal(t, []Artifact{{Kind: prp.ArtifactKindPlan, Ref: "# Plan\n\n1. a"}}, res.Artifacts)

	evs := rec.ofType(EventPlanUpdated)
	require.Len(t, evs, 3)
	steps := func(statuses ...string) []any {
		out := make([]any, len(statuses))
		for i, st := range statuses {
			out[i] = map[string]any{"step": fakecodex.PlanSteps[i], "status": st}
		}
		return out
	}
	require.Equal(t, map[string]any{"source": "turn_plan", "explanation": fakecodex.PlanExplanation,
		"steps": steps("inProgress", "pending", "pending")}, evs[0].Payload)
	require.Equal(t, map[string]any{"source": "turn_plan", "explanation": fakecodex.PlanExplanation,
		"steps": steps("completed", "completed", "completed")}, evs[1].Payload)
	require.Equal(t, map[string]any{"source": "plan_item", "markdown": "# Plan\n\n1. a"}, evs[2].Payload)
	for _, e := range evs {
		require.Equal(t, turnID, e.TurnID)
		require.Equal(t, PriorityP1, e.Priority)
	}

	// A turn without a plan item reports no artifact.
	_, err = s.StartTurn(ctx, "no plan")
	require.NoError(t, err)
	require.Empty(t, waitTurn(t, s).Artifacts)
	closeSession(t, s)
}
