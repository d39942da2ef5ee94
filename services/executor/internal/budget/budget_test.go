package budget_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/budget"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var migrator = pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version"))

func input(session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "x"},
		Session:  &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

func terminal(run string, usd float64) *prpv1.Event {
	p, _ := structpb.NewStruct(map[string]any{"turnTerminalState": "completed", "runTerminalState": "succeeded", "finalMessage": "done",
		"usage": map[string]any{"runDelta": map[string]any{"inputTokens": 1, "providerCostUsd": usd}, "total": map[string]any{"inputTokens": 1}}})
	return &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "runner-" + run, SourceSeq: 1,
		SourceEventId: "event_runner-" + run + "_0000000000000001", SourceKind: "runner", RunId: run, EventType: "run.terminal",
		SchemaVersion: 1, Priority: 1, Payload: p}
}

// TestQ2_TheCancelPolicyCancelsOpenRunsThroughTheDurablePath: at the hard
// limit under the policy cancel, the sweep cancels the company's queued
// run on the spot and records a pending cancellation for its running one
// (its driver interrupts the turn), each with budget_exhausted as the
// reason; a second sweep changes nothing; under finish_turn nothing is
// cancelled.
func TestQ2_TheCancelPolicyCancelsOpenRunsThroughTheDurablePath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := store.Open(ctx, pgtest.NewDB(t, migrator), runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	_, c, _, err := s.SubmitClaim(ctx, "paid", input("paid"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	_, _, _, err = s.SubmitClaim(ctx, "running", input("running"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	_, err = s.Submit(ctx, "queued", input("running"))
	require.NoError(t, err)
	budget1 := 1.0
	_, err = s.SetCompanyLimits(ctx, store.CompanyLimits{Company: "acme", Weight: 1, MonthlyBudgetUSD: &budget1, BudgetWarnRatio: 0.8,
		BudgetPolicy: store.BudgetPolicyFinishTurn}, "op", "")
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{terminal("paid", 1.2)})
	require.NoError(t, err)
	e := &budget.Enforcer{Store: s}
	n, err := e.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "finish_turn cancels nothing")

	_, err = s.SetCompanyLimits(ctx, store.CompanyLimits{Company: "acme", Weight: 1, MonthlyBudgetUSD: &budget1, BudgetWarnRatio: 0.8,
		BudgetPolicy: store.BudgetPolicyCancel}, "op", "")
	require.NoError(t, err)
	n, err = e.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	q, err := s.GetRun(ctx, "queued")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_CANCELLED, q.GetState())
	r, err := s.GetRun(ctx, "running")
	require.NoError(t, err)
	require.Equal(t, "pending", r.GetCancellation().GetDispatchState(), "the driver interrupts the turn")
	for _, run := range []*executorv1.Run{q, r} {
		require.True(t, strings.HasPrefix(run.GetCancellation().GetReason(), failure.BudgetExhausted+":"), run.GetCancellation().GetReason())
	}
	n, err = e.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to cancel")
}

// TestQ2_AnExhaustedCompanyStartsNothingUntilItsBudgetIsRaisedOrANewMonth:
// under finish_turn, once acme's spend reached its budget the sweep blocks
// it: its queued run is not claimed; raising the budget unblocks it (the
// run is claimed); exhausted again, it is blocked again, and the next
// month (the sweep's clock) unblocks it.
func TestQ2_AnExhaustedCompanyStartsNothingUntilItsBudgetIsRaisedOrANewMonth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := store.Open(ctx, pgtest.NewDB(t, migrator), runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	limit := func(usd float64) {
		_, err := s.SetCompanyLimits(ctx, store.CompanyLimits{Company: "acme", Weight: 1, MonthlyBudgetUSD: &usd, BudgetWarnRatio: 0.8,
			BudgetPolicy: store.BudgetPolicyFinishTurn}, "op", "")
		require.NoError(t, err)
	}
	limit(1)
	_, c, _, err := s.SubmitClaim(ctx, "paid", input("paid"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	_, err = s.Submit(ctx, "waiting", input("paid"))
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{terminal("paid", 1.2)})
	require.NoError(t, err)
	now := time.Now()
	s.SetClock(func() time.Time { return now })
	e := &budget.Enforcer{Store: s}
	_, err = e.Sweep(ctx)
	require.NoError(t, err)
	got, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, got, "an exhausted company starts nothing")

	limit(2)
	_, err = e.Sweep(ctx)
	require.NoError(t, err)
	got, err = s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.NotNil(t, got, "a raised budget lets the queued run start")
	require.Equal(t, "waiting", got.RunID)
	_, err = s.Submit(ctx, "third", input("paid"))
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, got.Fence, []*prpv1.Event{terminal("waiting", 1)})
	require.NoError(t, err)
	_, err = e.Sweep(ctx)
	require.NoError(t, err)
	w, err := s.GetRun(ctx, "waiting")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, w.GetState())
	got, err = s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, got, "exhausted again")
	now = store.MonthOf(now).AddDate(0, 1, 0)
	_, err = e.Sweep(ctx)
	require.NoError(t, err)
	got, err = s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.NotNil(t, got, "a new month lets it run")
	require.Equal(t, "third", got.RunID)
}

