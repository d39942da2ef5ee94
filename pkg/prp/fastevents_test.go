package prp

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func fastSeeds(t testing.TB) [][]byte {
	ev := func(seq uint64, payload map[string]any, at time.Time) *prpv1.Event {
		p, err := structpb.NewStruct(payload)
		require.NoError(t, err)
		return &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "runner-1", SourceEventId: "event_runner-1_0000000000000001",
			SourceSeq: seq, SourceKind: "runner", RunId: "run-1", NormalizedSessionId: "s", TurnId: "t", ItemId: "i",
			EventType: "item.delta", SchemaVersion: 1, Priority: uint32(seq % 3), EmittedAt: timestamppb.New(at), Payload: p}
	}
	now := time.Date(2026, 11, 29, 22, 0, 0, 123456789, time.UTC)
	batches := []*prpv1.EventBatch{
		{Events: []*prpv1.Event{ev(1, map[string]any{"delta": "hel"}, now)}},
		{Events: []*prpv1.Event{ev(2, map[string]any{"delta": "a \"quoted\" \\ line\n\twith \u00e9 and \U0001F600 and <html>&"}, now.Truncate(time.Second)),
			ev(3, map[string]any{"n": 1.5, "neg": -3.0, "big": 1e300, "t": true, "f": false, "z": nil,
				"list": []any{1.0, "two", []any{}, map[string]any{}}, "nested": map[string]any{"a": map[string]any{"b": "c"}}}, now.Truncate(time.Millisecond))}},
		{},
	}
	var out [][]byte
	for _, b := range batches {
		f, err := Marshal(&prpv1.Frame{Kind: &prpv1.Frame_Events{Events: b}})
		require.NoError(t, err)
		out = append(out, f)
	}
	return append(out,
		[]byte(`{"events":{"events":[{"sourceSeq":7,"priority":2,"payload":{"x":"\u0041\ud83d\ude00"}}]}}`),
		[]byte(`{"events":{"events":[{"sourceSeq":"7","source_seq":"8"}]}}`),
		[]byte(`{"events":{"events":[{"payload":{"a":1,"a":2}}]}}`),
		[]byte(`{"events":{"events":[{"emittedAt":"2026-01-01T00:00:00+01:00"}]}}`),
		[]byte(`{"events":{"events":[{"priority":"2"}]}} `),
	)
}

func TestG4_FastEventDecoderAgreesWithProtojson(t *testing.T) {
	fast := 0
	for _, b := range fastSeeds(t) {
		want := &prpv1.Frame{}
		werr := unmarshalOpts.Unmarshal(b, want)
		got, ok := decodeEventBatch(b)
		if ok {
			fast++
			require.NoError(t, werr, "%s", b)
			require.True(t, proto.Equal(want, got), "%s", b)
		}
		f, err := Unmarshal(b)
		if werr != nil {
			require.Error(t, err)
			continue
		}
		require.NoError(t, err)
		require.True(t, proto.Equal(want, f), "%s", b)
		relayed, err := UnmarshalRelay(b)
		require.NoError(t, err)
		enc, err := proto.Marshal(relayed)
		require.NoError(t, err)
		again := &prpv1.Frame{}
		require.NoError(t, proto.Unmarshal(enc, again))
		require.True(t, proto.Equal(want, again), "relayed %s", b)
	}
	require.GreaterOrEqual(t, fast, 3, "runnerd's batches take the fast path")
}

// FuzzFastEventBatch: whenever the direct decoder accepts a frame, protojson
// accepts it too and decodes the same frame.
func FuzzFastEventBatch(f *testing.F) {
	for _, s := range fastSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeEventBatch(b)
		if !ok {
			return
		}
		want := &prpv1.Frame{}
		if err := unmarshalOpts.Unmarshal(b, want); err != nil {
			t.Fatalf("fast decoder accepted what protojson refuses (%v): %q", err, b)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("fast decoder disagrees with protojson on %q", b)
		}
		relayed, err := UnmarshalRelay(b)
		if err != nil {
			t.Fatal(err)
		}
		enc, err := proto.Marshal(relayed.GetEvents())
		if err != nil {
			t.Fatal(err)
		}
		again := &prpv1.EventBatch{}
		if err := proto.Unmarshal(enc, again); err != nil || !proto.Equal(again, want.GetEvents()) {
			t.Fatalf("a relayed batch does not forward the same events (%v): %q", err, b)
		}
	})
}

