// Package budget enforces the companies' monthly budgets on runs already
// admitted (SPEC Q2, docs/limits.md). A submission over the budget is
// refused at admission (quota.Admit); this sweep applies the budget state
// of each company with a spend this month (or blocked) to what is queued
// and in flight: at the hard limit the company is budget_blocked (the claim
// starts none of its runs) until the budget is raised or a new month
// begins; under the policy cancel, each open run of the company is also
// cancelled through the durable cancellation path (E6), the reason
// budget_exhausted on the run. Under finish_turn (the default) runs in
// flight finish their turn.
package budget

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/quota"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
)

// DefaultInterval is how often the sweep runs by default.
const DefaultInterval = time.Second

// cancelBatch bounds the runs of one company cancelled per sweep.
const cancelBatch = 200

// Enforcer sweeps the companies' budgets every Interval.
type Enforcer struct {
	Store    *store.Store
	Interval time.Duration
	Logger   *slog.Logger
}

// Run sweeps every Interval until ctx ends.
func (e *Enforcer) Run(ctx context.Context) {
	suspend.Every(ctx, e.Interval, e.Logger, "budget sweep failed", e.Sweep)
}

func (e *Enforcer) log() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}

// Sweep applies the budget state of every company with a spend this month;
// n counts the runs it cancelled.
func (e *Enforcer) Sweep(ctx context.Context) (n int, err error) {
	month := e.Store.Month() // the store's clock owns the month
	cs, err := e.Store.BudgetCompanies(ctx, month)
	if err != nil {
		return 0, err
	}
	for _, c := range cs {
		state := quota.Budget(c.SpendUSD, c.Limits)
		if (state >= store.BudgetWarning && !c.Warned) || (state == store.BudgetExhausted && !c.Exhausted) {
			// A budget lowered under the month's spend: the thresholds
			// are recorded as a settlement crossing them records them.
			if err := e.Store.RecordBudgetThresholds(ctx, c, month, state); err != nil {
				return n, err
			}
		}
		exhausted := state == store.BudgetExhausted
		if exhausted != c.Blocked {
			// The claim starts no run of a company whose budget is
			// exhausted; a raised budget or a new month lets them run.
			if err := e.Store.SetBudgetBlocked(ctx, c.Company, exhausted); err != nil {
				return n, err
			}
			e.log().Info("budget", "company", c.Company, "blocked", exhausted, "spend_usd", c.SpendUSD, "month", month.Format("2006-01"))
		}
		if !exhausted || c.Limits.BudgetPolicy != store.BudgetPolicyCancel {
			continue
		}
		cancelled, err := e.cancelOpen(ctx, c, month)
		n += cancelled
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// cancelOpen cancels the open runs of a company whose budget is exhausted
// under the policy cancel; one request id per month, so a repeated sweep
// changes nothing.
func (e *Enforcer) cancelOpen(ctx context.Context, c store.CompanyBudget, month time.Time) (int, error) {
	ids, err := e.Store.OpenRuns(ctx, c.Company, cancelBatch)
	if err != nil {
		return 0, err
	}
	reason := failure.Message(failure.BudgetExhausted, fmt.Sprintf("company %s spent %.6f USD in %s, its monthly budget is %.6f USD (policy cancel)",
		c.Company, c.SpendUSD, month.Format("2006-01"), *c.Limits.MonthlyBudgetUSD))
	n := 0
	for _, id := range ids {
		_, err := e.Store.RecordCancellation(ctx, store.CancelRequest{RunID: id, Scope: "run", Reason: reason,
			RequestID: "budget_exhausted:" + month.Format("2006-01"), Actor: "executor:budget"})
		if err != nil && failure.CodeOf(err) != failure.NativeRunAlreadyTerminal {
			return n, err
		}
		n++
	}
	return n, nil
}
