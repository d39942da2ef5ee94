package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// companyIn is input of session in company.
func companyIn(company, session string) *prpv1.ExecutionInput {
	in := input(session, "turn in "+session)
	in.Binding.CompanyId = company
	return in
}

// submitHeads submits n runs of company, each in a session of its own (so
// each heads its scope and is due at once).
func submitHeads(t *testing.T, s *store.Store, company string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", company, i)
		_, created, err := s.SubmitRun(context.Background(), id, companyIn(company, id))
		require.NoError(t, err)
		require.True(t, created)
	}
}

// setClaimLimits writes the company's limits row (what tetherctl companies
// limits set stores); a nil maxRunning is no limit.
func setClaimLimits(t *testing.T, s *store.Store, company string, maxRunning *int, weight int) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `
INSERT INTO executor.company_limits (company_id, max_running_runs, weight, updated_by) VALUES ($1, $2, $3, 'test')
    ON CONFLICT (company_id) DO UPDATE SET max_running_runs = $2, weight = $3, updated_at = now()`, company, maxRunning, weight)
	require.NoError(t, err)
}

// claimCompanies claims n runs and counts them per company.
func claimCompanies(t *testing.T, s *store.Store, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		_, c := claimID(t, s)
		require.NotNil(t, c)
		got[c.Input.GetBinding().GetCompanyId()]++
	}
	return got
}

// running counts the company's runs in flight.
func running(t *testing.T, s *store.Store, company string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(context.Background(), `
SELECT count(*) FROM executor.coordinators WHERE company_id = $1 AND phase = 'observed'`, company).Scan(&n))
	return n
}

func TestQ3_FreeSlotsAreSharedInProportionToTheCompaniesWeights(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	submitHeads(t, s, "light", 40)
	submitHeads(t, s, "heavy", 40)
	setClaimLimits(t, s, "heavy", nil, 3)
	got := claimCompanies(t, s, 40)
	require.InDelta(t, 30, got["heavy"], 1, "weight 3 against 1: %v", got)
	require.InDelta(t, 10, got["light"], 1, "weight 3 against 1: %v", got)
	// Without weights, equal shares.
	setClaimLimits(t, s, "heavy", nil, 1)
	got = claimCompanies(t, s, 20)
	require.InDelta(t, 10, got["heavy"], 1, "equal weights: %v", got)
}

// seedHeads queues n due heads of company with set-based INSERTs (the
// submission's triggers run as for Submit), 1,000 a statement (each head
// takes its scope's advisory lock).
func seedHeads(t *testing.T, s *store.Store, company string, n int) {
	t.Helper()
	raw, err := proto.Marshal(companyIn(company, "seeded"))
	require.NoError(t, err)
	for lo := 1; lo <= n; lo += 1000 {
		_, err = s.Pool().Exec(context.Background(), `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
  SELECT $1 || g, $1, 'seeded', $1 || '-scope-' || g, 'LIFECYCLE_MODE_WARM', $4, 'seeded'
    FROM generate_series($2::int, $3::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq)
SELECT run_id, '', session_scope, submit_seq FROM r ORDER BY submit_seq`, company, lo, min(lo+999, n), raw)
		require.NoError(t, err)
	}
}

func TestQ3_AHugeBacklogOfOneCompanyDoesNotDelayAnotherCompanysNextRun(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	seedHeads(t, s, "hog", 20000)
	// The hog runs for a while alone: its virtual time runs ahead.
	got := claimCompanies(t, s, 10)
	require.Equal(t, map[string]int{"hog": 10}, got)
	// Another company's run, submitted after the 19,990 runs still queued,
	// is among the next two claims, and so is each of its next ones.
	for i := range 5 {
		id := fmt.Sprintf("small-%d", i)
		_, _, err := s.SubmitRun(context.Background(), id, companyIn("small", id))
		require.NoError(t, err)
		first, _ := claimID(t, s)
		second, _ := claimID(t, s)
		require.Contains(t, []string{first, second}, id, "run %d of the small company waited behind the backlog", i)
	}
	require.Equal(t, 20, running(t, s, "hog")+running(t, s, "small"))
}

