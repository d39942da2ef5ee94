package runner

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// randomString draws from what needs escaping, multi-byte runes and plain
// text.
func randomString(r *rand.Rand) string {
	parts := []string{"", "a", "hello world", `"`, `\`, "\n", "\t", "\r", "\b", "\f", "\x00", "\x01", "\x1f", "\x7f",
		"é", "日本", "\u2028", "\u2029", "\ufffd", "<>&", "🙂", "/", "'", "{}", "[1,2]"}
	var sb strings.Builder
	for range r.IntN(6) {
		sb.WriteString(parts[r.IntN(len(parts))])
	}
	return sb.String()
}

func randomNumber(r *rand.Rand) float64 {
	nums := []float64{0, math.Copysign(0, -1), 1, -1, 42, 1.5, -2.25, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 1.5e300, -1e-300,
		123456789012345678, 0.1, 1.0 / 3, math.MaxFloat64, math.SmallestNonzeroFloat64, 1 << 53}
	if r.IntN(2) == 0 {
		return nums[r.IntN(len(nums))]
	}
	return (r.Float64() - 0.5) * math.Pow(10, float64(r.IntN(60)-30))
}

func randomValue(r *rand.Rand, depth int) *structpb.Value {
	switch n := r.IntN(6); {
	case n == 0:
		return structpb.NewNullValue()
	case n == 1:
		return structpb.NewBoolValue(r.IntN(2) == 0)
	case n == 2:
		return structpb.NewStringValue(randomString(r))
	case n == 3:
		return structpb.NewNumberValue(randomNumber(r))
	case n == 4 && depth < 3:
		return structpb.NewStructValue(randomStruct(r, depth+1))
	case depth < 3:
		l := &structpb.ListValue{}
		for range r.IntN(4) {
			l.Values = append(l.Values, randomValue(r, depth+1))
		}
		return structpb.NewListValue(l)
	}
	return structpb.NewStringValue(randomString(r))
}

func randomStruct(r *rand.Rand, depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for range r.IntN(6) {
		s.Fields[randomString(r)] = randomValue(r, depth)
	}
	return s
}

func randomEvent(r *rand.Rand) *prpv1.Event {
	pick := func(s string) string {
		if r.IntN(4) == 0 {
			return ""
		}
		return s
	}
	ev := &prpv1.Event{
		Schema: pick(EventSchema), SourceInstanceId: pick("runner-" + randomString(r)), SourceEventId: pick(randomString(r)),
		SourceSeq: uint64(r.IntN(3)) * r.Uint64N(1<<40), SourceKind: pick(SourceKindRunner), RunId: pick(randomString(r)),
		NormalizedSessionId: pick("sess"), TurnId: pick(randomString(r)), ItemId: pick(randomString(r)),
		EventType: pick("item.delta"), SchemaVersion: uint32(r.IntN(3)), Priority: uint32(r.IntN(3)),
	}
	if r.IntN(4) != 0 {
		nanos := []int64{0, 1, 999, 1000, 120000, 1000000, 5000000, 123456789, 999999999, int64(r.IntN(1e9))}
		ev.EmittedAt = nowTS(time.Unix(r.Int64N(4e9)-1e9, nanos[r.IntN(len(nanos))]))
	}
	if r.IntN(5) != 0 {
		ev.Payload = randomStruct(r, 0)
	}
	return ev
}

// TestP4_EventEnvelopesAreWrittenAsProtojsonWritesThem: the envelope
// writer's bytes are protojson's (compacted) for random events — strings
// with every escape, multi-byte runes, numbers at the format's edges,
// nested objects and lists, timestamps of every precision — and for the
// typed payloads runnerd emits; what it cannot write the same way (not
// UTF-8, not a finite number, a value of no kind) it leaves to protojson.
func TestP4_EventEnvelopesAreWrittenAsProtojsonWritesThem(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		ev := randomEvent(r)
		want, err := protojsonEnvelope(ev)
		got, ok := appendEnvelope(nil, ev)
		if err != nil {
			require.False(t, ok, "event %d: protojson refuses it (%v), so must the writer", i, err)
			continue
		}
		require.True(t, ok, "event %d", i)
		require.Equal(t, string(want), string(got), "event %d", i)
	}
	typed, err := prp.Payload(&prpv1.RunTerminal{TurnTerminalState: "completed", FinalMessage: "x\n\"y\" 🙂", Usage: &prpv1.TurnUsage{RunDelta: &prpv1.UsageCounters{InputTokens: proto.Float64(12345678901)}}})
	require.NoError(t, err)
	ev := &prpv1.Event{Schema: EventSchema, SourceSeq: 7, EventType: prp.EventRunTerminal, EmittedAt: nowTS(time.Now()), Payload: typed}
	want, err := protojsonEnvelope(ev)
	require.NoError(t, err)
	got, err := encodeEnvelope(ev)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))

	for name, v := range map[string]*structpb.Value{
		"not UTF-8": structpb.NewStringValue("a\xffb"), "NaN": structpb.NewNumberValue(math.NaN()),
		"infinite": structpb.NewNumberValue(math.Inf(1)), "no kind": {},
	} {
		ev := &prpv1.Event{EventType: "x", Payload: &structpb.Struct{Fields: map[string]*structpb.Value{"k": v}}}
		_, ok := appendEnvelope(nil, ev)
		assert.False(t, ok, name)
		_, perr := protojsonEnvelope(ev)
		_, err := encodeEnvelope(ev)
		assert.Equal(t, perr == nil, err == nil, "%s: encodeEnvelope fails as protojson does", name)
	}
}

// TestP4_AnEventEnvelopeIsWrittenInFewAllocations: a provider delta's
// envelope costs a handful of allocations (protojson's reflection and the
// compaction cost ≈ 40).
func TestP4_AnEventEnvelopeIsWrittenInFewAllocations(t *testing.T) {
	ev := &prpv1.Event{
		Schema: EventSchema, SourceInstanceId: "runner-1", SourceEventId: SourceEventID("runner-1", 42), SourceSeq: 42,
		SourceKind: SourceKindRunner, RunId: "run-1", NormalizedSessionId: "sess-1", TurnId: "turn-1", ItemId: "item-1",
		EventType: "item.delta", SchemaVersion: EventSchemaVersion, Priority: P2, EmittedAt: nowTS(time.Now()),
		Payload: &structpb.Struct{Fields: map[string]*structpb.Value{
			"delta": structpb.NewStringValue("Hello, world"), "itemId": structpb.NewStringValue("item-1"),
			"kind": structpb.NewStringValue("agentMessage"), "index": structpb.NewNumberValue(3),
		}},
	}
	old := testing.AllocsPerRun(200, func() { _, _ = protojsonEnvelope(ev) })
	allocs := testing.AllocsPerRun(200, func() { _, _ = encodeEnvelope(ev) })
	t.Logf("allocations per envelope: %.0f (protojson and json.Compact: %.0f)", allocs, old)
	assert.LessOrEqual(t, allocs, 4.0)
}
