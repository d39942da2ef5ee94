package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// recordedSpan is one span an OTLP exporter sent to spanRecorder.
type recordedSpan struct {
	service, name             string
	traceID, spanID, parentID string
}

// spanRecorder is an OTLP/gRPC trace receiver on loopback that keeps every
// span it is sent, with the exporting process's service.name.
type spanRecorder struct {
	collectortracepb.UnimplementedTraceServiceServer
	addr string

	mu    sync.Mutex
	spans []recordedSpan
}

func newSpanRecorder(t *testing.T) *spanRecorder {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &spanRecorder{addr: lis.Addr().String()}
	gs := grpc.NewServer()
	collectortracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return r
}

func (r *spanRecorder) Export(_ context.Context, req *collectortracepb.ExportTraceServiceRequest) (*collectortracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, recordedSpan{service: service, name: sp.GetName(),
					traceID: hex.EncodeToString(sp.GetTraceId()), spanID: hex.EncodeToString(sp.GetSpanId()),
					parentID: hex.EncodeToString(sp.GetParentSpanId())})
			}
		}
	}
	return &collectortracepb.ExportTraceServiceResponse{}, nil
}

// trace returns the recorded spans of one trace by span id.
func (r *spanRecorder) trace(traceID string) map[string]recordedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]recordedSpan{}
	for _, s := range r.spans {
		if s.traceID == traceID {
			out[s.spanID] = s
		}
	}
	return out
}

// chain walks from the first span named name up its parents to the trace's
// root (or to the first parent that was not recorded).
func chain(spans map[string]recordedSpan, name string) []recordedSpan {
	var out []recordedSpan
	for _, s := range spans {
		if s.name != name {
			continue
		}
		for ok := true; ok; s, ok = spans[s.parentID] {
			out = append(out, s)
		}
		break
	}
	return out
}

// D3: with an OTLP endpoint configured, one trace spans the caller's
// SubmitRun, the executor's dispatch of the run, the gateway's Attach and
// relay, runnerd's turn.start and the provider call it makes — every
// process exporting to the same receiver, every parent link intact.
func TestD3_OneTraceSpansExecutorGatewayRunnerdAndTheProviderCall(t *testing.T) {
	t.Parallel()
	rec := newSpanRecorder(t)
	h := newHarness(t, stack.Options{Env: []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + rec.addr,
		"OTEL_BSP_SCHEDULE_DELAY=50", // export within 50 ms, not 5 s
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The caller's own (remote, sampled) span is the trace's root.
	root := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	in := h.submitInput("traced", "trace this turn")
	_, err := h.client.SubmitRun(trace.ContextWithSpanContext(ctx, root), &executorv1.SubmitRunRequest{RunId: "traced", Input: in})
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.waitTerminal(ctx, "traced").GetState())

	traceID := root.TraceID().String()
	var path []recordedSpan
	require.Eventually(t, func() bool {
		spans := rec.trace(traceID)
		path = chain(spans, "provider turn/start")
		return len(path) > 0 && path[len(path)-1].parentID == root.SpanID().String()
	}, time.Minute, 50*time.Millisecond, "the provider call's span does not lead back to the caller's span: %+v", rec.trace(traceID))

	var hops []string
	for _, s := range path {
		hops = append(hops, s.service+": "+s.name)
	}
	t.Logf("trace %s, provider call up to the caller:\n  %v", traceID, hops)
	// Child to root: the provider call, runnerd's command, the gateway's
	// relay inside its Attach, the executor's Attach call inside its drive
	// of the run, the SubmitRun that stored the trace context.
	require.Equal(t, []string{
		"runnerd: provider turn/start",
		"runnerd: runnerd turn.start",
		"runnergw: runnergw turn.start",
		"runnergw: tether.gateway.v1.RunnerGateway/Attach",
		"executor: tether.gateway.v1.RunnerGateway/Attach",
		"executor: executor drive",
		"executor: tether.executor.v1.ExecutorService/SubmitRun",
	}, hops)
}

// scrapeValues reads a /metrics page into "name{label="value",...}" →
// value (histograms as their _count and _sum).
func scrapeValues(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(scrape(t, "http://"+addr+"/metrics")))
	require.NoError(t, err)
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// D3: the executor's domain metrics, scraped from a real executor's
// /metrics, move as runs go: a run queued behind its session's active run,
// claims, lease renewals and their latency, active runs, cancellations
// dispatched and acknowledged — and gRPC server metrics from the
// go-grpc-middleware provider.
func TestD3_ExecutorMetricsMoveAsRunsGo(t *testing.T) {
	t.Parallel()
	port, err := stack.FreePort()
	require.NoError(t, err)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	h := newHarness(t, stack.Options{
		LeaseTTL:     3 * time.Second,         // renewed every second
		FakeArgs:     []string{"--hold-turn"}, // a turn lasts until it is interrupted
		ExecutorArgs: []string{"-metrics-addr", metricsAddr},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	eventually := func(what string, ok func(m map[string]float64) bool) map[string]float64 {
		t.Helper()
		var m map[string]float64
		done := assert.Eventually(t, func() bool { m = scrapeValues(t, metricsAddr); return ok(m) }, time.Minute, 50*time.Millisecond)
		require.True(t, done, "%s; tether metrics: %v", what, tetherMetrics(m))
		return m
	}
	m := scrapeValues(t, metricsAddr)
	require.Zero(t, m["tether_executor_claims_total"])
	require.Zero(t, m["tether_executor_active_runs"])
	require.Zero(t, m[`tether_executor_queue_depth{phase="queued"}`])

	h.submit("m1", "metrics", "the first turn")
	h.waitForDelta(ctx, h.client, "m1")
	h.submit("m2", "metrics", "the second turn waits for the first") // same session: queued behind m1
	m = eventually("m1 driven, m2 queued, the lease renewed", func(m map[string]float64) bool {
		return m["tether_executor_claims_total"] == 1 && m["tether_executor_active_runs"] == 1 &&
			m[`tether_executor_queue_depth{phase="queued"}`] == 1 &&
			m[`tether_executor_lease_renewals_total{outcome="renewed"}`] >= 1 && m["tether_executor_lease_renewal_seconds_count"] >= 1
	})
	require.Positive(t, m["tether_executor_lease_renewal_seconds_sum"])
	require.Zero(t, m[`tether_executor_lease_renewals_total{outcome="lost"}`])
	require.Equal(t, 2.0, m[`grpc_server_handled_total{grpc_code="OK",grpc_method="SubmitRun",grpc_service="tether.executor.v1.ExecutorService",grpc_type="unary"}`])

	for i, id := range []string{"m1", "m2"} {
		_, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: id,
			Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "metrics test"})
		require.NoError(t, err)
		h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_CANCELLED)
		n := float64(i + 1)
		eventually("cancellation of "+id, func(m map[string]float64) bool {
			// m2 is claimed as soon as m1 ends.
			return m["tether_executor_claims_total"] == 2 && m[`tether_executor_queue_depth{phase="queued"}`] == 0 &&
				m[`tether_executor_cancellations_total{outcome="dispatched"}`] == n &&
				m[`tether_executor_cancellations_total{outcome="acknowledged"}`] == n
		})
		if id == "m1" {
			h.waitForDelta(ctx, h.client, "m2") // claimed once m1 ended
		}
	}
	eventually("no run active", func(m map[string]float64) bool { return m["tether_executor_active_runs"] == 0 })
}

func tetherMetrics(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "tether_") {
			out[k] = v
		}
	}
	return out
}
