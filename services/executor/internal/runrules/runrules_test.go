package runrules_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/recovery"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
	"github.com/tether-run/tether/services/executor/internal/store"
)

const run = "run-1"

func event(t *testing.T, runID, typ string, payload map[string]any) *prpv1.Event {
	t.Helper()
	p, err := structpb.NewStruct(payload)
	require.NoError(t, err)
	return &prpv1.Event{RunId: runID, EventType: typ, Payload: p}
}

func askUser(t *testing.T, runID, callID string) *prpv1.Event {
	return event(t, runID, prp.EventToolInput, map[string]any{"callId": callID, "tool": "tether_ask_user", "turnId": "t1",
		"arguments": map[string]any{"title": "Pick one", "questions": []any{map[string]any{"id": "q", "prompt": "Which?",
			"options": []any{map[string]any{"id": "a", "label": "A"}}}}}})
}

func expired(t *testing.T, reason string) *prpv1.Event {
	return event(t, run, prp.EventRuntimeRequestExpired, map[string]any{
		"requestId": "req-1", "requestType": "input", "reason": reason, "replayAllowed": false, "adapter": "codex",
		"request": map[string]any{"schema": "tether.runtime_request.v2", "requestKind": "runtime", "requestId": "req-1",
			"type": "input", "status": "pending", "prompt": "Deploy", "turnId": "t1", "itemId": "i1",
			"input": map[string]any{"schema": "tether.question_set.v1", "title": "Deploy", "questions": []any{
				map[string]any{"id": "region", "prompt": "Which region?", "required": true, "answerMode": "single_select",
					"options": []any{map[string]any{"id": "us", "label": "US"}}}}}}})
}

func terminal(t *testing.T, payload map[string]any) *prpv1.Event {
	return event(t, run, prp.EventRunTerminal, payload)
}

// The plain records the store keeps for the domain packages are the
// domain's own: the recovery rules' phases are the coordinator phases the
// store writes.
func TestE11_TheStoresFailurePhasesAreTheRecoveryRulesPhases(t *testing.T) {
	t.Parallel()
	require.Equal(t, recovery.PhaseRetryableFailure, store.PhaseRetryableFailure)
	require.Equal(t, recovery.PhaseTerminalFailure, store.PhaseTerminalFailure)
}

func TestE5_TheRunRulesDecideWhichEventsTakeTheCarefulPath(t *testing.T) {
	t.Parallel()
	for typ, want := range map[string]bool{
		prp.EventToolInput: true, prp.EventHarnessDiagnostic: true,
		prp.EventRuntimeRequestCreated: true, prp.EventRuntimeRequestResolved: true,
		prp.EventRuntimeRequestExpired: true, prp.EventRuntimeRequestCancelled: true,
		prp.EventTurnStarted: false, prp.EventTurnCompleted: false, prp.EventRunPlanUpdated: false,
		prp.EventRunTerminal: false, "item.completed": false,
	} {
		require.Equal(t, want, runrules.New().Decides(typ), typ)
	}
}

