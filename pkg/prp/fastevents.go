package prp

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Event batches are most of what crosses the runner WebSocket, and protojson
// (reflection over every field, google.protobuf.Struct payloads) dominated
// the gateway's CPU. transcodeEventBatch turns the shape runnerd writes —
// {"events":{"events":[<event>,...]}} with the event fields in their
// protojson (camelCase) spelling — straight into the protobuf encoding of
// the EventBatch, without building messages. It declines (ok=false)
// anything it does not fully understand — unknown or duplicate fields,
// proto field names, non-canonical numbers, null, odd timestamps — and the
// caller then uses protojson; when it accepts, the encoding decodes to
// exactly what protojson decodes (FuzzFastEventBatch checks this).

const batchPrefix = `{"events":{"events":[`

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) lit(w string) bool {
	s.ws()
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// hasControl reports whether b has a byte below 0x20 (not allowed
// unescaped in a JSON string), eight bytes at a time: a byte below 0x20
// borrows when 0x20 is subtracted from it, and only such a byte (or one
// above it in the same word, when some byte is) ends with its top bit set
// after the subtraction while it was clear before. It also reports whether
// b has a byte at or above 0x80 (UTF-8 to validate: an ASCII string, most
// deltas, skips that pass).
func hasControl(b []byte) (control, nonASCII bool) {
	const lows, highs = 0x2020202020202020, 0x8080808080808080
	var acc uint64
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		if (w-lows)&^w&highs != 0 {
			return true, false
		}
		acc |= w
		b = b[8:]
	}
	high := acc&highs != 0
	for _, c := range b {
		if c < 0x20 {
			return true, false
		}
		high = high || c >= 0x80
	}
	return false, high
}

// str reads a JSON string (valid UTF-8, no lone surrogates).
func (s *scanner) str() (string, bool) {
	b, ok := s.strBytes()
	return string(b), ok
}

