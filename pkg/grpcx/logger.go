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

// getterIDs reads msg's run id and attempt through its GetRunId and
// GetAttempt methods, when it has them.
func getterIDs(msg any) (runID string, attempt uint64, hasAttempt bool) {
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
	return runID, attempt, hasAttempt
}

// extractIDs looks for GetRunId / GetAttempt methods on msg, then for fields
// named run_id, attempt and normalized_session_id in msg and its set
// sub-messages (breadth first, three levels), so that e.g. the first
// AttachRequest{open{run_id, fence{attempt}}} of a stream is covered.
//
// The walk is planned once per message type (idPlanFor: the candidate
// fields' paths in the order a breadth-first walk meets them) and then
// only those paths are probed, with no allocation: it runs on every call.
func extractIDs(msg any) (runID string, attempt uint64, hasAttempt bool, sessionID string) {
	runID, attempt, hasAttempt = getterIDs(msg)
	pm, ok := msg.(proto.Message)
	if !ok {
		return
	}
	m := pm.ProtoReflect()
	if !m.IsValid() {
		return
	}
	plan := idPlanFor(m.Descriptor())
	if runID == "" {
		for _, p := range plan.runID {
			if leaf, fd, ok := p.reach(m); ok {
				if v := leaf.Get(fd).String(); v != "" {
					runID = v
					break
				}
			}
		}
	}
	if !hasAttempt {
		for _, p := range plan.attempt {
			if leaf, fd, ok := p.reach(m); ok {
				if v := leaf.Get(fd); isUnsignedKind(fd.Kind()) {
					attempt = v.Uint()
				} else {
					attempt = uint64(v.Int())
				}
				hasAttempt = true
				break
			}
		}
	}
	for _, p := range plan.sessionID {
		if leaf, fd, ok := p.reach(m); ok {
			if v := leaf.Get(fd).String(); v != "" {
				sessionID = v
				break
			}
		}
	}
	return
}

// idPlan is where extractIDs looks in one message type: each id's candidate
// fields, in the order the breadth-first walk over the set fields meets them
// (level by level; within a level by the parent's order, then the fields'
// declaration order, a oneof's members where its first member is).
type idPlan struct {
	runID, attempt, sessionID []idPath
}

// idPath is a chain of singular message fields from the root, ending in
// the candidate scalar field.
type idPath []protoreflect.FieldDescriptor

// reach returns the message holding p's last field and that field, when
// every message on the way and the field itself are set.
func (p idPath) reach(m protoreflect.Message) (protoreflect.Message, protoreflect.FieldDescriptor, bool) {
	last := len(p) - 1
	for _, fd := range p[:last] {
		if !m.Has(fd) {
			return nil, nil, false
		}
		m = m.Get(fd).Message()
	}
	if !m.Has(p[last]) {
		return nil, nil, false
	}
	return m, p[last], true
}

var idPlans sync.Map // protoreflect.MessageDescriptor -> *idPlan

func idPlanFor(md protoreflect.MessageDescriptor) *idPlan {
	if p, ok := idPlans.Load(md); ok {
		return p.(*idPlan)
	}
	p := buildIDPlan(md)
	idPlans.Store(md, p)
	return p
}

// buildIDPlan walks md's fields three levels deep, breadth first, as the
// per-call walk did over a message's set fields.
func buildIDPlan(md protoreflect.MessageDescriptor) *idPlan {
	plan := &idPlan{}
	type node struct {
		md   protoreflect.MessageDescriptor
		path idPath
	}
	level := []node{{md: md}}
	for depth := 0; depth < 3 && len(level) > 0; depth++ {
		var next []node
		for _, n := range level {
			for _, fd := range rangeOrder(n.md) {
				if fd.IsList() || fd.IsMap() {
					continue
				}
				path := append(append(idPath(nil), n.path...), fd)
				switch {
				case fd.Kind() == protoreflect.MessageKind:
					next = append(next, node{md: fd.Message(), path: path})
				case fd.Name() == "run_id" && fd.Kind() == protoreflect.StringKind:
					plan.runID = append(plan.runID, path)
				case fd.Name() == "normalized_session_id" && fd.Kind() == protoreflect.StringKind:
					plan.sessionID = append(plan.sessionID, path)
				case fd.Name() == "attempt" && (isUnsignedKind(fd.Kind()) || isSignedKind(fd.Kind())):
					plan.attempt = append(plan.attempt, path)
				}
			}
		}
		level = next
	}
	return plan
}

// rangeOrder is md's fields in the order protoreflect's Range visits a
// generated message's set fields: declaration order, a (non-synthetic)
// oneof's members together where its first member is declared.
func rangeOrder(md protoreflect.MessageDescriptor) []protoreflect.FieldDescriptor {
	fds := md.Fields()
	out := make([]protoreflect.FieldDescriptor, 0, fds.Len())
	done := map[protoreflect.FullName]bool{}
	for i := 0; i < fds.Len(); i++ {
		fd := fds.Get(i)
		od := fd.ContainingOneof()
		if od == nil || od.IsSynthetic() {
			out = append(out, fd)
			continue
		}
		if done[od.FullName()] {
			continue
		}
		done[od.FullName()] = true
		for j := 0; j < od.Fields().Len(); j++ {
			out = append(out, od.Fields().Get(j))
		}
	}
	return out
}

func isUnsignedKind(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Uint64Kind, protoreflect.Uint32Kind, protoreflect.Fixed64Kind, protoreflect.Fixed32Kind:
		return true
	}
	return false
}

func isSignedKind(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int64Kind, protoreflect.Int32Kind, protoreflect.Sint64Kind, protoreflect.Sint32Kind, protoreflect.Sfixed64Kind, protoreflect.Sfixed32Kind:
		return true
	}
	return false
}
