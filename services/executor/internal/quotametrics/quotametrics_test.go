package quotametrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/quotametrics"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var migrator = pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version"))

func input(company, session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: company, AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "x"},
		Session:  &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

// TestQ4_MetricsLabelOnlyCompaniesWithTheirOwnLimits: 50 companies without
// their own limits and acme with its own submit runs; the metrics have
// exactly two company labels, acme and _other (the bound), with acme's
// running and queued runs, its refusal by reason, and the others summed.
func TestQ4_MetricsLabelOnlyCompaniesWithTheirOwnLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := store.Open(ctx, pgtest.NewDB(t, migrator), runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	two := 2
	_, err = s.SetCompanyLimits(ctx, store.CompanyLimits{Company: "acme", MaxQueuedRuns: &two, Weight: 1, BudgetWarnRatio: 0.8,
		BudgetPolicy: store.BudgetPolicyFinishTurn}, "op", "")
	require.NoError(t, err)
	for i := range 50 {
		_, err := s.Submit(ctx, fmt.Sprintf("o%d", i), input(fmt.Sprintf("co-%d", i), "s"))
		require.NoError(t, err)
	}
	_, c, _, err := s.SubmitClaim(ctx, "a0", input("acme", "busy"), "o", time.Minute, store.Controller{Addr: "127.0.0.1:1"}, nil)
	require.NoError(t, err)
	require.NotNil(t, c)
	for _, id := range []string{"a1", "a2"} {
		_, err := s.Submit(ctx, id, input("acme", "busy"))
		require.NoError(t, err)
	}
	_, err = s.Submit(ctx, "a3", input("acme", "busy"))
	require.EqualValues(t, failure.QuotaQueuedRuns, failure.CodeOf(err))

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&quotametrics.Collector{Store: s})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tether_company_refused_total Submissions refused by a limit or the budget, by reason (quota_queued_runs, quota_warm_sessions, budget_exhausted). Fleet-wide.
# TYPE tether_company_refused_total counter
tether_company_refused_total{company="acme",reason="quota_queued_runs"} 1
# HELP tether_company_runs Runs of the company now, by state (running: holding a lease; queued: waiting to start or for a retry). Fleet-wide, from PostgreSQL.
# TYPE tether_company_runs gauge
tether_company_runs{company="_other",state="queued"} 50
tether_company_runs{company="_other",state="running"} 0
tether_company_runs{company="acme",state="queued"} 2
tether_company_runs{company="acme",state="running"} 1
`), "tether_company_runs", "tether_company_refused_total"))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 2*4+1, n, "two labels × (running, queued, spend, warnings) + one refusal series")
}
