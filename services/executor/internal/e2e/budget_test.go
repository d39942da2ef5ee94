package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
	"github.com/tether-run/tether/services/executor/internal/usage"
)

// Budgets through real processes (SPEC Q2). Only a provider that reports a
// USD cost makes a spend: the stacks here launch the fake ACP agent in its
// claude flavour as the gateways' pinned acpx-claude profile (as
// make test-providers launches the real claude-agent-acp), whose
// usage_update carries the session's cumulative cost in USD; runnerd
// reports each turn's own share of it, and the executor settles it.

// claudeStack is a stack of two executor replicas whose gateway launches the
// fake ACP agent (claude flavour, with agentArgs) for acpx-claude runs.
func claudeStack(t *testing.T, opts stack.Options, agentArgs ...string) *harness {
	t.Helper()
	args := append([]string{"-flavor", "claude", "-call-log", filepath.Join(t.TempDir(), "fake-acp-calls.log")}, agentArgs...)
	gw, err := stack.ProviderGatewayArgs("acpx-claude", filepath.Join(binDir, "fake-acp-agent"), args...)
	require.NoError(t, err)
	opts.GatewayArgs = append(opts.GatewayArgs, gw...)
	h := newHarness(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err = h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	h.waitFleet(ctx, "executor", "executor-2")
	return h
}

// claudeInput is a warm acpx-claude run of acme's session.
func claudeInput(h *harness, session, prompt string) *prpv1.ExecutionInput {
	in := h.submitInput(session, prompt)
	in.Provider = &prpv1.Provider{Kind: provenv.KindACPX, Agent: "claude", PermissionMode: "approve-all"}
	in.Session.DriverKind = provenv.DriverACPXRuntime
	return in
}

// setBudget gives acme a monthly budget (warning at 80 %, finish_turn).
func (h *harness) setBudget(ctx context.Context, usd float64) {
	h.t.Helper()
	_, err := h.companiesFor("executor").SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{
		Limits: &executorv1.CompanyLimits{CompanyId: "acme", MonthlyBudgetUsd: &usd}, Reason: "Q2"})
	require.NoError(h.t, err)
}

// terminalCost is the USD cost the run's run.terminal event reports (E1),
// read from its durable history, which must hold exactly one.
func (h *harness) terminalCost(ctx context.Context, runID string) float64 {
	h.t.Helper()
	var (
		cost      float64
		terminals int
	)
	for _, m := range h.watch(ctx, runID, 0, nil) {
		if m.GetEvent().GetEventType() != "run.terminal" {
			continue
		}
		terminals++
		u := m.GetEvent().GetPayload().GetFields()["usage"].GetStructValue()
		require.NotNil(h.t, u, "%s: its run.terminal reports usage", runID)
		c, ok := usage.CostUSD(u.AsMap())
		require.True(h.t, ok, "%s: its run.terminal reports a USD cost: %v", runID, u.AsMap())
		cost = c
	}
	require.Equal(h.t, 1, terminals, "%s has one run.terminal", runID)
	return cost
}

// spendRow is acme's executor.company_spend row of the current month, the
// spend as PostgreSQL's exact numeric text.
type spendRow struct {
	Spend             string
	Runs              int
	Warned, Exhausted bool
}

func (h *harness) spendRow(ctx context.Context) spendRow {
	h.t.Helper()
	var r spendRow
	require.NoError(h.t, h.store().Pool().QueryRow(ctx, `
SELECT spend_usd::text, runs, warned_at IS NOT NULL, exhausted_at IS NOT NULL FROM executor.company_spend
 WHERE company_id = 'acme' AND month = date_trunc('month', now() AT TIME ZONE 'UTC')::date`).Scan(&r.Spend, &r.Runs, &r.Warned, &r.Exhausted))
	return r
}

// settledSum is the exact sum (numeric text) and number of acme's runs
// whose cost was settled into the current month.
func (h *harness) settledSum(ctx context.Context) (string, int) {
	h.t.Helper()
	var (
		sum string
		n   int
	)
	require.NoError(h.t, h.store().Pool().QueryRow(ctx, `
SELECT coalesce(sum(cost_usd), 0)::text, count(*) FROM executor.runs
 WHERE company_id = 'acme' AND spend_month = date_trunc('month', now() AT TIME ZONE 'UTC')::date`).Scan(&sum, &n))
	return sum, n
}

