package dispatch

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// refusingGateway fails every Attach with err.
type refusingGateway struct {
	gatewayv1.RunnerGatewayClient
	err error
}

func (g refusingGateway) Attach(context.Context, ...grpc.CallOption) (gatewayv1.RunnerGateway_AttachClient, error) {
	return nil, g.err
}

// D3: a takeover of an expired lease counts as a claim and a takeover; a
// transient failure counts as a retry under the code of what failed, a
// permanent one as a terminal failure; the queue depth is read at scrape
// time.
func TestD3_DispatcherMetricsCountClaimsTakeoversRetriesAndFailures(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for _, id := range []string{"expired", "transient", "waiting"} {
		_, _, err := s.SubmitRun(ctx, id, input("s-"+id))
		require.NoError(t, err)
	}
	// Another controller holds "expired" under a lease that has lapsed.
	c, err := s.ClaimRun(ctx, "expired", "gone", time.Second, store.Controller{}, nil, nil)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1`, c.RunID)
	require.NoError(t, err)
	// "waiting" is not due for a minute: it stays in the queue.
	_, err = s.Pool().Exec(ctx, `UPDATE executor.coordinators SET next_attempt_at = now() + interval '1 minute' WHERE run_id = 'waiting'`)
	require.NoError(t, err)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// run drives runs through gw until done reports true on d's metrics.
	run := func(gw gatewayv1.RunnerGatewayClient, reg prometheus.Registerer, done func(m *metrics) bool) *metrics {
		d := New(s, Config{Owner: "me", LeaseTTL: time.Minute, PollInterval: 10 * time.Millisecond, MaxAttachFailures: 1,
			Gateway: gw, Logger: quiet, Metrics: reg, NoSameHostTakeover: true})
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		go func() { defer close(stopped); _ = d.Run(rctx) }()
		require.Eventually(t, func() bool { return done(d.metrics) }, 10*time.Second, 10*time.Millisecond)
		cancel()
		<-stopped
		return d.metrics
	}
	// Permanent refusals: "expired" (taken over) and "transient" fail for good.
	m := run(refusingGateway{err: status.Error(codes.InvalidArgument, "no runner here")}, nil, func(m *metrics) bool {
		return testutil.ToFloat64(m.failures.WithLabelValues("runner_attach_failed")) == 2
	})
	require.Equal(t, 2.0, testutil.ToFloat64(m.claims))
	require.Equal(t, 1.0, testutil.ToFloat64(m.takeovers.WithLabelValues(takeoverLeaseExpired)))
	require.Equal(t, 0.0, testutil.ToFloat64(m.takeovers.WithLabelValues(takeoverControllerDead)))
	require.Equal(t, 0.0, testutil.ToFloat64(m.active))

	// A transient failure of a fresh run is retried later, counted under
	// the code of what failed.
	_, _, err = s.SubmitRun(ctx, "retried", input("s-retried"))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m = run(refusingGateway{err: status.Error(codes.Unavailable, "gateway restarting")}, reg, func(m *metrics) bool {
		return testutil.ToFloat64(m.retries.WithLabelValues("runner_attach_failed")) == 1
	})
	require.Equal(t, 1.0, testutil.ToFloat64(m.claims))
	require.Equal(t, 0.0, testutil.ToFloat64(m.failures.WithLabelValues("runner_attach_failed")))

	// The queue: "waiting" (queued, not yet due) and "retried" (waiting
	// for its next attempt), read from the database at scrape time.
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tether_executor_queue_depth `+queueDepthHelp+`
# TYPE tether_executor_queue_depth gauge
tether_executor_queue_depth{phase="queued"} 1
tether_executor_queue_depth{phase="retryable_failure"} 1
`), "tether_executor_queue_depth"))
}
