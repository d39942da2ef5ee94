// Package quota is what a company's limits and budget decide (SPEC Q1, Q2;
// docs/limits.md): whether a submission is admitted, and the state of a
// company's monthly budget. Everything here is pure: the store reads the
// facts under the company's lock and asks (store.Rules.Admit, through
// runrules); no database, no clock.
package quota

import (
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Admit decides a submission from its company's limits and what the
// company uses, as read under its lock: nil admits it; a refusal is a
// ResourceExhausted error of a stable reason:
//   - quota_queued_runs when max_queued_runs runs wait already (the
//     submission would be one more waiting run);
//   - quota_warm_sessions when the run would open a warm session and
//     max_warm_sessions are open already (a run of an open warm session
//     opens none);
//   - budget_exhausted (checked first; no RetryInfo: waiting does not
//     help before the budget is raised or the month ends) when the month's
//     spend has reached the budget.
//
// An idempotent resubmission is never asked (the store admits it).
func Admit(a store.Admission) error {
	l := a.Limits
	if Budget(a.MonthSpendUSD, l) == store.BudgetExhausted {
		return failure.Newf(failure.BudgetExhausted, "company %q spent %.6f USD this month, its monthly budget is %.6f USD; raise the budget or wait for the next month (UTC)",
			a.Company, a.MonthSpendUSD, *l.MonthlyBudgetUSD)
	}
	if l.MaxQueuedRuns != nil && a.QueuedRuns >= *l.MaxQueuedRuns {
		return failure.Newf(failure.QuotaQueuedRuns, "company %q has %d runs waiting to start, its limit (max_queued_runs) is %d; submit again once one has started",
			a.Company, a.QueuedRuns, *l.MaxQueuedRuns)
	}
	if a.OpensSession && l.MaxWarmSessions != nil && a.WarmSessions >= *l.MaxWarmSessions {
		return failure.Newf(failure.QuotaWarmSessions, "company %q has %d warm sessions open, its limit (max_warm_sessions) is %d; submit again once one has closed, or continue an open one",
			a.Company, a.WarmSessions, *l.MaxWarmSessions)
	}
	return nil
}

// Budget says where a month's spend stands against a company's budget: ok
// without a budget or below budget_warn_ratio of it, warning from there,
// exhausted at the budget (a budget of 0 is exhausted at once).
func Budget(spendUSD float64, l store.CompanyLimits) store.BudgetState {
	switch {
	case l.MonthlyBudgetUSD == nil:
		return store.BudgetOK
	case spendUSD >= *l.MonthlyBudgetUSD:
		return store.BudgetExhausted
	case spendUSD >= l.BudgetWarnRatio**l.MonthlyBudgetUSD:
		return store.BudgetWarning
	}
	return store.BudgetOK
}