// TestQ2_ABudgetLoweredUnderTheSpendIsRecordedOnceByTheSweep: acme spent
// 1.2 USD of a 10 USD budget (no threshold crossed). Lowered to 1.4 USD,
// the month's spend is over the warn ratio: the sweep records
// budget.warning, as a settlement crossing it would; lowered to 1 USD, it
// records budget.exhausted and blocks acme. Sweeps of two replicas again,
// and a later settlement, record nothing more.
func TestQ2_ABudgetLoweredUnderTheSpendIsRecordedOnceByTheSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, migrator)
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	other, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(other.Close)
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	limit := func(usd float64) {
		_, err := s.SetCompanyLimits(ctx, store.CompanyLimits{Company: "acme", Weight: 1, MonthlyBudgetUSD: &usd, BudgetWarnRatio: 0.8,
			BudgetPolicy: store.BudgetPolicyFinishTurn}, "op", "")
		require.NoError(t, err)
	}
	actions := func() map[string]int {
		acts, err := s.OperatorActions(ctx, "acme")
		require.NoError(t, err)
		out := map[string]int{}
		for _, a := range acts {
			if strings.HasPrefix(a.Action, "budget.") {
				out[a.Action]++
			}
		}
		return out
	}
	sweeps := []*budget.Enforcer{{Store: s}, {Store: other}}
	sweep := func() {
		for _, e := range sweeps {
			_, err := e.Sweep(ctx)
			require.NoError(t, err)
		}
	}
	limit(10)
	_, c, _, err := s.SubmitClaim(ctx, "paid", input("paid"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{terminal("paid", 1.2)})
	require.NoError(t, err)
	_, err = s.Submit(ctx, "waiting", input("waiting"))
	require.NoError(t, err)
	sweep()
	require.Empty(t, actions())

	limit(1.4)
	sweep()
	require.Equal(t, map[string]int{"budget.warning": 1}, actions())
	limit(1)
	sweep()
	sweep()
	require.Equal(t, map[string]int{"budget.warning": 1, "budget.exhausted": 1}, actions())
	var warned, exhausted bool
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT warned_at IS NOT NULL, exhausted_at IS NOT NULL FROM executor.company_spend WHERE company_id = 'acme'`).
		Scan(&warned, &exhausted))
	require.True(t, warned && exhausted)
	_, err = s.Submit(ctx, "refused", input("refused"))
	require.EqualValues(t, failure.BudgetExhausted, failure.CodeOf(err))
	got, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, got, "the sweep blocked acme: its queued run does not start")

	// A run in flight settles over the budget: recorded already.
	limit(100)
	sweep()
	_, c, _, err = s.SubmitClaim(ctx, "late", input("late"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.NotNil(t, c)
	limit(1)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{terminal("late", 0.5)})
	require.NoError(t, err)
	sweep()
	require.Equal(t, map[string]int{"budget.warning": 1, "budget.exhausted": 1}, actions())
}
