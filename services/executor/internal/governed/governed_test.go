package governed

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestE4_TurnsDurablePendingInteractionIntoResponseWakeResult(t *testing.T) {
	contract := CompletionContract{
		Revision:  "contract-v3",
		Objective: "Create the requested output",
		Criteria:  []Criterion{{ID: "objective", Requirement: "The output is created"}},
	}
	seedWant := RunResult{
		Schema:                  ResultSchema,
		ReportedWorkDisposition: "yielded",
		Summary:                 "Waiting for Choose an output format.",
		CompletionClaim: CompletionClaim{
			ContractRevision:   "contract-v3",
			ObjectiveSatisfied: false,
			Criteria: []CriterionClaim{{
				CriterionID: "objective", Status: "unknown", EvidenceRefs: []string{"interaction:interaction-1"},
			}},
			RemainingWork: []RemainingWork{{Summary: "Resume after the durable interaction is resolved.", BlocksCompletion: true}},
		},
		Evidence:          []EvidenceRef{{Ref: "interaction:interaction-1"}},
		Verification:      []Verification{},
		AttentionRequests: []AttentionRequest{},
		Artifacts:         []Artifact{{Kind: "issue_thread_interaction", Ref: "interaction:interaction-1"}},
		Continuation: &Continuation{
			Kind:           "response_wake",
			Summary:        "Resume from the resolved interaction response without repeating prior work.",
			IdempotencyKey: "interaction-response:interaction-1",
		},
	}

	t.Run("seed", func(t *testing.T) {
		got, err := WaitResult(Interaction{ID: "interaction-1", Title: "Choose an output format"}, contract)
		require.NoError(t, err)
		require.Equal(t, seedWant, got)

		raw, err := json.Marshal(got)
		require.NoError(t, err)
		require.JSONEq(t, `{
			"schema": "tether.run_result.v1",
			"reportedWorkDisposition": "yielded",
			"summary": "Waiting for Choose an output format.",
			"completionClaim": {
				"contractRevision": "contract-v3",
				"objectiveSatisfied": false,
				"criteria": [{"criterionId": "objective", "status": "unknown", "evidenceRefs": ["interaction:interaction-1"]}],
				"remainingWork": [{"summary": "Resume after the durable interaction is resolved.", "blocksCompletion": true}]
			},
			"evidence": [{"ref": "interaction:interaction-1"}],
			"verification": [],
			"attentionRequests": [],
			"artifacts": [{"kind": "issue_thread_interaction", "ref": "interaction:interaction-1"}],
			"continuation": {
				"kind": "response_wake",
				"summary": "Resume from the resolved interaction response without repeating prior work.",
				"idempotencyKey": "interaction-response:interaction-1"
			}
		}`, string(raw))
	})

	summaries := []struct {
		name string
		in   Interaction
		want string
	}{
		{"summary stands in for a missing title", Interaction{ID: "i", Summary: "the deploy approval"}, "Waiting for the deploy approval."},
		{"default subject", Interaction{ID: "i", Title: " ", Summary: "\n"}, "Waiting for the requested response."},
		{"one line, no doubled full stop", Interaction{ID: "i", Title: "Pick\n  a region."}, "Waiting for Pick a region."},
	}
	for _, tc := range summaries {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WaitResult(tc.in, contract)
			require.NoError(t, err)
			require.Equal(t, tc.want, got.Summary)
		})
	}

	t.Run("every criterion is unknown with the interaction as evidence", func(t *testing.T) {
		got, err := WaitResult(Interaction{ID: "x"}, CompletionContract{Revision: "7", Criteria: []Criterion{{ID: "a"}, {ID: "b"}, {ID: "c"}}})
		require.NoError(t, err)
		require.Len(t, got.CompletionClaim.Criteria, 3)
		for i, c := range got.CompletionClaim.Criteria {
			require.Equal(t, []string{"a", "b", "c"}[i], c.CriterionID)
			require.Equal(t, CriterionUnknown, c.Status)
			require.Equal(t, []string{"interaction:x"}, c.EvidenceRefs)
		}
		require.Equal(t, "7", got.CompletionClaim.ContractRevision)
		require.Empty(t, got.AttentionRequests)
	})

	t.Run("an interaction without an id fails closed", func(t *testing.T) {
		_, err := WaitResult(Interaction{ID: "  ", Title: "t"}, contract)
		require.ErrorIs(t, err, ErrNoInteraction)
	})
}

func TestE4_KeepsPartialItemVerdictInteractionAsWaitTarget(t *testing.T) {
	partial := func(id, status string, complete bool) InteractionResponse {
		return InteractionResponse{
			InteractionID: id,
			Kind:          KindRequestItemVerdicts,
			Response: Response{Status: status, Result: &ItemVerdictResult{
				Version: 1, Complete: complete, Items: []ItemVerdict{{ID: "alpha", Verdict: "approve"}},
			}},
		}
	}
	tests := []struct {
		name      string
		responses []InteractionResponse
		want      []string
	}{
		{"seed: pending partial", []InteractionResponse{partial("interaction-partial", "pending", false)},
			[]string{"interaction-partial"}},
		{"seed: answered", []InteractionResponse{partial("interaction-partial", "answered", false)}, []string{}},
		{"complete result is not a wait target", []InteractionResponse{partial("i", "pending", true)}, []string{}},
		{"pending without a result yet", []InteractionResponse{{InteractionID: "i", Kind: KindRequestItemVerdicts, Response: Response{Status: "pending"}}},
			[]string{"i"}},
		{"other kinds are not continued", []InteractionResponse{{InteractionID: "q", Kind: "ask_user_questions", Response: Response{Status: "pending"}}},
			[]string{}},
		{"order kept, duplicates and blank ids dropped", []InteractionResponse{
			partial("b", "pending", false), partial("", "pending", false), partial("a", "pending", false), partial("b", "pending", false),
		}, []string{"b", "a"}},
		{"none", nil, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ContinuingPendingInteractionIDs(tc.responses))
		})
	}
}

