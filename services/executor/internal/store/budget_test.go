package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func usd(v float64) *float64 { return &v }

// costTerminal is a run.terminal whose run cost usd.
func costTerminal(run, inst string, seq uint64, usd float64) *prpv1.Event {
	return event(run, inst, seq, "run.terminal", map[string]any{"turnTerminalState": "completed", "runTerminalState": "succeeded",
		"finalMessage": "done", "usage": map[string]any{"runDelta": map[string]any{"inputTokens": 10, "outputTokens": 1, "providerCostUsd": usd},
			"total": map[string]any{"inputTokens": 10, "outputTokens": 1}}})
}

// settle submits, claims and ends run id of company acme at cost usd.
func settle(t *testing.T, s *store.Store, id string, usd float64) {
	t.Helper()
	ctx := context.Background()
	_, c, _, err := s.SubmitClaim(ctx, id, input(id, "x"), "o-"+id, time.Minute, store.Controller{Addr: "127.0.0.1:1"}, nil)
	require.NoError(t, err)
	require.NotNil(t, c, id)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{costTerminal(id, "runner-"+id, 1, usd)})
	require.NoError(t, err)
}

func budgetActions(t *testing.T, s *store.Store, company string) map[string]int {
	t.Helper()
	acts, err := s.OperatorActions(context.Background(), company)
	require.NoError(t, err)
	out := map[string]int{}
	for _, a := range acts {
		out[a.Action]++
	}
	return out
}

// TestQ2_SpendIsSettledOnceThroughATakeoverAndAReplay: a run claimed by
// one owner is taken over after its lease expired; the old owner's
// terminal is refused (lease lost), the new owner's counts its cost once,
// and the same terminal replayed (a runner resending its outbox) or a late
// failure adds nothing.
func TestQ2_SpendIsSettledOnceThroughATakeoverAndAReplay(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, err := s.Submit(ctx, "r", input("s", "x"))
	require.NoError(t, err)
	old, err := s.ClaimNext(ctx, "old", time.Millisecond, store.Controller{})
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, old.Fence, []*prpv1.Event{event("r", "runner-1", 1, "turn.started", nil)})
	require.NoError(t, err)
	var taken *store.Claim
	require.Eventually(t, func() bool {
		taken, err = s.ClaimNext(ctx, "new", time.Minute, store.Controller{})
		return err == nil && taken != nil
	}, time.Minute, time.Millisecond)
	_, err = s.AppendEvents(ctx, old.Fence, []*prpv1.Event{costTerminal("r", "runner-1", 2, 0.25)})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
	_, err = s.AppendEvents(ctx, taken.Fence, []*prpv1.Event{costTerminal("r", "runner-1", 2, 0.25)})
	require.NoError(t, err)
	// Replayed after the run ended: refused or a duplicate, never counted.
	_, _ = s.AppendEvents(ctx, taken.Fence, []*prpv1.Event{costTerminal("r", "runner-1", 2, 0.25)})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(s.FailRun(ctx, taken.Fence, "x_failed", "late")))
	u, err := s.CompanyUsage(ctx, "acme")
	require.NoError(t, err)
	require.InDelta(t, 0.25, u.SpendUSD, 1e-9)
}

// TestQ2_ConcurrentSettlementsOnTwoReplicasAddUpExactlyAndCrossOnce
// settles 20 runs of 0.1 USD through two stores (two replicas) at once,
// against a budget of 1.5 USD warned at 0.5: the month's spend is exactly
// 2.0, budget.warning and budget.exhausted are each recorded once, and
// both replicas then refuse a submission with budget_exhausted (no
// RetryInfo: a permanent reason) while a resubmission is not refused.
func TestQ2_ConcurrentSettlementsOnTwoReplicasAddUpExactlyAndCrossOnce(t *testing.T) {
	t.Parallel()
	a := newStore(t)
	b, err := store.Open(context.Background(), a.Pool().Config().ConnString(), runrules.New())
	require.NoError(t, err)
	t.Cleanup(b.Close)
	setLimits(t, a, store.CompanyLimits{Company: "acme", MonthlyBudgetUSD: usd(1.5), BudgetWarnRatio: 0.5})
	// Twenty runs claimed on either replica, then settled at once.
	ctx := context.Background()
	claims := make([]*store.Claim, 20)
	for i := range claims {
		st := []*store.Store{a, b}[i%2]
		_, err := st.Submit(ctx, fmt.Sprintf("spend-%d", i), input(fmt.Sprintf("spend-%d", i), "x"))
		require.NoError(t, err)
		claims[i], err = st.ClaimNext(ctx, fmt.Sprintf("o-%d", i%2), time.Minute, store.Controller{Addr: "127.0.0.1:1"})
		require.NoError(t, err)
		require.NotNil(t, claims[i])
	}
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := []*store.Store{a, b}[i%2]
			if _, err := st.AppendEvents(ctx, c.Fence, []*prpv1.Event{costTerminal(c.RunID, "runner-"+c.RunID, 1, 0.1)}); err != nil {
				t.Errorf("%s: %v", c.RunID, err)
			}
		}()
	}
	wg.Wait()
	u, err := b.CompanyUsage(context.Background(), "acme")
	require.NoError(t, err)
	require.InDelta(t, 2.0, u.SpendUSD, 1e-9)
	acts := budgetActions(t, a, "acme")
	require.Equal(t, 1, acts["budget.warning"])
	require.Equal(t, 1, acts["budget.exhausted"])
	for _, st := range []*store.Store{a, b} {
		_, err := st.Submit(context.Background(), "after", input("after", "x"))
		requireQuotaRefused(t, err, failure.BudgetExhausted)
	}
	_, err = a.Submit(context.Background(), "spend-3", input("spend-3", "x"))
	require.NoError(t, err, "a resubmission is never refused")
	u, err = a.CompanyUsage(context.Background(), "acme")
	require.NoError(t, err)
	require.EqualValues(t, 2, u.Refused[failure.BudgetExhausted])
}