func TestE4_TheRunRulesDecideTheInteractionsABatchOpens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		events    []*prpv1.Event
		keys      []string
		lost      []bool
		outcomes  []string
		noneOther bool
	}{
		{name: "a tether_ask_user call opens a response_wake interaction",
			events: []*prpv1.Event{askUser(t, run, "call-1")}, keys: []string{runtimeq.ToolCallKey(run, "call-1")}, lost: []bool{false}},
		{name: "an event without a run is the fenced run's",
			events: []*prpv1.Event{askUser(t, "", "call-2")}, keys: []string{runtimeq.ToolCallKey(run, "call-2")}, lost: []bool{false}},
		{name: "another run's call keeps that run's key",
			events: []*prpv1.Event{askUser(t, "run-0", "call-3")}, keys: []string{runtimeq.ToolCallKey("run-0", "call-3")}, lost: []bool{false}},
		{name: "another tool opens nothing",
			events: []*prpv1.Event{event(t, run, prp.EventToolInput, map[string]any{"callId": "c", "tool": "shell"})}},
		{name: "E5: a question lost with its provider falls back, the run does not wait on it",
			events: []*prpv1.Event{expired(t, failure.ProviderProcessLost)},
			keys:   []string{runtimeq.IdempotencyKey(run, "req-1")}, lost: []bool{true}, outcomes: []string{runtimeq.OutcomeProviderLossHandoff}},
		{name: "E5: a question handed off durably falls back, the run waits on it",
			events: []*prpv1.Event{expired(t, failure.DurableHandoff)},
			keys:   []string{runtimeq.IdempotencyKey(run, "req-1")}, lost: []bool{false}, outcomes: []string{runtimeq.OutcomeDurableHandoff}},
		{name: "E5: a created input request is counted, opens nothing",
			events: []*prpv1.Event{event(t, run, prp.EventRuntimeRequestCreated, map[string]any{
				"adapter": "codex", "request": map[string]any{"type": "input", "requestId": "req-2"}})},
			outcomes: []string{runtimeq.OutcomeNormalized}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := runrules.New().Batch(run, tc.events)
			require.NoError(t, err)
			var keys, outcomes []string
			var lost []bool
			for _, in := range d.Interactions {
				keys, lost = append(keys, in.IdempotencyKey), append(lost, in.ProviderLost)
			}
			for _, m := range d.RuntimeInputs {
				outcomes = append(outcomes, m.Outcome)
			}
			require.Equal(t, tc.keys, keys)
			require.Equal(t, tc.lost, lost)
			require.Equal(t, tc.outcomes, outcomes)
			require.Empty(t, d.Plan)
			require.Nil(t, d.Terminal)
		})
	}
}

func TestE3_TheRunRulesKeepTheFencedRunsLatestPlan(t *testing.T) {
	t.Parallel()
	plan := func(runID, step string) *prpv1.Event {
		return event(t, runID, prp.EventRunPlanUpdated, map[string]any{"source": "turn_plan",
			"steps": []any{map[string]any{"step": step, "status": "pending"}}})
	}
	r := runrules.New()
	stored := r.Stored([]*prpv1.Event{plan(run, "first"), plan(run, "second"), plan("run-0", "another run's")})
	require.Equal(t, stored, r.Stored(stored), "storing a stored event changes nothing")
	d, err := r.Batch(run, stored)
	require.NoError(t, err)
	require.Contains(t, d.Plan, "second")
	require.NotContains(t, d.Plan, "first")

	d, err = r.Batch(run, stored[2:])
	require.NoError(t, err)
	require.Empty(t, d.Plan, "another run's turn planned it: not this run's plan")
}

func TestE1_TheRunRulesReadATerminalsOutcomeUsageAndCost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		payload map[string]any
		state   string
		code    string
		check   func(t *testing.T, res *executorv1.RunResult)
	}{
		{name: "succeeded with its run's usage, cost and session total",
			payload: map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed", "finalMessage": "done",
				"usage": map[string]any{
					"total":    map[string]any{"inputTokens": 20000, "outputTokens": 500, "cacheReadTokens": 8000},
					"runDelta": map[string]any{"inputTokens": 4200, "outputTokens": 180, "cacheReadTokens": 1500, "providerCostUsd": 0.031}}},
			state: store.StateSucceeded,
			check: func(t *testing.T, res *executorv1.RunResult) {
				require.Equal(t, "done", res.GetFinalMessage())
				require.Equal(t, uint64(4200), res.GetUsage().GetInputTokens())
				require.Equal(t, uint64(1500), res.GetUsage().GetCachedInputTokens())
				require.Equal(t, uint64(180), res.GetUsage().GetOutputTokens())
				require.InDelta(t, 0.031, res.GetCostUsd(), 1e-9)
				require.Equal(t, uint64(20000), res.GetSessionUsage().GetInputTokens())
			}},
		{name: "failed without a code is native_run_failed",
			payload: map[string]any{"runTerminalState": "failed", "turnTerminalState": "interrupted"},
			state:   store.StateFailed, code: failure.NativeRunFailed},
		{name: "failed keeps the runner's code",
			payload: map[string]any{"runTerminalState": "failed", "code": failure.ProviderProcessLost, "message": "gone"},
			state:   store.StateFailed, code: failure.ProviderProcessLost},
		{name: "an unknown state is a failure, native_run_terminal_invalid",
			payload: map[string]any{"runTerminalState": "sort of"},
			state:   store.StateFailed, code: failure.NativeRunTerminalInvalid},
		{name: "cancelled",
			payload: map[string]any{"runTerminalState": "cancelled"}, state: store.StateCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := runrules.New().Batch(run, []*prpv1.Event{event(t, run, prp.EventTurnStarted, nil), terminal(t, tc.payload)})
			require.NoError(t, err)
			require.NotNil(t, d.Terminal)
			require.Equal(t, tc.state, d.Terminal.State)
			require.Equal(t, tc.code, d.Terminal.Code)
			if tc.check != nil {
				tc.check(t, d.Terminal.Result)
			}
		})
	}
}

