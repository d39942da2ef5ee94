package codex

import (
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// Provider plans (SPEC E3). codex reports a plan two ways:
//
//   - turn/plan/updated {threadId, turnId, explanation?, plan: [{step, status}]}
//     whenever the model calls its update_plan tool (status pending |
//     inProgress | completed);
//   - a completed item of type "plan" {id, text}: the plan document of plan
//     mode (the final text of item/completed is authoritative).
//
// Both become run.plan_updated events with the provider's data, P1:
//
//	{source: "turn_plan", explanation?, steps: [{step, status}]}
//	{source: "plan_item", markdown}
//
// The executor renders and bounds them. A turn's last plan item is also the
// turn's semantic result artifact of kind native_provider_plan.

// EventPlanUpdated is the run event of a provider plan update.
const EventPlanUpdated = prp.EventRunPlanUpdated

func (s *Session) onPlanUpdated(p codexwire.PlanUpdated) {
	steps := make([]any, 0, len(p.Plan))
	for _, e := range p.Plan {
		steps = append(steps, map[string]any{"step": e.Step, "status": e.Status})
	}
	payload := map[string]any{"source": "turn_plan", "steps": steps}
	if p.Explanation != nil {
		putNonEmpty(payload, "explanation", *p.Explanation)
	}
	s.emitFromReader(Event{Type: EventPlanUpdated, TurnID: p.TurnID, Priority: PriorityP1, Payload: payload})
}

// onPlanItem reports a completed plan item and keeps it as the turn's plan
// artifact.
func (s *Session) onPlanItem(turnID, itemID, text string) {
	s.mu.Lock()
	if s.turn != nil && s.turn.id == turnID {
		s.turn.planItem = text
	}
	s.mu.Unlock()
	s.emitFromReader(Event{Type: EventPlanUpdated, TurnID: turnID, ItemID: itemID, Priority: PriorityP1, Payload: map[string]any{
		"source": "plan_item", "markdown": text,
	}})
}

// artifacts are the turn's semantic result artifacts.
func (t *turnState) artifacts() []Artifact {
	if t.planItem == "" {
		return nil
	}
	return []Artifact{{Kind: prp.ArtifactKindPlan, Ref: t.planItem}}
}