func TestE4_ConsumesExactReplayObservationOnceWithoutStaleState(t *testing.T) {
	ctx := context.Background()
	waitResult, err := WaitResult(
		Interaction{ID: "interaction-replayed", Title: "Approve the replayed operation"},
		CompletionContract{Revision: "contract-v3", Objective: "Complete the approved operation",
			Criteria: []Criterion{{ID: "objective", Requirement: "Complete it"}}},
	)
	require.NoError(t, err)
	found := func(context.Context) (RunResult, bool, error) { return waitResult, true, nil }
	replayed := EventID{SourceInstanceID: "runner-recovered", SourceEventID: "runner-recovered:item:7", SourceSeq: 7}
	next := EventID{SourceInstanceID: "runner-recovered", SourceEventID: "runner-recovered:item:8", SourceSeq: 8}

	t.Run("seed: consumed once", func(t *testing.T) {
		obs := NewObservation(found)
		require.NoError(t, obs.Observe(ctx, replayed, true))
		got, ok := obs.Consume(replayed)
		require.True(t, ok)
		require.Equal(t, waitResult, got)
		_, ok = obs.Consume(replayed)
		require.False(t, ok)
	})

	t.Run("seed: another event clears it", func(t *testing.T) {
		obs := NewObservation(found)
		require.NoError(t, obs.Observe(ctx, replayed, true))
		_, ok := obs.Consume(next)
		require.False(t, ok)
		_, ok = obs.Consume(replayed)
		require.False(t, ok)
	})

	t.Run("seed: a lookup resolving after consumption yields nothing", func(t *testing.T) {
		started, release := make(chan struct{}), make(chan struct{})
		obs := NewObservation(func(context.Context) (RunResult, bool, error) {
			close(started)
			<-release
			return waitResult, true, nil
		})
		done := make(chan error)
		go func() { done <- obs.Observe(ctx, replayed, true) }()
		<-started
		_, ok := obs.Consume(replayed)
		require.False(t, ok)
		close(release)
		require.NoError(t, <-done)
		_, ok = obs.Consume(replayed)
		require.False(t, ok)
	})

	t.Run("a newer observation discards a late lookup", func(t *testing.T) {
		var calls atomic.Int32
		started, release := make(chan struct{}), make(chan struct{})
		obs := NewObservation(func(context.Context) (RunResult, bool, error) {
			if calls.Add(1) == 1 {
				close(started)
				<-release
			}
			return waitResult, true, nil
		})
		done := make(chan error)
		go func() { done <- obs.Observe(ctx, replayed, true) }()
		<-started
		require.NoError(t, obs.Observe(ctx, next, false))
		close(release)
		require.NoError(t, <-done)
		_, ok := obs.Consume(replayed)
		require.False(t, ok)
	})

	t.Run("exact identity: same event id with another seq or instance does not match", func(t *testing.T) {
		for _, other := range []EventID{
			{SourceInstanceID: "runner-recovered", SourceEventID: "runner-recovered:item:7", SourceSeq: 8},
			{SourceInstanceID: "runner-other", SourceEventID: "runner-recovered:item:7", SourceSeq: 7},
		} {
			obs := NewObservation(found)
			require.NoError(t, obs.Observe(ctx, replayed, true))
			_, ok := obs.Consume(other)
			require.False(t, ok)
		}
	})

	t.Run("ineligible, anonymous, not found and failed observations hold nothing", func(t *testing.T) {
		obs := NewObservation(found)
		require.NoError(t, obs.Observe(ctx, replayed, false))
		_, ok := obs.Consume(replayed)
		require.False(t, ok)

		require.NoError(t, obs.Observe(ctx, EventID{}, true))
		_, ok = obs.Consume(EventID{})
		require.False(t, ok)

		none := NewObservation(func(context.Context) (RunResult, bool, error) { return RunResult{}, false, nil })
		require.NoError(t, none.Observe(ctx, replayed, true))
		_, ok = none.Consume(replayed)
		require.False(t, ok)

		boom := errors.New("lookup failed")
		failing := NewObservation(func(context.Context) (RunResult, bool, error) { return waitResult, true, boom })
		require.ErrorIs(t, failing.Observe(ctx, replayed, true), boom)
		_, ok = failing.Consume(replayed)
		require.False(t, ok)
	})

	t.Run("concurrent consumers take a held wait at most once", func(t *testing.T) {
		for range 50 {
			obs := NewObservation(found)
			require.NoError(t, obs.Observe(ctx, replayed, true))
			var wins atomic.Int32
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, ok := obs.Consume(replayed); ok {
						wins.Add(1)
					}
				}()
			}
			wg.Wait()
			require.Equal(t, int32(1), wins.Load())
		}
	})

	t.Run("eligibility", func(t *testing.T) {
		tests := []struct {
			f    EventFacts
			want bool
		}{
			{EventFacts{EventType: "item.completed"}, true},
			{EventFacts{EventType: "item.delta"}, false},
			{EventFacts{EventType: "runtime_request.expired", Reason: "durable_handoff", MaterializedQuestionFallback: true}, true},
			{EventFacts{EventType: "runtime_request.expired", Reason: "provider_process_lost", MaterializedQuestionFallback: true}, false},
			{EventFacts{EventType: "item.completed", PendingToolItems: 1}, false},
			{EventFacts{EventType: "item.completed", ProviderProcessLost: true}, false},
		}
		for _, tc := range tests {
			require.Equal(t, tc.want, Eligible(tc.f), "%+v", tc.f)
		}
	})
}
