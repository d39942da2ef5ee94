package runner

import (
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// appendEnvelope appends ev's compact protojson encoding — byte for byte
// what protojson.Marshal and json.Compact make of it (fields in their
// declaration order, a Struct's keys sorted, protojson's string escapes
// and number format) — without protojson's reflection and the second pass
// of the compaction. ok is false for what it does not write the same way
// (a string that is not valid UTF-8, a number that is not finite, a value
// of no kind, a timestamp out of range): the caller then encodes with
// protojson, which reports such an event as unencodable.
func appendEnvelope(b []byte, ev *prpv1.Event) (_ []byte, ok bool) {
	e := envWriter{b: append(b, '{'), ok: true}
	e.str("schema", ev.GetSchema())
	e.str("sourceInstanceId", ev.GetSourceInstanceId())
	e.str("sourceEventId", ev.GetSourceEventId())
	if v := ev.GetSourceSeq(); v != 0 {
		e.name("sourceSeq")
		e.b = append(e.b, '"')
		e.b = strconv.AppendUint(e.b, v, 10)
		e.b = append(e.b, '"')
	}
	e.str("sourceKind", ev.GetSourceKind())
	e.str("runId", ev.GetRunId())
	e.str("normalizedSessionId", ev.GetNormalizedSessionId())
	e.str("turnId", ev.GetTurnId())
	e.str("itemId", ev.GetItemId())
	e.str("eventType", ev.GetEventType())
	e.uint("schemaVersion", ev.GetSchemaVersion())
	e.uint("priority", ev.GetPriority())
	if ts := ev.GetEmittedAt(); ts != nil {
		e.name("emittedAt")
		e.timestamp(ts.GetSeconds(), ts.GetNanos())
	}
	if p := ev.GetPayload(); p != nil {
		e.name("payload")
		e.object(p)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

type envWriter struct {
	b    []byte
	more bool // a field was written at this level
	ok   bool
}

func (e *envWriter) name(n string) {
	if e.more {
		e.b = append(e.b, ',')
	}
	e.more = true
	e.quote(n)
	e.b = append(e.b, ':')
}

// str writes a string field; proto3 leaves an empty one out.
func (e *envWriter) str(n, v string) {
	if v != "" {
		e.name(n)
		e.quote(v)
	}
}

func (e *envWriter) uint(n string, v uint32) {
	if v != 0 {
		e.name(n)
		e.b = strconv.AppendUint(e.b, uint64(v), 10)
	}
}

// quote writes s as protojson does: `"`, `\` and the control characters
// escaped, everything else as is.
func (e *envWriter) quote(s string) {
	if !utf8.ValidString(s) {
		e.ok = false
		return
	}
	e.b = append(e.b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		e.b = append(e.b, s[start:i]...)
		e.b = append(e.b, '\\')
		switch c {
		case '"', '\\':
			e.b = append(e.b, c)
		case '\b':
			e.b = append(e.b, 'b')
		case '\f':
			e.b = append(e.b, 'f')
		case '\n':
			e.b = append(e.b, 'n')
		case '\r':
			e.b = append(e.b, 'r')
		case '\t':
			e.b = append(e.b, 't')
		default:
			const hex = "0123456789abcdef"
			e.b = append(e.b, 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	e.b = append(e.b, s[start:]...)
	e.b = append(e.b, '"')
}

// timestamp writes RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
func (e *envWriter) timestamp(secs int64, nanos int32) {
	const minSecs, maxSecs = -62135596800, 253402300799 // 0001-01-01, 9999-12-31
	if secs < minSecs || secs > maxSecs || nanos < 0 || nanos >= 1e9 {
		e.ok = false
		return
	}
	t := time.Unix(secs, int64(nanos)).UTC()
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, "2006-01-02T15:04:05")
	switch {
	case nanos == 0:
	case nanos%1e6 == 0:
		e.b = append(e.b, '.')
		e.b = appendDigits(e.b, int(nanos/1e6), 3)
	case nanos%1e3 == 0:
		e.b = append(e.b, '.')
		e.b = appendDigits(e.b, int(nanos/1e3), 6)
	default:
		e.b = append(e.b, '.')
		e.b = appendDigits(e.b, int(nanos), 9)
	}
	e.b = append(e.b, 'Z', '"')
}

func appendDigits(b []byte, v, n int) []byte {
	var d [9]byte
	for i := n - 1; i >= 0; i-- {
		d[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, d[:n]...)
}

// object writes a Struct: its keys sorted (as protojson writes a map).
func (e *envWriter) object(s *structpb.Struct) {
	f := s.GetFields()
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.b = append(e.b, '{')
	e.more = false
	for _, k := range keys {
		e.name(k)
		e.value(f[k])
	}
	e.b = append(e.b, '}')
	e.more = true
}

func (e *envWriter) value(v *structpb.Value) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		e.b = append(e.b, "null"...)
	case *structpb.Value_BoolValue:
		e.b = strconv.AppendBool(e.b, k.BoolValue)
	case *structpb.Value_StringValue:
		e.quote(k.StringValue)
	case *structpb.Value_NumberValue:
		e.number(k.NumberValue)
	case *structpb.Value_StructValue:
		if k.StructValue == nil {
			e.ok = false
			return
		}
		e.object(k.StructValue)
	case *structpb.Value_ListValue:
		if k.ListValue == nil {
			e.ok = false
			return
		}
		e.b = append(e.b, '[')
		for i, x := range k.ListValue.GetValues() {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.value(x)
		}
		e.b = append(e.b, ']')
	default: // no kind: protojson refuses it
		e.ok = false
	}
}

// number writes a finite float64 as protojson (and encoding/json) does.
func (e *envWriter) number(n float64) {
	if math.IsNaN(n) || math.IsInf(n, 0) {
		e.ok = false
		return
	}
	format := byte('f')
	if a := math.Abs(n); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	e.b = strconv.AppendFloat(e.b, n, format, -1, 64)
	if format == 'e' {
		// 1e-07 → 1e-7
		if l := len(e.b); l >= 4 && e.b[l-4] == 'e' && e.b[l-3] == '-' && e.b[l-2] == '0' {
			e.b[l-2] = e.b[l-1]
			e.b = e.b[:l-1]
		}
	}
}
