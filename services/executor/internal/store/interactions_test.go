package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func askUserCall(callID string, args map[string]any) map[string]any {
	return map[string]any{"callId": callID, "tool": "tether_ask_user", "arguments": args, "turnId": "t1"}
}

// A replayed tool-call event opens its interaction once: the interaction is
// created in the transaction that persists the event, and a duplicate event
// is dropped before it.
func TestE4_AReplayedToolCallOpensOneInteraction(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	call := event("r", "runner-1", 1, "semantic_tool.input", askUserCall("call-1", map[string]any{
		"title": "Pick one", "questions": []any{map[string]any{"id": "q", "prompt": "Which?",
			"options": []any{map[string]any{"id": "a", "label": "A"}}}}}))
	for range 2 {
		_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{call})
		require.NoError(t, err)
	}
	// Under another source seq (a re-emitted call): the idempotency key holds.
	again := event("r", "runner-1", 2, "semantic_tool.input", call.GetPayload().AsMap())
	_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{again})
	require.NoError(t, err)
	list, _, err := s.ListInteractions(ctx, store.InteractionFilter{RunID: "r"}, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, runtimeq.ToolCallKey("r", "call-1"), list[0].GetIdempotencyKey())

	// The run's end makes it a governed wait.
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 3, store.EventTerminal, map[string]any{
		"runTerminalState": "succeeded", "turnTerminalState": "completed"})})
	require.NoError(t, err)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "yielded", run.GetResult().GetReportedWorkDisposition())
	require.Equal(t, "Waiting for Pick one.", run.GetResult().GetSummary())
	require.Equal(t, "interaction-response:"+list[0].GetInteractionId(), run.GetResult().GetContinuation().GetIdempotencyKey())
}

// A partial item-verdict answer is recorded and keeps the interaction
// pending (no run); the answer that completes it submits the continuation.
func TestE4_PartialItemVerdictsKeepTheWaitUntilComplete(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 1, "semantic_tool.input", askUserCall("call-1", map[string]any{
		"kind": "request_item_verdicts", "title": "Review the items",
		"items": []any{map[string]any{"id": "i1", "label": "first"}, map[string]any{"id": "i2", "label": "second"}}}))})
	require.NoError(t, err)
	list, _, err := s.ListInteractions(ctx, store.InteractionFilter{RunID: "r"}, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	id := list[0].GetInteractionId()
	require.Equal(t, "request_item_verdicts", list[0].GetKind())

	out, err := s.AnswerInteraction(ctx, id, []runtimeq.Answer{{QuestionID: "i1", OptionIDs: []string{"accept"}}})
	require.NoError(t, err)
	require.Equal(t, store.InteractionPending, out.Interaction.GetStatus())
	require.Empty(t, out.ContinuationRunID)
	require.Len(t, out.Interaction.GetAnswers(), 1)

	_, err = s.AnswerInteraction(ctx, id, []runtimeq.Answer{{QuestionID: "i2", OptionIDs: []string{"maybe"}}})
	require.EqualValues(t, failure.InteractionAnswerInvalid, failure.CodeOf(err))

	out, err = s.AnswerInteraction(ctx, id, []runtimeq.Answer{{QuestionID: "i2", OptionIDs: []string{"reject"}}})
	require.NoError(t, err)
	require.Equal(t, store.InteractionAnswered, out.Interaction.GetStatus())
	require.Equal(t, store.ContinuationRunID(id), out.ContinuationRunID)
	wake, err := s.GetRun(ctx, out.ContinuationRunID)
	require.NoError(t, err)
	resp := wake.GetInput().GetInteractionResponses()
	require.Len(t, resp, 1)
	require.True(t, resp[0].GetComplete())
	require.Len(t, resp[0].GetAnswers(), 2, "both verdicts")
	require.Equal(t, wake.GetInput().GetSession().GetNormalizedSessionId(), "s-r", "the source run's session")
}

// SPEC U1: ListInteractions pages newest first with a token bound to its
// filters (page_token_filter_mismatch with others).
func TestU1_ListInteractionsPagesWithFilterBoundTokens(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	for i := range 5 {
		call := event("r", "runner-1", uint64(i+1), "semantic_tool.input", askUserCall(fmt.Sprintf("call-%d", i), map[string]any{
			"title": "Pick one", "questions": []any{map[string]any{"id": "q", "prompt": "Which?",
				"options": []any{map[string]any{"id": "a", "label": "A"}}}}}))
		_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{call})
		require.NoError(t, err)
	}
	all, next, err := s.ListInteractions(ctx, store.InteractionFilter{RunID: "r"}, "")
	require.NoError(t, err)
	require.Len(t, all, 5)
	require.Empty(t, next)

	var got []string
	token := ""
	for {
		page, next, err := s.ListInteractions(ctx, store.InteractionFilter{RunID: "r", Limit: 2}, token)
		require.NoError(t, err)
		for _, in := range page {
			got = append(got, in.GetInteractionId())
		}
		if next == "" {
			break
		}
		token = next
		// The same token with another filter is refused.
		_, _, err = s.ListInteractions(ctx, store.InteractionFilter{RunID: "r", Status: "pending", Limit: 2}, token)
		require.EqualValues(t, failure.PageTokenFilterMismatch, failure.CodeOf(err))
		_, _, err = s.ListInteractions(ctx, store.InteractionFilter{RunID: "r", Limit: 2, Companies: []string{"globex"}}, token)
		require.EqualValues(t, failure.PageTokenFilterMismatch, failure.CodeOf(err))
	}
	want := make([]string, 0, len(all))
	for _, in := range all {
		want = append(want, in.GetInteractionId())
	}
	require.Equal(t, want, got, "the pages are the full list, in order, once")
}

// A store opened without the run's rules (a read-only use: tetherctl
// audit, the partition and retention commands) reads, and refuses every
// write that would decide through the rules, writing nothing.
func TestStoreWithoutRulesRefusesADecidingWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, Migrator)
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	c := claimed(t, s, "r", "o")
	reader, err := store.Open(ctx, dsn, nil)
	require.NoError(t, err)
	t.Cleanup(reader.Close)

	_, err = reader.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 1, "item.completed", nil)})
	require.ErrorContains(t, err, "without the run's rules")
	_, err = reader.AnswerInteraction(ctx, "ia-none", nil)
	require.ErrorContains(t, err, "without the run's rules")
	run, err := reader.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())
	evs, err := reader.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Empty(t, evs)
}
