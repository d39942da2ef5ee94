package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

func (h *harness) companiesFor(name string) executorv1.CompaniesClient {
	conn, err := h.st.DialAs(h.st.Addr(name), stack.Operator)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return executorv1.NewCompaniesClient(conn)
}

// TestQ1_ConcurrentSubmitsThroughTwoExecutorsNeverOvershootMaxQueuedRuns
// sets max_queued_runs 5 through the Companies API of one executor
// process, holds a run of a session in its turn, and races 40 clients
// submitting runs of that session (they queue behind it) through two
// executor processes: exactly 5 are admitted, every other submission is
// ResourceExhausted quota_queued_runs with RetryInfo, GetCompanyUsage on
// the other replica counts 5 queued and 1 running, and an admitted run
// submitted again is not refused.
func TestQ1_ConcurrentSubmitsThroughTwoExecutorsNeverOvershootMaxQueuedRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("head", "busy", stalledTurn)
	h.waitForDelta(ctx, h.client, "head")
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	clients := []executorv1.ExecutorServiceClient{h.client, h.clientFor("executor-2")}

	five := int32(5)
	set, err := h.companiesFor("executor").SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{
		Limits: &executorv1.CompanyLimits{CompanyId: "acme", MaxQueuedRuns: &five}, Reason: "Q1 race"})
	require.NoError(t, err)
	require.Equal(t, int32(1), set.GetLimits().GetWeight(), "the defaults filled in")
	require.NotEmpty(t, set.GetLimits().GetUpdatedBy(), "the principal, audited")

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted []string
	)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("race-%d", i)
			_, err := clients[i%2].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: h.submitInput("busy", "queued")})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted = append(admitted, id)
				return
			}
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted || failure.CodeOf(err) != failure.QuotaQueuedRuns {
				t.Errorf("%s: %v", id, err)
			}
			hasRetry := false
			for _, d := range st.Details() {
				if _, ok := d.(*errdetails.RetryInfo); ok {
					hasRetry = true
				}
			}
			if !hasRetry {
				t.Errorf("%s: no RetryInfo in %v", id, st.Details())
			}
		}()
	}
	wg.Wait()
	require.Len(t, admitted, 5, "admitted: %v", admitted)

	usage, err := h.companiesFor("executor-2").GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "acme"})
	require.NoError(t, err)
	require.Equal(t, int64(5), usage.GetUsage().GetQueuedRuns())
	require.Equal(t, int64(1), usage.GetUsage().GetRunningRuns())
	require.Equal(t, int32(5), usage.GetUsage().GetLimits().GetMaxQueuedRuns())

	resp, err := clients[1].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: admitted[0], Input: h.submitInput("busy", "queued")})
	require.NoError(t, err, "a resubmission is never refused")
	require.False(t, resp.GetCreated())
	releaseStall(t, dir, "mid-stream")
	waitSucceeded(ctx, t, h.client, "head")
}

// TestQ4_TetherctlAndTheExecutorsMetricsShowACompanysUsage: tetherctl
// sets acme's limits on a real executor process and reads them back; with
// one run of acme in its turn and two queued behind it, `tetherctl
// companies usage` prints them against the limits, and the executor's
// /metrics has them under company="acme" (acme has its own limits).
func TestQ4_TetherctlAndTheExecutorsMetricsShowACompanysUsage(t *testing.T) {
	t.Parallel()
	port, err := stack.FreePort()
	require.NoError(t, err)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}, ExecutorArgs: []string{"-metrics-addr", metricsAddr}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := h.tetherctl(ctx, "companies", "limits", "set", "-company", "acme", "-max-queued-runs", "3", "-monthly-budget-usd", "10", "-reason", "Q4")
	require.Contains(t, out, "max queued runs    3")
	out = h.tetherctl(ctx, "companies", "limits", "get", "-company", "acme")
	require.Contains(t, out, "monthly budget     10 USD, warning at 80%, policy finish_turn")
	h.submit("q4-head", "busy", stalledTurn)
	h.waitForDelta(ctx, h.client, "q4-head")
	h.submit("q4-1", "busy", "queued")
	h.submit("q4-2", "busy", "queued")
	out = h.tetherctl(ctx, "companies", "usage", "-company", "acme")
	require.Contains(t, out, "running        1 / none")
	require.Contains(t, out, "queued         2 / 3")
	require.Contains(t, out, "USD (ok)")
	v := scrapeValues(t, metricsAddr)
	require.EqualValues(t, 2, v[`tether_company_runs{company="acme",state="queued"}`], "%v", v)
	require.EqualValues(t, 1, v[`tether_company_runs{company="acme",state="running"}`])
	releaseStall(t, dir, "mid-stream")
}

// TestQ1_AWarmSessionClosedWithoutSuspendStopsCountingAtOnce: with
// max_warm_sessions 1, acme's warm session "first" holds the only slot:
// a run of a second session is refused. CloseSession without suspend stops
// its runner and provider, and from then on "first" counts no more: the
// usage shows no warm session, and the second session's run is admitted
// and runs. A next run of "first" would open it again: it is refused now.
func TestQ1_AWarmSessionClosedWithoutSuspendStopsCountingAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	one := int32(1)
	_, err := h.companiesFor("executor").SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{
		Limits: &executorv1.CompanyLimits{CompanyId: "acme", MaxWarmSessions: &one}, Reason: "Q1 close"})
	require.NoError(t, err)
	h.submit("close-1", "first", "a warm turn")
	h.waitState(ctx, h.client, "close-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "close-2", Input: h.submitInput("second", "another session")})
	require.EqualValues(t, failure.QuotaWarmSessions, failure.CodeOf(err), "%v", err)

	closed, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "first", Reason: "done"})
	require.NoError(t, err)
	require.Len(t, closed.GetClosedRunnerInstanceIds(), 1)
	usage, err := h.companiesFor("executor").GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "acme"})
	require.NoError(t, err)
	require.Zero(t, usage.GetUsage().GetWarmSessions(), "a closed session is no warm session")

	h.submit("close-2", "second", "another session")
	h.waitState(ctx, h.client, "close-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "close-3", Input: h.submitInput("first", "reopen")})
	require.EqualValues(t, failure.QuotaWarmSessions, failure.CodeOf(err), "a next run of the closed session opens it again: %v", err)
}
