package quota_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/quota"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func n(v int) *int { return &v }

// TestQ1_AdmitDecidesAtEachLimitsEdge: a submission is refused exactly at
// a limit (the count reached it), admitted below it, and a limit that is
// absent limits nothing; a warm run that opens no session is never
// refused for warm sessions.
func TestQ1_AdmitDecidesAtEachLimitsEdge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		a    store.Admission
		want failure.Reason
	}{
		{"no limits", store.Admission{QueuedRuns: 1000, WarmSessions: 1000, OpensSession: true}, ""},
		{"queued below", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(3)}, QueuedRuns: 2}, ""},
		{"queued at", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(3)}, QueuedRuns: 3}, failure.QuotaQueuedRuns},
		{"queued zero", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(0)}}, failure.QuotaQueuedRuns},
		{"warm below", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 1, OpensSession: true}, ""},
		{"warm at", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 2, OpensSession: true}, failure.QuotaWarmSessions},
		{"warm at, open session", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 2}, ""},
		{"queued first", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(1), MaxWarmSessions: n(1)}, QueuedRuns: 1, WarmSessions: 1, OpensSession: true}, failure.QuotaQueuedRuns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, failure.CodeOf(quota.Admit(tc.a)))
		})
	}
}

func f(v float64) *float64 { return &v }

// TestQ2_BudgetStateFromSpendLimitAndRatio: ok below the warn ratio (or
// without a budget), warning from the ratio, exhausted at the budget; a
// zero budget is exhausted at once; exhausted refuses a submission with
// budget_exhausted before any other limit.
func TestQ2_BudgetStateFromSpendLimitAndRatio(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spend  float64
		budget *float64
		ratio  float64
		want   store.BudgetState
	}{
		{1e9, nil, 0.8, store.BudgetOK},
		{7.99, f(10), 0.8, store.BudgetOK},
		{8, f(10), 0.8, store.BudgetWarning},
		{9.99, f(10), 0.8, store.BudgetWarning},
		{10, f(10), 0.8, store.BudgetExhausted},
		{12, f(10), 1, store.BudgetExhausted},
		{9.99, f(10), 1, store.BudgetOK},
		{0, f(0), 0.8, store.BudgetExhausted},
	} {
		l := store.CompanyLimits{MonthlyBudgetUSD: tc.budget, BudgetWarnRatio: tc.ratio}
		require.Equal(t, tc.want, quota.Budget(tc.spend, l), "%v of %v at %v", tc.spend, tc.budget, tc.ratio)
	}
	err := quota.Admit(store.Admission{Limits: store.CompanyLimits{MonthlyBudgetUSD: f(1), BudgetWarnRatio: 0.8, MaxQueuedRuns: n(0)}, MonthSpendUSD: 1})
	require.Equal(t, failure.Reason(failure.BudgetExhausted), failure.CodeOf(err))
}
