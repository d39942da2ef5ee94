package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/stack"
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
