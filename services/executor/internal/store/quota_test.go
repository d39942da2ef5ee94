package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func intp(n int) *int { return &n }

func setLimits(t *testing.T, s *store.Store, l store.CompanyLimits) {
	t.Helper()
	if l.Weight == 0 {
		l.Weight = 1
	}
	if l.BudgetWarnRatio == 0 {
		l.BudgetWarnRatio = 0.8
	}
	if l.BudgetPolicy == "" {
		l.BudgetPolicy = store.BudgetPolicyFinishTurn
	}
	_, err := s.SetCompanyLimits(context.Background(), l, "op:test", "test")
	require.NoError(t, err)
}

// requireRefused checks a refusal's reason and gRPC code.
func requireQuotaRefused(t *testing.T, err error, reason failure.Reason) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, reason, failure.CodeOf(err), "%v", err)
	require.Equal(t, codes.ResourceExhausted, status.Code(failure.ToStatus(err)))
}

// TestQ1_SubmitOverMaxQueuedRunsIsRefusedAndAResubmissionIsNot: with
// max_queued_runs 3, three runs queued behind a busy scope are admitted,
// the fourth is refused (quota_queued_runs, nothing stored), an
// idempotent resubmission of an admitted run is not refused, another
// company is not limited, and once a run starts a submission is admitted
// again.
func TestQ1_SubmitOverMaxQueuedRunsIsRefusedAndAResubmissionIsNot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	setLimits(t, s, store.CompanyLimits{Company: "acme", MaxQueuedRuns: intp(3)})
	for i := range 3 {
		created, err := s.Submit(ctx, fmt.Sprintf("q%d", i), input("busy", fmt.Sprint(i)))
		require.NoError(t, err)
		require.True(t, created)
	}
	_, err := s.Submit(ctx, "q3", input("busy", "3"))
	requireQuotaRefused(t, err, failure.QuotaQueuedRuns)
	_, err = s.GetRun(ctx, "q3")
	require.Error(t, err, "a refused submission stores nothing")
	created, err := s.Submit(ctx, "q1", input("busy", "1"))
	require.NoError(t, err, "a resubmission is never refused")
	require.False(t, created)
	// SubmitClaim (the executor's path) refuses alike.
	_, _, _, err = s.SubmitClaim(ctx, "q3", input("other", "3"), "o", time.Minute, store.Controller{Addr: "127.0.0.1:1"}, nil)
	requireQuotaRefused(t, err, failure.QuotaQueuedRuns)
	// Another company has the default's limits: none.
	other := input("busy", "x")
	other.Binding.CompanyId = "globex"
	_, err = s.Submit(ctx, "g1", other)
	require.NoError(t, err)
	// A run starts: one place is free.
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{Addr: "127.0.0.1:1"})
	require.NoError(t, err)
	require.NotNil(t, c)
	_, err = s.Submit(ctx, "q3", input("busy", "3"))
	require.NoError(t, err)
}

// TestQ1_WarmSessionsAreLimitedAndARunOfAnOpenSessionIsNot: with
// max_warm_sessions 2, two warm runs of two sessions are admitted, a
// third session is refused (quota_warm_sessions), another run of an open
// session is admitted, and so is a per-turn run.
func TestQ1_WarmSessionsAreLimitedAndARunOfAnOpenSessionIsNot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	setLimits(t, s, store.CompanyLimits{Company: "acme", MaxWarmSessions: intp(2)})
	_, err := s.Submit(ctx, "w1", input("s1", "a"))
	require.NoError(t, err)
	_, err = s.Submit(ctx, "w2", input("s2", "a"))
	require.NoError(t, err)
	_, err = s.Submit(ctx, "w3", input("s3", "a"))
	requireQuotaRefused(t, err, failure.QuotaWarmSessions)
	_, err = s.Submit(ctx, "w1b", input("s1", "b"))
	require.NoError(t, err, "a run of an open warm session opens none")
	eph := input("s3", "a")
	eph.Session.Lifecycle.Mode = prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN
	_, err = s.Submit(ctx, "e1", eph)
	require.NoError(t, err, "a per-turn run is not a warm session")
	u, err := s.CompanyUsage(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 2, u.WarmSessions)
	require.Equal(t, 4, u.QueuedRuns)
}

// TestQ1_ConcurrentSubmitsThroughTwoStoresNeverOvershoot races 40
// submissions of distinct runs through two stores (two pools, as two
// replicas) at max_queued_runs 7: exactly 7 are admitted.
func TestQ1_ConcurrentSubmitsThroughTwoStoresNeverOvershoot(t *testing.T) {
	t.Parallel()
	a := newStore(t)
	b2, err := store.Open(context.Background(), a.Pool().Config().ConnString(), runrules.New())
	require.NoError(t, err)
	t.Cleanup(b2.Close)
	setLimits(t, a, store.CompanyLimits{Company: "acme", MaxQueuedRuns: intp(7)})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := a
			if i%2 == 1 {
				st = b2
			}
			_, err := st.Submit(context.Background(), fmt.Sprintf("r%d", i), input("busy", fmt.Sprint(i)))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted++
				return
			}
			if failure.CodeOf(err) != failure.QuotaQueuedRuns {
				t.Errorf("submission %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 7, admitted)
	u, err := a.CompanyUsage(context.Background(), "acme")
	require.NoError(t, err)
	require.Equal(t, 7, u.QueuedRuns)
}