// deltaFrame is an event batch frame of one delta event whose protobuf
// encoding is about size bytes, as relay-bench sends it.
func deltaFrame(tb testing.TB, size int) []byte {
	ev := &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "runner-bench-1", SourceEventId: "event_runner-bench-1_0000000000000001",
		SourceSeq: 1, SourceKind: "runner", RunId: "run-bench", NormalizedSessionId: "bench", TurnId: "turn-1", ItemId: "item-1",
		EventType: "item.delta", SchemaVersion: 1, Priority: 2, EmittedAt: timestamppb.New(time.Unix(1_800_000_000, 0))}
	pl, err := structpb.NewStruct(map[string]any{"kind": "agentMessage", "delta": ""})
	require.NoError(tb, err)
	ev.Payload = pl
	pl.Fields["delta"] = structpb.NewStringValue(strings.Repeat("x", max(size-proto.Size(ev), 1)))
	b, err := Marshal(&prpv1.Frame{Kind: &prpv1.Frame_Events{Events: &prpv1.EventBatch{Events: []*prpv1.Event{ev}}}})
	require.NoError(tb, err)
	return b
}

// BenchmarkUnmarshalRelay is the gateway's per-frame decode of runnerd's
// event batches (relay-bench's event relay figures, without the sockets).
func BenchmarkUnmarshalRelay(b *testing.B) {
	for _, size := range []int{256, 4096} {
		frame := deltaFrame(b, size)
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				f, err := UnmarshalRelay(frame)
				if err != nil || f.GetEvents() == nil {
					b.Fatal(err)
				}
				ReleaseRelayBatch(f.GetEvents()) // as the gateway does once sent
			}
		})
	}
}

func TestG4_HasControlFindsEveryByteBelow0x20AtEveryPosition(t *testing.T) {
	for n := range 20 {
		clean := []byte(strings.Repeat("x", n))
		control, nonASCII := hasControl(clean)
		require.False(t, control, "len %d", n)
		require.False(t, nonASCII, "len %d", n)
		for i := range n {
			for _, c := range []byte{0x00, 0x01, 0x0a, 0x1f} {
				b := append([]byte(nil), clean...)
				b[i] = c
				control, _ := hasControl(b)
				require.True(t, control, "len %d, 0x%02x at %d", n, c, i)
			}
			for _, c := range []byte{0x20, 0x7f, 0x80, 0xc3, 0xff, '"', '\\'} {
				b := append([]byte(nil), clean...)
				b[i] = c
				control, nonASCII := hasControl(b)
				require.False(t, control, "len %d, 0x%02x at %d", n, c, i)
				require.Equal(t, c >= 0x80, nonASCII, "a byte at or above 0x80 is seen: len %d, 0x%02x at %d", n, c, i)
			}
		}
	}
}

// Lengths on both sides of each varint size (1, 2 and 3 bytes) come out of
// the transcoder exactly as protojson decodes them.
func TestG4_FastEventBatchLengthsAtEveryVarintSize(t *testing.T) {
	for _, size := range []int{150, 200, 250, 300, 16300, 16400, 16500, 70000, 2100000} {
		frame := deltaFrame(t, size)
		want := &prpv1.Frame{}
		require.NoError(t, unmarshalOpts.Unmarshal(frame, want))
		got, ok := decodeEventBatch(frame)
		require.True(t, ok, "size %d takes the fast path", size)
		require.True(t, proto.Equal(want, got), "size %d", size)
		raw, ok := transcodeEventBatch(frame)
		require.True(t, ok)
		canonical, err := proto.MarshalOptions{Deterministic: true}.Marshal(want.GetEvents())
		require.NoError(t, err)
		require.Equal(t, canonical, raw, "size %d: the transcoder writes the canonical encoding", size)
	}
}

// A relayed batch's buffer handed back (ReleaseRelayBatch) serves the next
// batch: a reused buffer — larger, full of an earlier batch's bytes — gives
// exactly the encoding a fresh one does, and a batch that carries decoded
// events is not touched.
func TestG4_RelayBuffersHandedBackAreReusedWithoutStaleBytes(t *testing.T) {
	big, small := deltaFrame(t, 70000), deltaFrame(t, 200)
	fresh, ok := transcodeEventBatch(small)
	require.True(t, ok)
	want := append([]byte(nil), fresh...)

	f, err := UnmarshalRelay(big)
	require.NoError(t, err)
	ReleaseRelayBatch(f.GetEvents())
	require.Empty(t, f.GetEvents().ProtoReflect().GetUnknown(), "a released batch is emptied")

	dirty := make([]byte, 0, len(big))
	dirty = append(dirty, big...)
	got, ok := transcodeEventBatchInto(dirty, small)
	require.True(t, ok)
	require.Equal(t, want, got)
	require.Equal(t, &dirty[:1][0], &got[:1][0], "the handed-back buffer is written in place")

	for range 3 { // through the pool, as the gateway does
		f, err := UnmarshalRelay(small)
		require.NoError(t, err)
		b, err := proto.Marshal(f.GetEvents())
		require.NoError(t, err)
		require.Equal(t, want, b)
		ReleaseRelayBatch(f.GetEvents())
	}

	decoded, err := Unmarshal(small)
	require.NoError(t, err)
	n := len(decoded.GetEvents().GetEvents())
	require.Positive(t, n)
	ReleaseRelayBatch(decoded.GetEvents())
	require.Len(t, decoded.GetEvents().GetEvents(), n)
}
