package fakecodex

import (
	"strconv"
	"strings"

	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// Provider plans, driven by markers in the turn's last user message:
//
//   - "[plan]": turn/plan/updated when the reply starts (explanation, the
//     first of three steps in progress) and again before the reply
//     completes (every step completed), as codex sends them when the model
//     calls update_plan;
//   - "[plan-item:TEXT]": a completed plan item (type "plan") with TEXT (up
//     to the closing bracket) before the reply completes, as codex's plan
//     mode reports its plan document;
//   - "[plan-item-bytes:N]": a plan item of N bytes.

// PlanSteps are the steps "[plan]" reports.
var PlanSteps = []string{"Add the GET /health route", "Return 200 with a JSON status", "Document the endpoint"}

// PlanExplanation is the explanation "[plan]" reports.
const PlanExplanation = "Add a health endpoint."

func lastUserText(at *activeTurn) string {
	last := ""
	for _, it := range at.turn.Items {
		if it.Type == itemUserMessage {
			last = userText(it)
		}
	}
	return last
}

func (s *Server) notifyPlan(at *activeTurn, statuses ...string) error {
	steps := make([]codexwire.PlanStep, len(PlanSteps))
	for i, st := range PlanSteps {
		steps[i] = codexwire.PlanStep{Step: st, Status: statuses[i]}
	}
	explanation := PlanExplanation
	return s.notify(codexwire.NotifyPlanUpdated, codexwire.PlanUpdated{
		ThreadID: at.thread.ID, TurnID: at.turn.ID, Explanation: &explanation, Plan: steps,
	})
}

// planAtStart sends the first plan update of a "[plan]" turn.
func (s *Server) planAtStart(at *activeTurn) error {
	if !strings.Contains(lastUserText(at), "[plan]") {
		return nil
	}
	return s.notifyPlan(at, "inProgress", "pending", "pending")
}

// planAtEnd sends the final plan update and the plan item, before the
// reply's item/completed.
func (s *Server) planAtEnd(at *activeTurn) error {
	prompt := lastUserText(at)
	if strings.Contains(prompt, "[plan]") {
		if err := s.notifyPlan(at, "completed", "completed", "completed"); err != nil {
			return err
		}
	}
	text, ok := planItemText(prompt)
	if !ok {
		return nil
	}
	nowMs := s.nowMs()
	item := codexwire.PlanItem{Type: codexwire.ItemPlan, ID: "plan-" + at.turn.ID}
	if err := s.notify(codexwire.NotifyItemStarted, codexwire.ItemStarted{Item: rawItem(item), ThreadID: at.thread.ID, TurnID: at.turn.ID, StartedAtMs: nowMs}); err != nil {
		return err
	}
	item.Text = text
	return s.notify(codexwire.NotifyItemCompleted, codexwire.ItemCompleted{Item: rawItem(item), ThreadID: at.thread.ID, TurnID: at.turn.ID, CompletedAtMs: nowMs})
}

func planItemText(prompt string) (string, bool) {
	if v, ok := marker(prompt, "[plan-item-bytes:"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 8<<20 {
			return "", false
		}
		line := "- [ ] a step of a very long plan\n"
		body := "# Plan\n\n" + strings.Repeat(line, n/len(line)+1)
		return body[:n], true
	}
	return marker(prompt, "[plan-item:")
}

// marker returns the text between prefix and the next ']'.
func marker(s, prefix string) (string, bool) {
	i := strings.Index(s, prefix)
	if i < 0 {
		return "", false
	}
	rest := s[i+len(prefix):]
	j := strings.IndexByte(rest, ']')
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}
