package governed

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/askuser"
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
			Kind:          askuser.KindRequestItemVerdicts,
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
		{"pending without a result yet", []InteractionResponse{{InteractionID: "i", Kind: askuser.KindRequestItemVerdicts, Response: Response{Status: "pending"}}},
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