// TestQ2_RaisingTheBudgetOrANewMonthAdmitsAgain: a company at its budget
// is refused; raising the budget admits it; back at the budget, the next
// month (the store's clock) admits it again.
func TestQ2_RaisingTheBudgetOrANewMonthAdmitsAgain(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	s.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	setLimits(t, s, store.CompanyLimits{Company: "acme", MonthlyBudgetUSD: usd(0.5)})
	settle(t, s, "r1", 0.5)
	_, err := s.Submit(ctx, "r2", input("r2", "x"))
	requireQuotaRefused(t, err, failure.BudgetExhausted)
	setLimits(t, s, store.CompanyLimits{Company: "acme", MonthlyBudgetUSD: usd(1)})
	settle(t, s, "r2", 0.5)
	_, err = s.Submit(ctx, "r3", input("r3", "x"))
	requireQuotaRefused(t, err, failure.BudgetExhausted)
	mu.Lock()
	now = store.MonthOf(now).AddDate(0, 1, 0)
	mu.Unlock()
	_, err = s.Submit(ctx, "r3", input("r3", "x"))
	require.NoError(t, err, "a new month")
	u, err := s.CompanyUsage(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, u.SpendUSD)
	require.Equal(t, store.MonthOf(now), u.Month)
}

// TestQ2_TheStoresClockOwnsTheMonthOfSettlementsAdmissionAndUsage: with the
// store's clock set to a month far from the database's, a run's cost is
// settled into the clock's month (runs.spend_month, company_spend.month),
// and admission and GetCompanyUsage read that same month: at the budget a
// submission is refused; the clock's next month admits it again.
func TestQ2_TheStoresClockOwnsTheMonthOfSettlementsAdmissionAndUsage(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Date(2031, time.March, 31, 23, 59, 0, 0, time.UTC)
	s.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	march := time.Date(2031, time.March, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, march, s.Month())
	setLimits(t, s, store.CompanyLimits{Company: "acme", MonthlyBudgetUSD: usd(1)})
	settle(t, s, "m1", 1.25)

	var spendMonth, rowMonth time.Time
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT spend_month FROM executor.runs WHERE client_run_id = 'm1'`).Scan(&spendMonth))
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT month FROM executor.company_spend WHERE company_id = 'acme'`).Scan(&rowMonth))
	require.Equal(t, march, spendMonth.UTC(), "settled into the clock's month, not the database's")
	require.Equal(t, march, rowMonth.UTC())
	u, err := s.CompanyUsage(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, march, u.Month)
	require.InDelta(t, 1.25, u.SpendUSD, 1e-9, "the usage reads the month the settlement added to")
	_, err = s.Submit(ctx, "m2", input("m2", "x"))
	requireQuotaRefused(t, err, failure.BudgetExhausted)
	acts := budgetActions(t, s, "acme")
	require.Equal(t, 1, acts["budget.exhausted"])

	mu.Lock()
	now = now.Add(2 * time.Minute) // April, by the store's clock
	mu.Unlock()
	_, err = s.Submit(ctx, "m2", input("m2", "x"))
	require.NoError(t, err, "a new month by the store's clock")
	u, err = s.CompanyUsage(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, march.AddDate(0, 1, 0), u.Month)
	require.Zero(t, u.SpendUSD)
}
