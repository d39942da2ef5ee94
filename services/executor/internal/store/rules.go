package store

import (
	"errors"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Rules are the run's rules: what the events a runner reports, and an
// interaction's answer, decide. The store asks them inside its
// transactions and writes only what they decide; they read and write
// nothing themselves (package runrules implements them, pure, with table
// tests). Every method must be deterministic in its arguments: a replayed
// batch is decided again, identically.
type Rules interface {
	// Stored returns events as they are stored (SPEC E3: a plan update
	// rendered, an oversized plan refused); unchanged events are returned
	// as they are, and applying it to its own output changes nothing.
	Stored(events []*prpv1.Event) []*prpv1.Event
	// Decides reports whether filing an event of type typ may decide
	// more than its row — open an interaction or count a runtime input
	// lifecycle step (SPEC E4, E5) — so that it takes the careful append
	// path, which decides each fresh event exactly once.
	Decides(typ string) bool
	// Batch decides what filing fresh events (never stored before, in
	// the order they are filed) under the fenced run runID writes beside
	// their rows.
	Batch(runID string, fresh []*prpv1.Event) (Decisions, error)
	// ContinuingInteractions names the pending interactions a run's input
	// continues (partial item-verdict responses): a governed wait may be
	// on one of them as well as on one the run opened.
	ContinuingInteractions(in *prpv1.ExecutionInput) []string
	// GovernedWait makes the result res of a succeeded run with input in
	// the governed wait on the pending interaction wait (SPEC E4).
	GovernedWait(in *prpv1.ExecutionInput, wait PendingInteraction, res *executorv1.RunResult) error
	// MergeAnswers checks answers to an interaction of kind kind against
	// its questions and merges them over the answers recorded before, in
	// question order; complete when every required question is answered.
	// An answer that does not fit is an *AnswerError.
	MergeAnswers(kind string, questions []Question, prior, answers []Answer) (merged []Answer, complete bool, err error)
	// AnswerPrompt is the prompt of the run an interaction's complete
	// answer continues: the answer in words.
	AnswerPrompt(title string, questions []Question, answers []Answer) string
	// Admit decides a submission of a company that has limits (SPEC Q1,
	// Q2), from its facts read under the company's lock: nil admits it, a
	// refusal is the coded error the caller gets (nothing is stored).
	Admit(a Admission) error
	// Budget says where a month's spend stands against the company's
	// budget (SPEC Q2).
	Budget(spendUSD float64, l CompanyLimits) BudgetState
}

// Decisions is what a batch of fresh events decides beside its rows.
type Decisions struct {
	// Interactions are the interactions to open (once per idempotency
	// key), filed under the fenced run.
	Interactions []OpenInteraction
	// RuntimeInputs are the runtime input lifecycle metrics of the batch
	// (SPEC E5).
	RuntimeInputs []RuntimeInputMetric
	// Plan is the fenced run's latest plan, rendered (SPEC E3); "" when
	// the batch updates none.
	Plan string
	// Terminal is the outcome of the fenced run's run.terminal, if the
	// batch holds it (its governed wait, if any, not applied yet).
	Terminal *Terminal
}

// OpenInteraction is an interaction a batch opens.
type OpenInteraction struct {
	InteractionSpec
	// ProviderLost marks a runtime question's fallback whose provider
	// process was lost: the run does not wait on it.
	ProviderLost bool
}

// PendingInteraction is the pending interaction a succeeded run waits on.
type PendingInteraction struct {
	ID, Title, Summary string
}

// errNoRules is the error of a deciding write on a store opened without
// rules (a read-only use: tools, tetherctl audit).
var errNoRules = errors.New("store: opened without the run's rules (nil Rules): this write decides through them")

// decider returns the store's rules, or errNoRules.
func (s *Store) decider() (Rules, error) {
	if s.rules == nil {
		return nil, errNoRules
	}
	return s.rules, nil
}
