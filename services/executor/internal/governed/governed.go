// Package governed decides governed waits (SPEC E4): a run that stops on a
// durable pending interaction (a question to the user, an approval, an item
// verdict) yields instead of finishing, and is woken when the interaction is
// answered.
//
// [WaitResult] builds the yielded run result and
// [ContinuingPendingInteractionIDs] applies the partial item-verdict rule.
// Nothing here touches storage: the executor's store looks the pending
// interaction up when it records a run's end, in the transaction that
// persists the run.terminal event (a replayed event is deduplicated there,
// so its interaction is created and consumed once).
package governed

import (
	"strings"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
)

// Values of the run result.
const (
	ResultSchema = "tether.run_result.v1"

	DispositionYielded = "yielded"
	CriterionUnknown   = "unknown"

	ArtifactInteraction = "issue_thread_interaction"

	ContinuationSummary = "Resume from the resolved interaction response without repeating prior work."
	RemainingWorkText   = "Resume after the durable interaction is resolved."

	// defaultSubject names the wait when the interaction has neither title
	// nor summary.
	defaultSubject = "the requested response"
	// maxSubjectRunes bounds the interaction text quoted in the summary.
	maxSubjectRunes = 240
)

// Interaction is the durable pending interaction the run waits on.
type Interaction struct {
	ID      string
	Title   string
	Summary string
}

// Criterion is one completion-contract criterion.
type Criterion struct {
	ID          string
	Requirement string
}

// CompletionContract is the contract revision the run works under.
type CompletionContract struct {
	Revision  string
	Objective string
	Criteria  []Criterion
}

// RunResult is a run's result as the executor records it.
type RunResult struct {
	Schema                  string             `json:"schema"`
	ReportedWorkDisposition string             `json:"reportedWorkDisposition"`
	Summary                 string             `json:"summary"`
	CompletionClaim         CompletionClaim    `json:"completionClaim"`
	Evidence                []EvidenceRef      `json:"evidence"`
	Verification            []Verification     `json:"verification"`
	AttentionRequests       []AttentionRequest `json:"attentionRequests"`
	Artifacts               []Artifact         `json:"artifacts"`
	Continuation            *Continuation      `json:"continuation,omitempty"`
}

// CompletionClaim is what the run claims about the contract.
type CompletionClaim struct {
	ContractRevision   string           `json:"contractRevision"`
	ObjectiveSatisfied bool             `json:"objectiveSatisfied"`
	Criteria           []CriterionClaim `json:"criteria"`
	RemainingWork      []RemainingWork  `json:"remainingWork"`
}

// CriterionClaim is the claimed status of one criterion.
type CriterionClaim struct {
	CriterionID  string   `json:"criterionId"`
	Status       string   `json:"status"`
	EvidenceRefs []string `json:"evidenceRefs"`
}

// RemainingWork is work the run did not finish.
type RemainingWork struct {
	Summary          string `json:"summary"`
	BlocksCompletion bool   `json:"blocksCompletion"`
}

// EvidenceRef points at evidence.
type EvidenceRef struct {
	Ref string `json:"ref"`
}

// Verification is a verification the run performed.
type Verification struct {
	Kind    string `json:"kind"`
	Summary string `json:"summary"`
}

// AttentionRequest asks a human to look at something.
type AttentionRequest struct {
	Kind    string `json:"kind"`
	Summary string `json:"summary"`
}

// Artifact is something the run produced or refers to.
type Artifact struct {
	Kind string `json:"kind"`
	Ref  string `json:"ref"`
}

