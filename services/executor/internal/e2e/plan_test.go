package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/plan"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// eventsOf returns the payloads of the watched events of one type.
func eventsOf(evs []*executorv1.WatchRunResponse, typ string) []map[string]any {
	var out []map[string]any
	for _, m := range evs {
		if m.GetEvent().GetEventType() == typ {
			out = append(out, m.GetEvent().GetPayload().AsMap())
		}
	}
	return out
}

// runPlanned runs one turn of the session to its end and returns its events
// and the run.
func (h *harness) runPlanned(ctx context.Context, runID, prompt string) ([]*executorv1.WatchRunResponse, *executorv1.Run) {
	h.t.Helper()
	h.submit(runID, "plans", prompt)
	evs := h.watch(ctx, runID, 0, nil)
	requireContiguous(h.t, evs)
	run := h.get(runID)
	require.Equal(h.t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	return evs, run
}

// The fake codex sends turn/plan/updated twice on "[plan]" (first step in
// progress, then all completed) and a plan item on "[plan-item:…]".
func TestE3_Stack_ProviderPlanUpdatesAreRenderedAndTheResultsPlanIsExtracted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Live updates: run.plan_updated carries the rendered checklist, the
	// run's plan is the latest, and tetherctl shows each update.
	evs, run := h.runPlanned(ctx, "plan-1", "add a health endpoint [plan]")
	updates := eventsOf(evs, plan.EventPlanUpdated)
	require.Len(t, updates, 2)
	first := "Add a health endpoint.\n\n" +
		"- [ ] Add the GET /health route _(in progress)_\n" +
		"- [ ] Return 200 with a JSON status\n" +
		"- [ ] Document the endpoint"
	done := "Add a health endpoint.\n\n" +
		"- [x] Add the GET /health route\n" +
		"- [x] Return 200 with a JSON status\n" +
		"- [x] Document the endpoint"
	require.Equal(t, map[string]any{"source": "turn_plan", "markdown": first}, updates[0])
	require.Equal(t, map[string]any{"source": "turn_plan", "markdown": done}, updates[1])
	require.Equal(t, done, run.GetPlan())
	require.Empty(t, run.GetResult().GetArtifacts(), "no plan item: no artifact")
	var out bytes.Buffer
	r := &cli.Renderer{W: &out}
	for _, m := range evs {
		r.Event(m)
	}
	require.Contains(t, out.String(), "  plan:\n    Add a health endpoint.\n    \n    - [ ] Add the GET /health route _(in progress)_\n")
	require.Contains(t, out.String(), "    - [x] Document the endpoint\n")
	for _, p := range []string{run.GetRunId(), run.GetResult().GetProviderThreadId(), run.GetResult().GetProviderTurnId()} {
		require.NotContains(t, run.GetPlan(), p, "no provenance in the plan")
	}

	// A plan item is the turn's native_provider_plan artifact; when the run
	// ends its plan is extracted with the E3 rules (a compact ref here) and
	// becomes the run's plan.
	ref := "native-provider-plan:health-check-endpoint-v1#1-register-GET-health-return-200-json-status-ok;2-add-API-tests"
	evs, run = h.runPlanned(ctx, "plan-2", "plan it ["+"plan-item:"+ref+"]")
	require.Len(t, eventsOf(evs, plan.EventPlanUpdated), 1)
	require.Equal(t, "plan_item", eventsOf(evs, plan.EventPlanUpdated)[0]["source"])
	want := "# Health check endpoint\n\n1. Register GET /health return 200 JSON status ok\n2. Add API tests"
	res := run.GetResult()
	require.Len(t, res.GetArtifacts(), 1)
	require.True(t, proto.Equal(&executorv1.ResultArtifact{Kind: prp.ArtifactKindPlan, Ref: ref}, res.GetArtifacts()[0]), "%v", res.GetArtifacts())
	require.Equal(t, want, res.GetPlan())
	require.Equal(t, want, run.GetPlan())
}

// A plan larger than the bound is refused with a stable code and nothing of
// it is written: neither the update, nor the artifact's ref, nor a plan.
func TestE3_Stack_APlanArtifactLargerThanTheBoundIsRefusedAndNothingIsWritten(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	evs, run := h.runPlanned(ctx, "plan-big", "[plan-item-bytes:70000]")
	require.Empty(t, eventsOf(evs, plan.EventPlanUpdated))
	var refused []map[string]any
	for _, d := range eventsOf(evs, "harness.diagnostic") {
		if d["code"] == failure.NativeProviderPlanTooLarge {
			refused = append(refused, d)
		}
	}
	require.Len(t, refused, 1, "the update is a diagnostic with the stable code")
	require.Equal(t, plan.EventPlanUpdated, refused[0]["originalEventType"])
	for _, m := range evs {
		require.Less(t, proto.Size(m.GetEvent()), plan.MaxRefBytes, "event %s keeps none of the plan", m.GetEvent().GetEventType())
		require.False(t, strings.Contains(m.GetEvent().GetPayload().String(), "a step of a very long plan"))
	}
	res := run.GetResult()
	require.Len(t, res.GetArtifacts(), 1)
	require.True(t, proto.Equal(&executorv1.ResultArtifact{Kind: prp.ArtifactKindPlan, Code: failure.NativeProviderPlanTooLarge}, res.GetArtifacts()[0]), "%v", res.GetArtifacts())
	require.Empty(t, res.GetPlan())
	require.Empty(t, run.GetPlan())
}
