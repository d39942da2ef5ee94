package grpcx

import (
	"context"

	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// Unwrapped returns the call's own grpc-go stream, under the per-message
// wrappers of the server's stream interceptors, for a handler that sends
// many messages to many streams (WatchRun's fan-out): a message sent on it
// skips the message hooks (grpc_server_msg_sent_total, the logging
// interceptor's), which cost about a tenth of such a send. The call itself
// is still counted, logged, traced and recovered. Other streams (a server
// not built by New, a test's fake) come back as they are.
func Unwrapped(ss grpc.ServerStream) grpc.ServerStream {
	if f, _ := ss.Context().Value(callFieldsKey{}).(*callFields); f != nil && f.stream != nil {
		return f.stream
	}
	return ss
}

// payloadless passes every RPC event but the per-message payloads to the
// OpenTelemetry handler, which records nothing for those (message events
// are off) but looked its span up in the call's context for each message.
type payloadless struct{ stats.Handler }

func (h payloadless) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InPayload, *stats.OutPayload:
		return
	}
	h.Handler.HandleRPC(ctx, s)
}

// untracedProvider is the global tracer provider before any is installed:
// telemetry.Setup installs one only when an OTLP endpoint is configured.
var untracedProvider = otel.GetTracerProvider()

// untracedCalls is the server's OpenTelemetry handler h, but while no
// tracer provider is installed (no exporter: nothing records a span) a
// call's context gets only what otelgrpc's non-recording span carried
// there: the caller's trace context and baggage, extracted by the global
// propagator, so a log line still names the caller's trace (SPEC D6) and
// an outgoing call still propagates it. otelgrpc also parses the method
// name into attributes, starts the span, copies the incoming metadata and
// records its metrics (into the global meter provider, which tether never
// installs) on every call: ≈ 18 allocations and 1–2 % of the executor's CPU
// per SubmitRun under unary_submit.
type untracedCalls struct{ h stats.Handler }

func (u untracedCalls) tracing() bool { return otel.GetTracerProvider() != untracedProvider }

func (u untracedCalls) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if u.tracing() {
		return u.h.TagRPC(ctx, info)
	}
	return otel.GetTextMapPropagator().Extract(ctx, incomingCarrier{ctx})
}

func (u untracedCalls) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if u.tracing() {
		u.h.HandleRPC(ctx, s)
	}
}

func (u untracedCalls) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return u.h.TagConn(ctx, info)
}

func (u untracedCalls) HandleConn(ctx context.Context, s stats.ConnStats) { u.h.HandleConn(ctx, s) }

// incomingCarrier reads a call's incoming metadata for a propagator one key
// at a time, without copying the whole metadata.
type incomingCarrier struct{ ctx context.Context }

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (incomingCarrier) Set(string, string) {}

func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}