// Continuation says how the run resumes.
type Continuation struct {
	Kind           string `json:"kind"`
	Summary        string `json:"summary"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// ErrNoInteraction is returned for an interaction without an id.
var ErrNoInteraction error = failure.Newf(failure.GovernedWaitInteractionMissing, "the pending interaction has no id")

// InteractionRef is the evidence ref of an interaction: "interaction:<id>".
func InteractionRef(id string) string { return "interaction:" + id }

// ResponseWakeKey is the idempotency key of the wake that resumes the run
// once the interaction is answered: "interaction-response:<id>".
func ResponseWakeKey(id string) string { return "interaction-response:" + id }

// WaitResult turns a durable pending interaction into the run's result:
// disposition yielded; summary "Waiting for <title>." (the summary, then
// "the requested response", stand in for a missing title); a completion
// claim on the contract revision with the objective unsatisfied and every
// criterion unknown with evidence "interaction:<id>"; no verification and
// no attention requests; and a response_wake continuation keyed
// "interaction-response:<id>".
func WaitResult(in Interaction, contract CompletionContract) (RunResult, error) {
	id := strings.TrimSpace(in.ID)
	if id == "" {
		return RunResult{}, ErrNoInteraction
	}
	ref := InteractionRef(id)
	criteria := make([]CriterionClaim, 0, len(contract.Criteria))
	for _, c := range contract.Criteria {
		criteria = append(criteria, CriterionClaim{
			CriterionID:  c.ID,
			Status:       CriterionUnknown,
			EvidenceRefs: []string{ref},
		})
	}
	return RunResult{
		Schema:                  ResultSchema,
		ReportedWorkDisposition: DispositionYielded,
		Summary:                 "Waiting for " + subject(in) + ".",
		CompletionClaim: CompletionClaim{
			ContractRevision:   contract.Revision,
			ObjectiveSatisfied: false,
			Criteria:           criteria,
			RemainingWork:      []RemainingWork{{Summary: RemainingWorkText, BlocksCompletion: true}},
		},
		Evidence:          []EvidenceRef{{Ref: ref}},
		Verification:      []Verification{},
		AttentionRequests: []AttentionRequest{},
		Artifacts:         []Artifact{{Kind: ArtifactInteraction, Ref: ref}},
		Continuation: &Continuation{
			Kind:           runtimeq.ContinuationResponseWake,
			Summary:        ContinuationSummary,
			IdempotencyKey: ResponseWakeKey(id),
		},
	}, nil
}

// subject is the interaction's title (else summary, else a default) on one
// line, bounded, without a trailing full stop (the summary adds one).
func subject(in Interaction) string {
	for _, s := range []string{in.Title, in.Summary} {
		s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
		if utf8.RuneCountInString(s) > maxSubjectRunes {
			s = string([]rune(s)[:maxSubjectRunes-1]) + "…"
		}
		s = strings.TrimRight(s, ".")
		if s != "" {
			return s
		}
	}
	return defaultSubject
}

// Interaction kinds and response statuses used by the item-verdict rule.
const (
	ResponseStatusPending  = "pending"
	ResponseStatusAnswered = "answered"
)

// InteractionResponse is one entry of the execution input's interaction
// responses.
type InteractionResponse struct {
	InteractionID string
	Kind          string
	Response      Response
}

// Response is the recorded answer to an interaction so far.
type Response struct {
	Status string
	// Result is the item-verdict result; nil when none was recorded.
	Result *ItemVerdictResult
}

// ItemVerdictResult is a (possibly partial) set of item verdicts.
type ItemVerdictResult struct {
	Version  int
	Complete bool
	Items    []ItemVerdict
}

// ItemVerdict is the verdict on one item.
type ItemVerdict struct {
	ID      string
	Verdict string
}

// ContinuingPendingInteractionIDs returns, in order and without duplicates,
// the interactions the run continues to wait on although the execution
// input already carries a response for them: item-verdict requests whose
// response is still pending and not complete (a partial verdict set). Once
// answered, or once complete, an interaction is no longer a wait target.
// The caller has already checked that each response belongs to this run's
// authority.
func ContinuingPendingInteractionIDs(responses []InteractionResponse) []string {
	ids := []string{}
	seen := map[string]bool{}
	for _, r := range responses {
		if r.Kind != askuser.KindRequestItemVerdicts || r.Response.Status != ResponseStatusPending {
			continue
		}
		if r.Response.Result != nil && r.Response.Result.Complete {
			continue
		}
		if r.InteractionID == "" || seen[r.InteractionID] {
			continue
		}
		seen[r.InteractionID] = true
		ids = append(ids, r.InteractionID)
	}
	return ids
}