// strBytes reads a JSON string: a view of the input when it has no
// escapes (the common case: no copy), else a fresh slice.
func (s *scanner) strBytes() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	start := s.i
	// Fast path: no escapes and no control characters up to the closing
	// quote (a long delta is one memchr and a word-at-a-time scan).
	if q := bytes.IndexByte(s.b[start:], '"'); q >= 0 {
		out := s.b[start : start+q : start+q]
		if bytes.IndexByte(out, '\\') < 0 {
			if control, nonASCII := hasControl(out); !control {
				s.i = start + q + 1
				if nonASCII && !utf8.Valid(out) {
					return nil, false
				}
				return out, true
			}
		}
	}
	buf := []byte(nil)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			if !utf8.Valid(buf) {
				return nil, false
			}
			return buf, true
		case c < 0x20:
			return nil, false
		case c != '\\':
			buf = append(buf, c)
			s.i++
			continue
		}
		s.i++
		if s.i >= len(s.b) {
			return nil, false
		}
		e := s.b[s.i]
		s.i++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return nil, false
			}
			if utf16.IsSurrogate(r) {
				if !s.lit(`\u`) {
					return nil, false
				}
				r2, ok := s.hex4()
				if !ok {
					return nil, false
				}
				r = utf16.DecodeRune(r, r2)
				if r == utf8.RuneError {
					return nil, false
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) hex4() (rune, bool) {
	if len(s.b)-s.i < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s.b[s.i:s.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	s.i += 4
	return rune(v), true
}

// number reads a JSON number token.
func (s *scanner) number() (string, bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	intStart := s.i
	if n := digits(); n == 0 || (n > 1 && s.b[intStart] == '0') {
		return "", false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return "", false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return "", false
		}
	}
	return string(s.b[start:s.i]), true
}

// canonicalUint accepts digits without a sign or leading zeros.
func canonicalUint(t string, bits int) (uint64, bool) {
	if t == "" || len(t) > 20 || (len(t) > 1 && t[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(t, 10, bits)
	return v, err == nil
}

// ---- protobuf wire output ----

// enc appends protobuf wire bytes.
type enc struct{ b []byte }

func (e *enc) varint(v uint64) {
	for v >= 0x80 {
		e.b = append(e.b, byte(v)|0x80)
		v >>= 7
	}
	e.b = append(e.b, byte(v))
}

func (e *enc) tag(field, wire int) { e.varint(uint64(field)<<3 | uint64(wire)) }

func (e *enc) bytesField(field int, v []byte) {
	e.tag(field, 2)
	e.varint(uint64(len(v)))
	e.b = append(e.b, v...)
}

// open starts a length-delimited field; close writes its length. Two bytes
// are reserved for the length varint, the size of every length from 128 B
// to 16 KiB: a large payload (a long delta) is then never moved to make
// its length fit; a shorter field moves back by one byte, a longer one
// forward.
func (e *enc) open(field int) int {
	e.tag(field, 2)
	e.b = append(e.b, 0, 0)
	return len(e.b)
}

func (e *enc) close(start int) {
	n := len(e.b) - start
	var l [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(l[:], uint64(n))
	switch {
	case k < 2:
		copy(e.b[start-1:], e.b[start:])
		e.b = e.b[:len(e.b)-1]
	case k > 2:
		e.b = append(e.b, l[:k-2]...) // room; overwritten below
		copy(e.b[start+k-2:], e.b[start:start+n])
	}
	copy(e.b[start-2:], l[:k])
}

// value transcodes one JSON value as a google.protobuf.Value (its fields,
// without the enclosing tag).
func (s *scanner) value(e *enc, depth int) bool {
	if depth > 64 {
		return false
	}
	switch c := s.peek(); {
	case c == '"':
		v, ok := s.strBytes()
		e.bytesField(3, v)
		return ok
	case c == '{':
		at := e.open(5)
		if !s.object(e, depth+1) {
			return false
		}
		e.close(at)
		return true
	case c == '[':
		s.i++
		at := e.open(6)
		if !s.eat(']') {
			for {
				v := e.open(1)
				if !s.value(e, depth+1) {
					return false
				}
				e.close(v)
				if s.eat(',') {
					continue
				}
				if !s.eat(']') {
					return false
				}
				break
			}
		}
		e.close(at)
		return true
	case c == 't':
		e.tag(4, 0)
		e.varint(1)
		return s.lit("true")
	case c == 'f':
		e.tag(4, 0)
		e.varint(0)
		return s.lit("false")
	case c == 'n':
		e.tag(1, 0)
		e.varint(0)
		return s.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		t, ok := s.number()
		if !ok {
			return false
		}
		f, err := strconv.ParseFloat(t, 64)
		if err != nil || math.IsInf(f, 0) {
			return false
		}
		e.tag(2, 1)
		e.b = binary.LittleEndian.AppendUint64(e.b, math.Float64bits(f))
		return true
	}
	return false
}

// object transcodes a JSON object as a google.protobuf.Struct (its fields).
// Duplicate keys are declined.
func (s *scanner) object(e *enc, depth int) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	var few [8][]byte // duplicate check without a map for small objects
	seen := few[:0]
	var many map[string]struct{}
	for {
		k, ok := s.strBytes()
		if !ok || !s.eat(':') {
			return false
		}
		if many != nil {
			if _, dup := many[string(k)]; dup {
				return false
			}
			many[string(k)] = struct{}{}
		} else {
			for _, x := range seen {
				if string(x) == string(k) {
					return false
				}
			}
			if len(seen) < cap(seen) {
				seen = append(seen, k)
			} else {
				many = make(map[string]struct{}, 2*len(seen))
				for _, x := range seen {
					many[string(x)] = struct{}{}
				}
				many[string(k)] = struct{}{}
			}
		}
		entry := e.open(1)
		e.bytesField(1, k)
		v := e.open(2)
		if !s.value(e, depth) {
			return false
		}
		e.close(v)
		e.close(entry)
		if s.eat(',') {
			continue
		}
		return s.eat('}')
	}
}

// timestamp accepts the RFC 3339 UTC form protojson writes:
// YYYY-MM-DDTHH:MM:SS[.fff|.ffffff|.fffffffff]Z.
func timestamp(t string) (time.Time, bool) {
	if len(t) < 20 || t[len(t)-1] != 'Z' || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' || t[16] != ':' {
		return time.Time{}, false
	}
	if frac := len(t) - 20; frac != 0 {
		if t[19] != '.' || (frac-1 != 3 && frac-1 != 6 && frac-1 != 9) {
			return time.Time{}, false
		}
	}
	for i := 0; i < len(t)-1; i++ {
		switch i {
		case 4, 7, 10, 13, 16, 19:
			continue
		}
		if t[i] < '0' || t[i] > '9' {
			return time.Time{}, false
		}
	}
	tm, err := time.Parse(time.RFC3339Nano, t)
	if err != nil || tm.Year() < 1 || tm.Year() > 9999 {
		return time.Time{}, false
	}
	return tm, true
}

// event transcodes one event object as a tether.prp.v1.Event (its fields).
func (s *scanner) event(e *enc) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	var seen uint32
	for {
		k, ok := s.strBytes()
		if !ok || !s.eat(':') {
			return false
		}
		bit, ok := s.field(e, k)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if s.eat(',') {
			continue
		}
		return s.eat('}')
	}
}

// eventStringField is the field number of a string field of
// tether.prp.v1.Event (proto/tether/prp/v1/event.proto), or 0.
func eventStringField(k []byte) int {
	switch string(k) {
	case "schema":
		return 1
	case "sourceInstanceId":
		return 2
	case "sourceEventId":
		return 3
	case "sourceKind":
		return 5
	case "runId":
		return 6
	case "normalizedSessionId":
		return 7
	case "turnId":
		return 8
	case "itemId":
		return 9
	case "eventType":
		return 10
	}
	return 0
}

// field transcodes one event field; it returns the field's bit.
func (s *scanner) field(e *enc, k []byte) (uint32, bool) {
	if num := eventStringField(k); num != 0 {
		v, ok := s.strBytes()
		if len(v) > 0 {
			e.bytesField(num, v)
		}
		return 1 << num, ok
	}
	switch string(k) {
	case "sourceSeq":
		var t string
		var ok bool
		if s.peek() == '"' {
			t, ok = s.str()
		} else {
			t, ok = s.number()
		}
		if !ok {
			return 0, false
		}
		v, ok := canonicalUint(t, 64)
		if v != 0 {
			e.tag(4, 0)
			e.varint(v)
		}
		return 1 << 4, ok
	case "schemaVersion", "priority":
		if s.peek() == '"' {
			return 0, false
		}
		t, ok := s.number()
		if !ok {
			return 0, false
		}
		v, ok := canonicalUint(t, 32)
		num := 11
		if string(k) == "priority" {
			num = 12
		}
		if v != 0 {
			e.tag(num, 0)
			e.varint(v)
		}
		return 1 << num, ok
	case "emittedAt":
		t, ok := s.str()
		if !ok {
			return 0, false
		}
		tm, ok := timestamp(t)
		if !ok {
			return 0, false
		}
		at := e.open(13)
		if sec := tm.Unix(); sec != 0 {
			e.tag(1, 0)
			e.varint(uint64(sec))
		}
		if ns := tm.Nanosecond(); ns != 0 {
			e.tag(2, 0)
			e.varint(uint64(ns))
		}
		e.close(at)
		return 1 << 13, true
	case "payload":
		at := e.open(14)
		if !s.object(e, 1) {
			return 0, false
		}
		e.close(at)
		return 1 << 14, true
	}
	return 0, false
}

// transcodeEventBatch turns an event batch frame into the protobuf wire
// encoding of its EventBatch, or declines.
func transcodeEventBatch(b []byte) ([]byte, bool) { return transcodeEventBatchInto(nil, b) }

// transcodeEventBatchInto is transcodeEventBatch appending to dst[:0] (a
// buffer a relay handed back), grown to the frame's size when smaller: the
// encoding is never longer than the JSON it comes from.
func transcodeEventBatchInto(dst, b []byte) ([]byte, bool) {
	if len(b) < len(batchPrefix) || string(b[:len(batchPrefix)]) != batchPrefix {
		return nil, false
	}
	if cap(dst) < len(b) {
		dst = make([]byte, 0, len(b))
	}
	s := &scanner{b: b, i: len(batchPrefix)}
	e := &enc{b: dst[:0]}
	if !s.eat(']') {
		for {
			at := e.open(1)
			if !s.event(e) {
				return nil, false
			}
			e.close(at)
			if s.eat(',') {
				continue
			}
			if !s.eat(']') {
				return nil, false
			}
			break
		}
	}
	for range 2 { // the events object's closing brace, then the frame's
		if !s.eat('}') {
			return nil, false
		}
	}
	s.ws()
	if s.i != len(s.b) {
		return nil, false
	}
	return e.b, true
}

// decodeEventBatch decodes an event batch frame through the transcoder, or
// declines.
func decodeEventBatch(b []byte) (*prpv1.Frame, bool) {
	raw, ok := transcodeEventBatch(b)
	if !ok {
		return nil, false
	}
	batch := &prpv1.EventBatch{}
	if err := proto.Unmarshal(raw, batch); err != nil {
		return nil, false
	}
	return &prpv1.Frame{Kind: &prpv1.Frame_Events{Events: batch}}, true
}

// relayBatch is an event batch carried as its protobuf encoding: the
// events are opaque (GetEvents is empty) but the batch marshals to exactly
// the decoded events' encoding, so a relay forwards it without building
// the event messages.
func relayBatch(raw []byte) *prpv1.EventBatch {
	batch := &prpv1.EventBatch{}
	batch.ProtoReflect().SetUnknown(raw)
	return batch
}

// relayBufs holds the encodings of relayed batches whose relay is done with
// them (ReleaseRelayBatch). A gateway relaying large events otherwise
// allocates a fresh frame-sized buffer per batch, and writing into fresh,
// cold (often just returned to the OS) memory cost more than the transcode
// itself at 4 KiB events.
var relayBufs sync.Pool // of *[]byte

// maxPooledRelayBuf bounds the buffers kept for reuse (a rare huge frame's
// buffer is left to the collector).
const maxPooledRelayBuf = 1 << 20

func relayBuf() []byte {
	if p, ok := relayBufs.Get().(*[]byte); ok {
		return *p
	}
	return nil
}

func putRelayBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledRelayBuf {
		return
	}
	b = b[:0]
	relayBufs.Put(&b)
}

// ReleaseRelayBatch hands the encoding of a batch that UnmarshalRelay
// returned back for reuse, once the relay has forwarded it (a gRPC Send
// has marshalled it into its own buffers when it returns). The batch must
// not be used afterwards; it is emptied. A batch that carries decoded
// events (not a relay batch) is left as it is.
func ReleaseRelayBatch(b *prpv1.EventBatch) {
	if b == nil || len(b.GetEvents()) > 0 {
		return
	}
	m := b.ProtoReflect()
	raw := m.GetUnknown()
	m.SetUnknown(nil)
	putRelayBuf(raw)
}
