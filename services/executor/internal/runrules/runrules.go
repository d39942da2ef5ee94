// Package runrules is the run's rules (issue #34): what the events a
// runner reports decide beside their rows — the interactions they open and
// the runtime input lifecycle steps they count (SPEC E4, E5), the run's
// plan (E3), its terminal outcome with its usage and cost (E1) — whether a
// succeeded run is a governed wait (E4), and how an interaction's answer
// is merged and put to the run it continues. It implements store.Rules:
// the store asks these rules inside its transactions and writes only what
// they decide. Everything here is pure: no database, no clock, no I/O.
package runrules

import (
	"fmt"
	"strings"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/governed"
	"github.com/tether-run/tether/services/executor/internal/plan"
	"github.com/tether-run/tether/services/executor/internal/quota"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/usage"
)

// Rules implements store.Rules. The zero value is ready to use.
type Rules struct{}

var _ store.Rules = Rules{}

// New returns the run's rules.
func New() Rules { return Rules{} }

// Stored returns events as they are stored: plan updates rendered,
// oversized plans refused (plan.StoredEvents, SPEC E3).
func (Rules) Stored(events []*prpv1.Event) []*prpv1.Event { return plan.StoredEvents(events) }

// Decides reports the event types whose filing may open an interaction or
// count a runtime input lifecycle step: a dynamic tool call, a harness
// diagnostic, and every runtime request event.
func (Rules) Decides(typ string) bool {
	return typ == prp.EventToolInput || typ == prp.EventHarnessDiagnostic || strings.HasPrefix(typ, prp.RuntimeRequestEventPrefix)
}

// Batch decides what fresh events filed under the fenced run runID write
// beside their rows: the interactions they open (an event names the run
// whose turn it belongs to, its idempotency key says so; it is filed
// under runID), their runtime input metrics, the run's latest plan (an
// update of another run's turn is not this run's plan), and the outcome
// of a run.terminal.
func (r Rules) Batch(runID string, fresh []*prpv1.Event) (store.Decisions, error) {
	var d store.Decisions
	for _, ev := range fresh {
		typ := ev.GetEventType()
		switch {
		case r.Decides(typ):
			evRun := ev.GetRunId()
			if evRun == "" {
				evRun = runID
			}
			rev := runtimeq.Event{EventType: typ, RunID: evRun, Payload: ev.GetPayload()}
			if m, ok := runtimeq.LifecycleMetric(rev); ok {
				d.RuntimeInputs = append(d.RuntimeInputs, m)
			}
			if in, lost, ok := runtimeq.FromEvent(rev); ok {
				d.Interactions = append(d.Interactions, store.OpenInteraction{InteractionSpec: in, ProviderLost: lost})
			}
		case typ == prp.EventRunPlanUpdated && ev.GetRunId() == runID:
			if md, ok := plan.UpdateMarkdown(ev); ok {
				d.Plan = md
			}
		case typ == prp.EventRunTerminal:
			t := Terminal(ev)
			d.Terminal = &t
		}
	}
	return d, nil
}

// Terminal reads the outcome a run.terminal event reports: its state (an
// unknown one is a failure, native_run_terminal_invalid), the run's result
// with its artifacts and plan (SPEC E3), its usage and cost (E1), and a
// failure's code (native_run_failed when the runner gave none).
func Terminal(ev *prpv1.Event) store.Terminal {
	var p prpv1.RunTerminal
	if err := prp.DecodePayload(ev, &p); err != nil {
		return store.Terminal{State: store.StateFailed, Result: &executorv1.RunResult{},
			Code: failure.NativeRunTerminalInvalid, Message: fmt.Sprintf("run.terminal payload: %v", err)}
	}
	t := store.Terminal{
		State: p.GetRunTerminalState(),
		Result: &executorv1.RunResult{
			TurnTerminalState: p.GetTurnTerminalState(),
			RunTerminalState:  p.GetRunTerminalState(),
			FinalMessage:      p.GetFinalMessage(),
			ProviderTurnId:    p.GetProviderTurnId(),
			ProviderThreadId:  p.GetProviderThreadId(),
		},
		Code:    p.GetCode(),
		Message: p.GetMessage(),
	}
	arts, md := plan.TerminalResult(ev)
	for _, a := range arts {
		t.Result.Artifacts = append(t.Result.Artifacts, &executorv1.ResultArtifact{Kind: a.Kind, Ref: a.Ref, Code: a.Code})
	}
	t.Result.Plan = md
	// The usage is read as reported, provider aliases too (usage.Normalize).
	if u := ev.GetPayload().GetFields()["usage"].GetStructValue(); u != nil {
		readUsage(t.Result, u.AsMap())
	}
	switch t.State {
	case store.StateSucceeded, store.StateFailed, store.StateCancelled:
	default:
		t.State = store.StateFailed
		if t.Code == "" {
			t.Code = failure.NativeRunTerminalInvalid
			t.Message = fmt.Sprintf("run.terminal reported runTerminalState %q", p.GetRunTerminalState())
		}
	}
	if t.State == store.StateFailed && t.Code == "" {
		t.Code = failure.NativeRunFailed
		t.Message = "the provider turn ended in state " + t.Result.TurnTerminalState
	}
	return t
}

