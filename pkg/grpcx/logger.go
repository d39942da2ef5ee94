package grpcx

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tether-run/tether/pkg/telemetry"
)

// ParseLevel parses debug|info|warn|warning|error (case-insensitive; "" is info).
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, fmt.Errorf("grpcx: unknown log level %q (want debug|info|warn|error)", s)
}

func checkFormat(format string) error {
	switch strings.ToLower(strings.TrimSpace(format)) {
	case "", "json", "text":
		return nil
	}
	return fmt.Errorf("grpcx: unknown log format %q (want json|text)", format)
}

// NewLogger returns a slog logger writing JSON (default) or text at level.
// Unknown values fall back to info / json; New validates them up front.
// Every string or error value is capped at MaxLogValueBytes (CapLogValue), so
// no request field makes a log line larger than that (SPEC T6).
func NewLogger(level, format string, w io.Writer) *slog.Logger {
	lvl, _ := ParseLevel(level)
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: capAttr}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if strings.EqualFold(strings.TrimSpace(format), "text") {
		h = slog.NewTextHandler(w, opts)
	}
	// A line logged in a traced call names its trace (SPEC D6).
	return slog.New(telemetry.LogHandler(h))
}

// MaxLogValueBytes caps one logged value; MaxLogIDBytes the request ids every
// call's log line carries (run_id, session_id).
const (
	MaxLogValueBytes = 8 << 10
	MaxLogIDBytes    = 256
)

// CapLogValue returns s as valid UTF-8 of at most n bytes (a cut value ends
// in "...(+N bytes)").
func CapLogValue(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...(+" + strconv.Itoa(len(s)-cut) + " bytes)"
}

func capAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); len(s) > MaxLogValueBytes || !utf8.ValidString(s) {
			a.Value = slog.StringValue(CapLogValue(s, MaxLogValueBytes))
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			if s := err.Error(); len(s) > MaxLogValueBytes {
				a.Value = slog.StringValue(CapLogValue(s, MaxLogValueBytes))
			}
		}
	}
	return a
}

// Call fields: run_id, attempt and session_id, taken from the request (unary)
// or the first received message (streams), kept in the call's context.

type callFieldsKey struct{}

type callFields struct {
	mu        sync.Mutex
	runID     string
	attempt   uint64
	hasAtt    bool
	sessionID string
	seen      bool

	stream grpc.ServerStream // a stream call's own, under the interceptors' wrappers (Unwrapped)
}

func (f *callFields) observe(msg any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen {
		return
	}
	f.seen = true
	f.runID, f.attempt, f.hasAtt, f.sessionID = extractIDs(msg)
	f.runID, f.sessionID = CapLogValue(f.runID, MaxLogIDBytes), CapLogValue(f.sessionID, MaxLogIDBytes)
}

func (f *callFields) args() []any {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []any
	if f.runID != "" {
		out = append(out, "run_id", f.runID)
	}
	if f.hasAtt {
		out = append(out, "attempt", f.attempt)
	}
	if f.sessionID != "" {
		out = append(out, "session_id", f.sessionID)
	}
	return out
}

// LogFields returns the run_id / attempt / session_id key-value pairs the
// server found in the current call's request, for handler log lines:
//
//	log.InfoContext(ctx, "claimed", grpcx.LogFields(ctx)...)
func LogFields(ctx context.Context) []any {
	f, _ := ctx.Value(callFieldsKey{}).(*callFields)
	return f.args()
}

type runIDGetter interface{ GetRunId() string }

// extractIDs looks for GetRunId / GetAttempt methods on msg, then for fields
// named run_id, attempt and normalized_session_id in msg and its set
// sub-messages (breadth first, three levels), so that e.g. the first
// AttachRequest{open{run_id, fence{attempt}}} of a stream is covered.
func extractIDs(msg any) (runID string, attempt uint64, hasAttempt bool, sessionID string) {
	if g, ok := msg.(runIDGetter); ok {
		runID = g.GetRunId()
	}
	switch g := msg.(type) {
	case interface{ GetAttempt() uint64 }:
		attempt, hasAttempt = g.GetAttempt(), true
	case interface{ GetAttempt() int64 }:
		attempt, hasAttempt = uint64(g.GetAttempt()), true
	case interface{ GetAttempt() uint32 }:
		attempt, hasAttempt = uint64(g.GetAttempt()), true
	case interface{ GetAttempt() int32 }:
		attempt, hasAttempt = uint64(g.GetAttempt()), true
	}
	pm, ok := msg.(proto.Message)
	if !ok {
		return
	}
	level := []protoreflect.Message{pm.ProtoReflect()}
	for depth := 0; depth < 3 && len(level) > 0; depth++ {
		var next []protoreflect.Message
		for _, m := range level {
			if !m.IsValid() {
				continue
			}
			m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
				if fd.IsList() || fd.IsMap() {
					return true
				}
				switch {
				case fd.Kind() == protoreflect.MessageKind:
					next = append(next, v.Message())
				case fd.Name() == "run_id" && fd.Kind() == protoreflect.StringKind && runID == "":
					runID = v.String()
				case fd.Name() == "normalized_session_id" && fd.Kind() == protoreflect.StringKind && sessionID == "":
					sessionID = v.String()
				case fd.Name() == "attempt" && !hasAttempt:
					switch fd.Kind() {
					case protoreflect.Uint64Kind, protoreflect.Uint32Kind, protoreflect.Fixed64Kind, protoreflect.Fixed32Kind:
						attempt, hasAttempt = v.Uint(), true
					case protoreflect.Int64Kind, protoreflect.Int32Kind, protoreflect.Sint64Kind, protoreflect.Sint32Kind, protoreflect.Sfixed64Kind, protoreflect.Sfixed32Kind:
						attempt, hasAttempt = uint64(v.Int()), true
					}
				}
				return true
			})
		}
		level = next
	}
	return
}