func TestQ3_AWeightChangedLiveTakesEffectOnTheNextClaims(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	submitHeads(t, s, "a", 60)
	submitHeads(t, s, "b", 60)
	got := claimCompanies(t, s, 10)
	require.InDelta(t, 5, got["a"], 1, "equal weights: %v", got)
	// An operator raises b's weight: no restart, the next claims follow it.
	setClaimLimits(t, s, "b", nil, 4)
	got = claimCompanies(t, s, 20)
	require.InDelta(t, 16, got["b"], 1, "weight 4 against 1: %v", got)
	// And a default weight for every company without its own row.
	_, err := s.Pool().Exec(context.Background(), `DELETE FROM executor.company_limits WHERE company_id = 'b'`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(context.Background(), `UPDATE executor.company_limits SET weight = 2 WHERE company_id = '*'`)
	require.NoError(t, err)
	got = claimCompanies(t, s, 20)
	require.InDelta(t, 10, got["b"], 1, "the default weight for both: %v", got)
}

func TestQ1_ARunOverTheLimitStaysQueuedAndStartsWhenASlotFrees(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	two := 2
	setClaimLimits(t, s, "acme", &two, 1)
	queue(t, s, [2]string{"r1", "s1"}, [2]string{"r2", "s2"}, [2]string{"r3", "s3"})
	_, c1 := claimID(t, s)
	_, c2 := claimID(t, s)
	require.NotNil(t, c1)
	require.NotNil(t, c2)
	id, _ := claimID(t, s)
	require.Empty(t, id, "a third run of a company limited to 2 in flight")
	// SubmitClaim does not start one over the limit either.
	created, c, _, err := s.SubmitClaim(ctx, "r4", input("s4", "turn r4"), "owner", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.Nil(t, c)
	run, err := s.GetRun(ctx, "r3")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState(), "waiting, not failed")
	// Another company is not held back by acme's limit.
	submitHeads(t, s, "other", 1)
	id, _ = claimID(t, s)
	require.Equal(t, "other-0", id)
	// A run that ends frees a slot: the next one starts.
	endRun(t, s, c1)
	id, c3 := claimID(t, s)
	require.Equal(t, "r3", id)
	id, _ = claimID(t, s)
	require.Empty(t, id)
	// Raising the limit takes effect at once.
	three := 3
	setClaimLimits(t, s, "acme", &three, 1)
	id, _ = claimID(t, s)
	require.Equal(t, "r4", id)
	require.Equal(t, 3, running(t, s, "acme"))
	endRun(t, s, c3)
	require.Equal(t, 2, running(t, s, "acme"))
}

func TestQ1_ATakeoverOfAnExpiredLeaseIsNoNewSlot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	one := 1
	setClaimLimits(t, s, "acme", &one, 1)
	queue(t, s, [2]string{"r1", "s1"}, [2]string{"r2", "s2"})
	c, err := s.ClaimNext(ctx, "dead", time.Millisecond, ctl)
	require.NoError(t, err)
	require.Equal(t, "r1", c.RunID)
	// The lease lapses (its owner died): the takeover claims r1 again, not
	// r2, and the company still has one run in flight.
	require.Eventually(t, func() bool {
		c, err = s.ClaimNext(ctx, "successor", time.Minute, ctl)
		require.NoError(t, err)
		return c != nil
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, "r1", c.RunID)
	require.True(t, c.Expired)
	require.Equal(t, 1, running(t, s, "acme"))
}

func TestQ1_StoresOfTwoReplicasRacingClaimsNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	a := newStore(t)
	b, err := store.Open(context.Background(), a.Pool().Config().ConnString(), runrules.New())
	require.NoError(t, err)
	t.Cleanup(b.Close)
	const limit, runs = 3, 60
	lim := limit
	setClaimLimits(t, a, "acme", &lim, 1)
	submitHeads(t, a, "acme", runs)
	var (
		wg      sync.WaitGroup
		ended   atomic.Int64
		overrun atomic.Int64
		errs    = make(chan error, 4)
	)
	ctx := context.Background()
	for i, s := range []*store.Store{a, b, a, b} { // two claimers per replica
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- claimAndEnd(ctx, s, fmt.Sprintf("claimer-%d", i), limit, runs, &ended, &overrun)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, overrun.Load(), "runs in flight above the limit")
	require.Zero(t, running(t, a, "acme"))
}

// claimAndEnd claims runs of acme and ends each at once until runs ended,
// counting the claims after which acme had more than limit in flight.
func claimAndEnd(ctx context.Context, s *store.Store, owner string, limit int, runs int64, ended, overrun *atomic.Int64) error {
	for ended.Load() < runs {
		c, err := s.ClaimNext(ctx, owner, time.Minute, ctl)
		if err != nil {
			return err
		}
		if c == nil {
			continue
		}
		var observed int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.coordinators WHERE company_id = 'acme' AND phase = 'observed'`).Scan(&observed); err != nil {
			return err
		}
		if observed > limit {
			overrun.Add(1)
		}
		res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(c.RunID, "runner-"+c.RunID, 1, "run.terminal",
			map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"})})
		if err != nil {
			return err
		}
		if !res.Terminal {
			return fmt.Errorf("run %s did not end", c.RunID)
		}
		ended.Add(1)
	}
	return nil
}

func TestQ2_ACompanyBlockedByItsBudgetStartsNoRunUntilUnblocked(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	queue(t, s, [2]string{"r1", "s1"})
	block := func(blocked bool) {
		t.Helper()
		_, err := s.Pool().Exec(ctx, `UPDATE executor.company_state SET budget_blocked = $1 WHERE company_id = 'acme'`, blocked)
		require.NoError(t, err)
	}
	block(true)
	submitHeads(t, s, "other", 1)
	id, _ := claimID(t, s)
	require.Equal(t, "other-0", id, "another company is not held back")
	id, _ = claimID(t, s)
	require.Empty(t, id, "the blocked company's run is not claimed")
	created, c, _, err := s.SubmitClaim(ctx, "r2", input("s2", "turn r2"), "owner", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.Nil(t, c, "nor claimed in its submitting transaction")
	run, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState(), "waiting, not failed")
	// The budget is raised (or a month begins): its runs start again.
	block(false)
	id, _ = claimID(t, s)
	require.Equal(t, "r1", id)
	id, _ = claimID(t, s)
	require.Equal(t, "r2", id)
}