// budgetActions counts acme's budget.warning and budget.exhausted records.
func (h *harness) budgetActions(ctx context.Context) map[string]int {
	h.t.Helper()
	rows, err := h.store().Pool().Query(ctx, `SELECT action, count(*) FROM executor.operator_actions
 WHERE company_id = 'acme' AND action LIKE 'budget.%' GROUP BY action`)
	require.NoError(h.t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			a string
			n int
		)
		require.NoError(h.t, rows.Scan(&a, &n))
		out[a] = n
	}
	require.NoError(h.t, rows.Err())
	return out
}

// requireBudgetRefusal checks a refusal at the hard limit: ResourceExhausted,
// budget_exhausted, no RetryInfo (waiting does not help).
func requireBudgetRefusal(t *testing.T, id string, err error) {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%s: %v", id, err)
	require.EqualValues(t, failure.BudgetExhausted, failure.CodeOf(err), "%s: %v", id, err)
	for _, d := range st.Details() {
		_, retry := d.(*errdetails.RetryInfo)
		require.False(t, retry, "%s: a budget refusal has no RetryInfo", id)
	}
}

// waitSettledOrHeld waits until the run ended, or is queued while acme is
// budget_blocked (under finish_turn it then stays queued).
func (h *harness) waitSettledOrHeld(ctx context.Context, client executorv1.ExecutorServiceClient, runID string) *executorv1.Run {
	h.t.Helper()
	for {
		resp, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: runID})
		require.NoError(h.t, err)
		run := resp.GetRun()
		switch run.GetState() {
		case executorv1.RunState_RUN_STATE_SUCCEEDED, executorv1.RunState_RUN_STATE_FAILED, executorv1.RunState_RUN_STATE_CANCELLED:
			return run
		case executorv1.RunState_RUN_STATE_QUEUED:
			var blocked bool
			err := h.store().Pool().QueryRow(ctx, `SELECT coalesce((SELECT budget_blocked FROM executor.company_state WHERE company_id = 'acme'), false)`).Scan(&blocked)
			require.NoError(h.t, err)
			if blocked {
				return run
			}
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s did not end: %s", runID, run.GetState())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestQ2_TwoReplicasSettleRealCostsExactlyOnceAndAdmitNothingOnceTheBudgetIsExhausted:
// acme's runs on the fake claude agent report real USD costs. A probe run
// measures one turn's cost c; acme gets a budget of 8c. Six clients, three
// on each of two executor processes, each in its own warm session, submit
// runs one after another (the next once the last settled) until refused
// three times. Then, from the database:
//   - the month's spend equals exactly (numeric) the sum of the settled
//     runs' cost_usd, and the sum of the costs their run.terminal events
//     report; every run has one run.terminal; both replicas settled runs;
//   - budget.warning and budget.exhausted are each recorded once;
//   - no overshoot: no submission answered after the first budget_exhausted
//     refusal (on either replica) began after it was admitted — once a
//     refusal was seen, every later submission everywhere is refused —, and
//     once the exhaustion is committed (seen in the database at T), 20
//     submissions racing on both replicas are all refused and no run of
//     acme was stored by a transaction begun after T; the spend exceeds
//     the budget only by the runs admitted before the exhaustion;
//   - every refusal is counted (company_refusals), and both replicas'
//     GetCompanyUsage show the same spend, exhausted.
func TestQ2_TwoReplicasSettleRealCostsExactlyOnceAndAdmitNothingOnceTheBudgetIsExhausted(t *testing.T) {
	t.Parallel()
	h := claudeStack(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	clients := []executorv1.ExecutorServiceClient{h.client, h.clientFor("executor-2")}

	const prompt = "a budgeted turn of four words"
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "q2-probe", Input: claudeInput(h, "q2-probe", prompt)})
	require.NoError(t, err)
	probe := h.waitState(ctx, h.client, "q2-probe", executorv1.RunState_RUN_STATE_SUCCEEDED)
	c := probe.GetResult().GetCostUsd()
	require.Positive(t, c, "the claude agent's turn has a USD cost")
	budget := 8 * c
	h.setBudget(ctx, budget)

	type answer struct {
		id         string
		start, end time.Time
		err        error
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []answer
	)
	const workers = 6
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := clients[w%2]
			refusals := 0
			for k := 0; refusals < 3 && k < 40; k++ {
				id := fmt.Sprintf("q2-%d-%d", w, k)
				a := answer{id: id, start: time.Now()}
				_, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: claudeInput(h, fmt.Sprintf("q2-session-%d", w), prompt)})
				a.end, a.err = time.Now(), err
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
				if err != nil {
					refusals++
					continue
				}
				h.waitSettledOrHeld(ctx, client, id)
			}
		}()
	}
	wg.Wait()

	// No overshoot, as the clients saw it.
	var firstRefusal time.Time
	admitted, refused := []string{"q2-probe"}, 0
	require.NotEmpty(t, answers)
	for _, a := range answers {
		if a.err != nil {
			requireBudgetRefusal(t, a.id, a.err)
			refused++
			if firstRefusal.IsZero() || a.end.Before(firstRefusal) {
				firstRefusal = a.end
			}
		}
	}
	require.Equal(t, 3*workers, refused, "every client was refused in the end")
	for _, a := range answers {
		if a.err == nil {
			admitted = append(admitted, a.id)
			require.True(t, a.start.Before(firstRefusal), "%s was admitted though submitted after a budget_exhausted refusal", a.id)
		}
	}

	// Exactly once, from the durable history.
	var (
		eventSum float64
		owners   = map[string]int{}
		settled  int
	)
	for _, id := range admitted {
		run := h.get(id)
		if run.GetState() == executorv1.RunState_RUN_STATE_QUEUED {
			continue // admitted before the exhaustion, held by finish_turn
		}
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%s: %v", id, run.GetFailure())
		cost := h.terminalCost(ctx, id)
		require.InDelta(t, cost, run.GetResult().GetCostUsd(), 1e-12, id)
		eventSum += cost
		owners[run.GetLeaseOwner()]++
		settled++
	}
	row := h.spendRow(ctx)
	sum, n := h.settledSum(ctx)
	t.Logf("budget %.6f USD (8 turns of %.6f): %d runs admitted, %d settled %v, %d refusals; spend %s USD", budget, c, len(admitted), settled, owners, refused, row.Spend)
	require.Equal(t, sum, row.Spend, "the month's spend is exactly the sum of the settled runs' costs")
	require.Equal(t, settled, n)
	require.Equal(t, settled, row.Runs, "each settled run counted once")
	require.InDelta(t, eventSum, h.usageOn(ctx, "executor").GetSpendUsd(), 1e-9, "the spend is what the run.terminal events report")
	require.Positive(t, owners["executor"], "the replica executor settled runs: %v", owners)
	require.Positive(t, owners["executor-2"], "the replica executor-2 settled runs: %v", owners)
	require.True(t, row.Warned && row.Exhausted)
	require.Equal(t, map[string]int{"budget.warning": 1, "budget.exhausted": 1}, h.budgetActions(ctx))
	// finish_turn: the spend goes over the budget only by runs admitted
	// before the exhaustion, at most one in flight per client.
	require.Less(t, h.usageOn(ctx, "executor").GetSpendUsd(), budget+float64(workers)*2*c)

	// Once the exhaustion is committed, nothing is admitted on any replica.
	var exhaustedSeen time.Time
	require.NoError(t, h.store().Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&exhaustedSeen))
	var race sync.WaitGroup
	raced := make([]error, 20)
	for i := range raced {
		race.Add(1)
		go func() {
			defer race.Done()
			_, raced[i] = clients[i%2].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("q2-race-%d", i),
				Input: claudeInput(h, fmt.Sprintf("q2-race-%d", i), prompt)})
		}()
	}
	race.Wait()
	for i, err := range raced {
		require.Error(t, err, "q2-race-%d", i)
		requireBudgetRefusal(t, fmt.Sprintf("q2-race-%d", i), err)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM executor.runs WHERE company_id = 'acme' AND created_at >= $1`, exhaustedSeen),
		"no run stored by a transaction begun after the exhaustion was committed")
	require.Equal(t, len(admitted), h.count(`SELECT count(*) FROM executor.runs WHERE company_id = 'acme'`), "acme's runs are those admitted")
	require.Equal(t, refused+20, h.count(`SELECT refused FROM executor.company_refusals WHERE company_id = 'acme' AND reason = 'budget_exhausted'`))
	for _, name := range []string{"executor", "executor-2"} {
		u := h.usageOn(ctx, name)
		require.Equal(t, "exhausted", u.GetBudgetState(), name)
		require.InDelta(t, eventSum, u.GetSpendUsd(), 1e-9, name)
	}
}

// usageOn is acme's usage through the Companies API of replica name.
func (h *harness) usageOn(ctx context.Context, name string) *executorv1.CompanyUsage {
	h.t.Helper()
	resp, err := h.companiesFor(name).GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "acme"})
	require.NoError(h.t, err)
	return resp.GetUsage()
}

// TestQ2_ATakeoverMidTurnCountsTheRunsCostOnce: a run of the fake claude
// agent whose reply streams slowly is in its turn on one of two executor
// processes when that process is killed; the other replica takes the run
// over (attempt 2) and settles it. The run has one run.terminal, written by
// attempt 2, and acme's spend is exactly its cost, counted once. The killed
// replica, restarted, then settles the session's next run: the spend is
// exactly the two runs' costs.
func TestQ2_ATakeoverMidTurnCountsTheRunsCostOnce(t *testing.T) {
	t.Parallel()
	h := claudeStack(t, stack.Options{}, "-slow-delta-delay-ms", "1000")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h.setBudget(ctx, 1)
	clients := map[string]executorv1.ExecutorServiceClient{"executor": h.client, "executor-2": h.clientFor("executor-2")}

	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "q2-takeover", Input: claudeInput(h, "q2-takeover", "[slow] a turn taken over")})
	require.NoError(t, err)
	h.waitForDelta(ctx, h.client, "q2-takeover")
	owner := h.get("q2-takeover").GetLeaseOwner()
	successor := map[string]string{"executor": "executor-2", "executor-2": "executor"}[owner]
	require.NotEmpty(t, successor, "owner %q", owner)
	h.st.Proc(owner).Kill() // mid-turn
	h.client = clients[successor]

	run := h.waitState(ctx, h.client, "q2-takeover", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 2, run.GetAttempt(), "taken over once")
	require.Equal(t, successor, run.GetLeaseOwner())
	require.Equal(t, "ECHO: [slow] a turn taken over", run.GetResult().GetFinalMessage(), "the turn finished, not restarted")
	cost := h.terminalCost(ctx, "q2-takeover")
	require.Positive(t, cost)
	rows := h.eventRows(ctx, "q2-takeover")
	require.Equal(t, eventRow{Type: "run.terminal", Writer: 2}, rows[len(rows)-1], "settled by the successor's attempt")
	row := h.spendRow(ctx)
	sum, n := h.settledSum(ctx)
	require.Equal(t, 1, n)
	require.Equal(t, 1, row.Runs, "the run's cost is counted once")
	require.Equal(t, sum, row.Spend)
	require.InDelta(t, cost, run.GetResult().GetCostUsd(), 1e-12)

	// The killed replica comes back; the session's next run through it
	// adds its own cost only.
	_, err = h.st.Start(ctx, owner)
	require.NoError(t, err)
	back := clients[owner]
	_, err = back.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "q2-after", Input: claudeInput(h, "q2-takeover", "the next turn")})
	require.NoError(t, err)
	after := h.waitState(ctx, back, "q2-after", executorv1.RunState_RUN_STATE_SUCCEEDED)
	next := h.terminalCost(ctx, "q2-after")
	require.InDelta(t, next, after.GetResult().GetCostUsd(), 1e-12)
	row = h.spendRow(ctx)
	sum, n = h.settledSum(ctx)
	require.Equal(t, 2, n)
	require.Equal(t, 2, row.Runs)
	require.Equal(t, sum, row.Spend, "exactly the two runs' costs")
	require.InDelta(t, cost+next, h.usageOn(ctx, successor).GetSpendUsd(), 1e-9)
	require.Empty(t, h.budgetActions(ctx), "far under the budget")
}
