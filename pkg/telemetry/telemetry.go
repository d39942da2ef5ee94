// Package telemetry sets up OpenTelemetry tracing for a tether process and
// carries trace context where gRPC metadata cannot: in PRP command frames
// and in the executor's run rows (a run submitted now is driven later,
// perhaps by another replica).
//
// Tracing is off unless an OTLP endpoint is configured (the -otlp-endpoint
// flag, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
// then spans are batched and exported over OTLP/gRPC. Off, the W3C trace
// context is still propagated (a process without an exporter passes its
// caller's trace on), nothing is recorded and nothing touches the network.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Environment variables of the standard OTLP exporter configuration.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// Scope is the instrumentation scope of tether's own spans.
const Scope = "github.com/tether-run/tether"

var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

func init() {
	// Propagation is always on: it costs a header and lets a process
	// without an exporter keep its caller's trace whole.
	otel.SetTextMapPropagator(propagator)
}

// Enabled reports whether an OTLP endpoint is configured: endpoint (a
// flag's value) or the standard environment variables.
func Enabled(endpoint string) bool {
	return endpoint != "" || os.Getenv(EnvEndpoint) != "" || os.Getenv(EnvTracesEndpoint) != ""
}

// Setup installs the global tracer provider of the process named service
// when tracing is enabled (see Enabled) and returns the function that
// flushes and stops it; disabled, it installs nothing and the returned
// function does nothing. endpoint is a URL (http://host:4317 for
// plaintext, https:// for TLS) or host:port (plaintext on loopback, TLS
// elsewhere); empty defers to the OTEL_EXPORTER_OTLP_* environment.
func Setup(ctx context.Context, service, endpoint string, log *slog.Logger) (func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	if !Enabled(endpoint) {
		return noop, nil
	}
	var opts []otlptracegrpc.Option
	if endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpointURL(EndpointURL(endpoint)))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return noop, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	// The service name is the binary's: OTEL_SERVICE_NAME, when a
	// deployment sets one for every process, must not merge them.
	res, err := resource.Merge(resource.Environment(),
		resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		return noop, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	if log != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			log.Warn("telemetry export failed", "err", err)
		}))
	}
	return tp.Shutdown, nil
}

// EndpointURL normalises an endpoint flag value to a URL: a bare host:port
// gets http:// on loopback and https:// elsewhere.
func EndpointURL(endpoint string) string {
	if strings.Contains(endpoint, "://") {
		return endpoint
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		host = endpoint
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return (&url.URL{Scheme: "http", Host: endpoint}).String()
	}
	return (&url.URL{Scheme: "https", Host: endpoint}).String()
}

// Tracer is tether's tracer on the global provider.
func Tracer() trace.Tracer { return otel.Tracer(Scope) }

// Inject returns the trace context of ctx as a text map (W3C traceparent,
// tracestate, baggage); nil when ctx carries none.
func Inject(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c
}

// Extract returns ctx carrying the remote trace context of carrier (from
// Inject); an empty or malformed carrier leaves ctx as it is.
func Extract(ctx context.Context, carrier map[string]string) context.Context {
	if len(carrier) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(carrier))
}

// TraceParent is the W3C traceparent of ctx's span ("" without one), the
// form a trace context is stored in.
func TraceParent(ctx context.Context) string {
	return Inject(ctx)["traceparent"]
}

// WithTraceParent returns ctx carrying the remote parent traceparent (from
// TraceParent); "" leaves ctx as it is.
func WithTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return Extract(ctx, map[string]string{"traceparent": traceparent})
}

// Attribute keys of tether's spans.
const (
	AttrRunID       = attribute.Key("tether.run_id")
	AttrAttempt     = attribute.Key("tether.attempt")
	AttrCommandID   = attribute.Key("tether.command_id")
	AttrCommandType = attribute.Key("tether.command_type")
)

// StartCommand starts the span of a PRP command's handling in process
// (e.g. "runnergw", "runnerd"): named "<process> <command type>", a child
// of ctx's span or, when ctx has none, of the trace context the command
// carries.
func StartCommand(ctx context.Context, process string, c *prpv1.Command) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = Extract(ctx, c.GetTraceContext())
	}
	return Tracer().Start(ctx, process+" "+c.GetType(), trace.WithAttributes(
		AttrRunID.String(c.GetRunId()), AttrAttempt.Int64(int64(c.GetAttempt())),
		AttrCommandID.String(c.GetCommandId()), AttrCommandType.String(c.GetType())))
}

// End ends span, recording err (when not nil) as its error status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Environ is the OpenTelemetry part (OTEL_*) of this process's
// environment, for a child process that should export where this one does.
func Environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}
