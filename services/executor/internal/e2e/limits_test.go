package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestQ1_TwoExecutorReplicasStartNoMoreRunsOfACompanyThanItsLimit: acme may
// have 2 runs in flight; 10 runs in 10 sessions are submitted at once
// through two executor replicas. Every run succeeds, each exactly once, and
// a sampler of the database never sees more than 2 of acme's runs in flight.
func TestQ1_TwoExecutorReplicasStartNoMoreRunsOfACompanyThanItsLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "10"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	h.waitFleet(ctx, "executor", "executor-2")
	db, err := pgx.Connect(ctx, h.dsn)
	require.NoError(t, err)
	defer db.Close(context.Background())
	const limit, runs = 2, 10
	_, err = db.Exec(ctx, `INSERT INTO executor.company_limits (company_id, max_running_runs, updated_by) VALUES ('acme', $1, 'test')`, limit)
	require.NoError(t, err)

	// The sampler counts acme's runs in flight until every run ended.
	sampled, done := make(chan int, 1), make(chan struct{})
	go func() {
		most := 0
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM executor.coordinators WHERE company_id = 'acme' AND phase = 'observed'`).Scan(&n); err == nil {
				most = max(most, n)
			}
			select {
			case <-done:
				sampled <- most
				return
			case <-tick.C:
			}
		}
	}()
	clients := []executorv1.ExecutorServiceClient{h.client, h.clientFor("executor-2")}
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := h.submitInput(fmt.Sprintf("limit-session-%d", i), fmt.Sprintf("limited turn %d: %s", i, slowTurn))
			_, err := clients[i%2].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("limit-%d", i), Input: in})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a run over the concurrency limit is queued, not refused")
	}
	owners := map[string]int{}
	for i := range runs {
		run := h.waitState(ctx, h.client, fmt.Sprintf("limit-%d", i), executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.EqualValues(t, 1, run.GetAttempt())
		owners[run.GetLeaseOwner()]++
	}
	close(done)
	most := <-sampled
	t.Logf("acme's runs in flight: at most %d (limit %d); runs per replica %v", most, limit, owners)
	require.LessOrEqual(t, most, limit)
	require.Equal(t, runs, countLines(t, h.st.CallLog(), "turn/start"), "each turn started once")
}