// readUsage normalises the usage a run.terminal event reports (SPEC E1):
// the run's own usage (runDelta over total), its dollar cost, and the
// provider session's cumulative total when reported beside a delta.
func readUsage(res *executorv1.RunResult, raw map[string]any) {
	if u, ok := usage.Normalize(raw); ok {
		res.Usage = usageProto(u)
	}
	if c, ok := usage.CostUSD(raw); ok {
		res.CostUsd = &c
	}
	if total, ok := raw["total"].(map[string]any); ok {
		if u, ok := usage.Normalize(total); ok {
			res.SessionUsage = usageProto(u)
		}
	}
}

func usageProto(u usage.Usage) *executorv1.Usage {
	return &executorv1.Usage{
		InputTokens: uint64(u.InputTokens), CachedInputTokens: uint64(u.CachedInputTokens), OutputTokens: uint64(u.OutputTokens),
	}
}

// ContinuingInteractions names the pending item-verdict interactions the
// run's input answers only in part (governed.ContinuingPendingInteractionIDs).
func (Rules) ContinuingInteractions(in *prpv1.ExecutionInput) []string {
	var responses []governed.InteractionResponse
	for _, r := range in.GetInteractionResponses() {
		responses = append(responses, governed.InteractionResponse{
			InteractionID: r.GetInteractionId(), Kind: r.GetKind(),
			Response: governed.Response{Status: r.GetStatus(), Result: &governed.ItemVerdictResult{Complete: r.GetComplete()}},
		})
	}
	return governed.ContinuingPendingInteractionIDs(responses)
}

// GovernedWait makes res the governed wait on wait (governed.WaitResult,
// SPEC E4): the reported work disposition, summary, completion claim
// against the input's completion contract, continuation, evidence and
// artifacts.
func (Rules) GovernedWait(in *prpv1.ExecutionInput, wait store.PendingInteraction, res *executorv1.RunResult) error {
	contract := governed.CompletionContract{Revision: in.GetCompletionContract().GetRevision(), Objective: in.GetCompletionContract().GetObjective()}
	for _, c := range in.GetCompletionContract().GetCriteria() {
		contract.Criteria = append(contract.Criteria, governed.Criterion{ID: c.GetId(), Requirement: c.GetRequirement()})
	}
	w, err := governed.WaitResult(governed.Interaction{ID: wait.ID, Title: wait.Title, Summary: wait.Summary}, contract)
	if err != nil {
		return err
	}
	res.ReportedWorkDisposition = w.ReportedWorkDisposition
	res.Summary = w.Summary
	claim := &executorv1.CompletionClaim{ContractRevision: w.CompletionClaim.ContractRevision, ObjectiveSatisfied: w.CompletionClaim.ObjectiveSatisfied}
	for _, c := range w.CompletionClaim.Criteria {
		claim.Criteria = append(claim.Criteria, &executorv1.CriterionClaim{CriterionId: c.CriterionID, Status: c.Status, EvidenceRefs: c.EvidenceRefs})
	}
	res.CompletionClaim = claim
	res.Continuation = &executorv1.Continuation{Kind: w.Continuation.Kind, Summary: w.Continuation.Summary, IdempotencyKey: w.Continuation.IdempotencyKey}
	for _, e := range w.Evidence {
		res.EvidenceRefs = append(res.EvidenceRefs, e.Ref)
	}
	for _, a := range w.Artifacts {
		res.Artifacts = append(res.Artifacts, &executorv1.ResultArtifact{Kind: a.Kind, Ref: a.Ref})
	}
	return nil
}

// MergeAnswers is runtimeq.MergeAnswers.
func (Rules) MergeAnswers(kind string, questions []store.Question, prior, answers []store.Answer) ([]store.Answer, bool, error) {
	return runtimeq.MergeAnswers(kind, questions, prior, answers)
}

// AnswerPrompt is runtimeq.AnswerPrompt.
func (Rules) AnswerPrompt(title string, questions []store.Question, answers []store.Answer) string {
	return runtimeq.AnswerPrompt(title, questions, answers)
}

// Admit decides a submission of a company with limits (quota.Admit, SPEC
// Q1, Q2).
func (Rules) Admit(a store.Admission) error { return quota.Admit(a) }

// Budget says where a month's spend stands against the company's budget
// (quota.Budget, SPEC Q2).
func (Rules) Budget(spendUSD float64, l store.CompanyLimits) store.BudgetState {
	return quota.Budget(spendUSD, l)
}
