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
			}
		})
	}
}

func TestG4_HasControlFindsEveryByteBelow0x20AtEveryPosition(t *testing.T) {
	for n := range 20 {
		clean := []byte(strings.Repeat("x", n))
		require.False(t, hasControl(clean), "len %d", n)
		for i := range n {
			for _, c := range []byte{0x00, 0x01, 0x0a, 0x1f} {
				b := append([]byte(nil), clean...)
				b[i] = c
				require.True(t, hasControl(b), "len %d, 0x%02x at %d", n, c, i)
			}
			for _, c := range []byte{0x20, 0x7f, 0x80, 0xff, '"', '\\'} {
				b := append([]byte(nil), clean...)
				b[i] = c
				require.False(t, hasControl(b), "len %d, 0x%02x at %d", n, c, i)
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
