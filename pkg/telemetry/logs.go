package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys of the trace a log line belongs to (SPEC D6).
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// LogHandler wraps h so that every record logged with a context that
// carries a span context (a traced request, or an untraced one whose caller
// sent a traceparent) gets trace_id and span_id attributes: a log line
// leads to its trace and back.
func LogHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

// LogArgs returns the trace_id / span_id key-value pairs of span's
// context (none when it has no valid one), for a logger kept beyond one
// call: log = log.With(telemetry.LogArgs(span)...).
func LogArgs(span trace.Span) []any {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return nil
	}
	return []any{LogTraceID, sc.TraceID().String(), LogSpanID, sc.SpanID().String()}
}
