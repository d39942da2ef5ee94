package grpcx

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// TestD6_ALogLineOfATracedCallNamesItsTrace: a call that arrives with a
// trace context (here the caller's; no exporter is installed) is logged
// with that trace's id, so an on-call engineer goes from a log line to its
// trace; a call without one carries no trace_id.
func TestD6_ALogLineOfATracedCallNamesItsTrace(t *testing.T) {
	h := startServer(t, nil)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	client := executorv1.NewExecutorServiceClient(h.conn)
	if _, err := client.GetRun(trace.ContextWithRemoteSpanContext(ctxT(t), sc), &executorv1.GetRunRequest{RunId: "traced-call"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "untraced-call"}); err != nil {
		t.Fatal(err)
	}
	h.stop(t)
	var traced, untraced string
	for _, line := range strings.Split(h.logs.String(), "\n") {
		switch {
		case strings.Contains(line, `"run_id":"traced-call"`):
			traced = line
		case strings.Contains(line, `"run_id":"untraced-call"`):
			untraced = line
		}
	}
	if !strings.Contains(traced, `"trace_id":"`+sc.TraceID().String()+`"`) || !strings.Contains(traced, `"span_id":"`) {
		t.Errorf("the traced call's log line lacks its trace: %s", traced)
	}
	if untraced == "" || strings.Contains(untraced, "trace_id") {
		t.Errorf("the untraced call's log line: %q", untraced)
	}
}

// TestD6_HealthChecksAndGatewayHeartbeatsGetNoSpans: the calls every probe
// and every gateway make all the time are not traced (they were 97 % of a
// compose stack's spans); every other call is.
func TestD6_HealthChecksAndGatewayHeartbeatsGetNoSpans(t *testing.T) {
	for _, tc := range []struct {
		method string
		traced bool
	}{
		{healthgrpc.Health_Check_FullMethodName, false},
		{healthgrpc.Health_Watch_FullMethodName, false},
		{executorv1.GatewayRegistry_RegisterGateway_FullMethodName, false},
		{executorv1.GatewayRegistry_ListGateways_FullMethodName, true},
		{executorv1.GatewayRegistry_DrainGateway_FullMethodName, true},
		{executorv1.ExecutorService_SubmitRun_FullMethodName, true},
		{"/tether.gateway.v1.RunnerGateway/Attach", true},
	} {
		if got := Traced(&stats.RPCTagInfo{FullMethodName: tc.method}); got != tc.traced {
			t.Errorf("Traced(%s) = %v, want %v", tc.method, got, tc.traced)
		}
	}
}