func TestE4_TheRunRulesMakeASucceededRunAGovernedWait(t *testing.T) {
	t.Parallel()
	r := runrules.New()
	in := &prpv1.ExecutionInput{CompletionContract: &prpv1.CompletionContract{Revision: "rev-1", Objective: "ship it",
		Criteria: []*prpv1.Criterion{{Id: "c1", Requirement: "tests pass"}}}}
	res := &executorv1.RunResult{RunTerminalState: store.StateSucceeded}
	require.NoError(t, r.GovernedWait(in, store.PendingInteraction{ID: "ia-1", Title: "Pick one", Summary: "Which?"}, res))
	require.NotEmpty(t, res.GetReportedWorkDisposition())
	require.Equal(t, "rev-1", res.GetCompletionClaim().GetContractRevision())
	require.Len(t, res.GetCompletionClaim().GetCriteria(), 1)
	require.Equal(t, runtimeq.ContinuationResponseWake, res.GetContinuation().GetKind())
	require.Contains(t, res.GetEvidenceRefs(), "interaction:ia-1")

	require.Error(t, r.GovernedWait(in, store.PendingInteraction{}, &executorv1.RunResult{}), "a wait needs its interaction")

	for _, tc := range []struct {
		name string
		resp []*prpv1.InteractionResponse
		want []string
	}{
		{name: "no responses", want: []string{}},
		{name: "a partial item-verdict response continues the wait",
			resp: []*prpv1.InteractionResponse{{InteractionId: "ia-2", Kind: "request_item_verdicts", Status: "pending"}},
			want: []string{"ia-2"}},
		{name: "a complete one does not",
			resp: []*prpv1.InteractionResponse{{InteractionId: "ia-3", Kind: "request_item_verdicts", Status: "pending", Complete: true}},
			want: []string{}},
		{name: "nor an answered question",
			resp: []*prpv1.InteractionResponse{{InteractionId: "ia-4", Kind: "ask_user_questions", Status: "answered", Complete: true}},
			want: []string{}},
	} {
		require.Equal(t, tc.want, r.ContinuingInteractions(&prpv1.ExecutionInput{InteractionResponses: tc.resp}), tc.name)
	}
}

func TestE4_TheRunRulesMergeAnAnswerAndPutItToTheContinuation(t *testing.T) {
	t.Parallel()
	r := runrules.New()
	qs := []store.Question{{ID: "q", Prompt: "Which?", Required: true, SelectionMode: runtimeq.SelectionSingle,
		Options: []store.Option{{ID: "a", Label: "A"}}}}
	merged, complete, err := r.MergeAnswers("ask_user_questions", qs, nil, []store.Answer{{QuestionID: "q", OptionIDs: []string{"a"}}})
	require.NoError(t, err)
	require.True(t, complete)
	require.Contains(t, r.AnswerPrompt("Pick one", qs, merged), "A")

	_, _, err = r.MergeAnswers("ask_user_questions", qs, nil, []store.Answer{{QuestionID: "nope", OptionIDs: []string{"a"}}})
	var ae *store.AnswerError
	require.ErrorAs(t, err, &ae, "an answer that does not fit is the store's AnswerError")
}
