package telemetry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func TestD3_EndpointURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:4317":            "http://127.0.0.1:4317",
		"localhost:4317":            "http://localhost:4317",
		"[::1]:4317":                "http://[::1]:4317",
		"collector:4317":            "https://collector:4317",
		"http://collector:4317":     "http://collector:4317",
		"https://otel.example:4317": "https://otel.example:4317",
	} {
		require.Equal(t, want, EndpointURL(in), in)
	}
}

// Without an endpoint nothing is installed: the global tracer provider
// stays the no-op one, so no span is recorded and nothing is exported.
func TestD3_TracingIsOffWithoutAnEndpoint(t *testing.T) {
	t.Setenv(EnvEndpoint, "")
	t.Setenv(EnvTracesEndpoint, "")
	require.False(t, Enabled(""))
	before := otel.GetTracerProvider()
	stop, err := Setup(context.Background(), "test", "", nil)
	require.NoError(t, err)
	require.NoError(t, stop(context.Background()))
	require.Equal(t, before, otel.GetTracerProvider())
	_, span := Tracer().Start(context.Background(), "x")
	require.False(t, span.IsRecording())
	require.True(t, Enabled("127.0.0.1:4317"))
}

// A command carries its trace context to the next process; a command
// without one starts nothing there, and propagation works with tracing off.
func TestD3_CommandTraceContextRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	require.Nil(t, Inject(context.Background()))
	cmd := &prpv1.Command{Type: "turn.start", RunId: "r", TraceContext: Inject(ctx)}
	require.Equal(t, "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01", cmd.GetTraceContext()["traceparent"])

	got, span := StartCommand(context.Background(), "runnerd", cmd)
	defer span.End()
	require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(got).TraceID())

	require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(WithTraceParent(context.Background(), TraceParent(ctx))).TraceID())
	require.False(t, trace.SpanContextFromContext(WithTraceParent(context.Background(), "")).IsValid())
	require.False(t, trace.SpanContextFromContext(WithTraceParent(context.Background(), "garbage")).IsValid())
}
