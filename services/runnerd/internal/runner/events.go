package runner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// Event constants.
const (
	EventSchema        = "tether.prp.event.v1"
	EventSchemaVersion = 1
	SourceKindRunner   = "runner"

	P0 uint32 = 0
	P1 uint32 = 1
	P2 uint32 = 2
)

// Batch limits for EventBatch frames. Larger batches cut the per-frame
// costs of every hop (WebSocket frame, gateway transcoding, Attach message,
// executor insert, ack); the byte bound keeps frames well under the limit.
const (
	maxBatchEvents = 256
	maxBatchBytes  = 256 << 10
	// maxEnvelopeBytes leaves room for the batch wrapper inside MaxFrameBytes.
	maxEnvelopeBytes = prp.MaxFrameBytes - 1024
)

// SourceEventID is the runner event id for seq.
func SourceEventID(runnerInstanceID string, seq uint64) string {
	return fmt.Sprintf("event_%s_%016d", runnerInstanceID, seq)
}

// toStruct converts a JSON-like map to a Struct, falling back to a JSON round
// trip for values structpb does not take directly.
func toStruct(m map[string]any) (*structpb.Struct, error) {
	if m == nil {
		return &structpb.Struct{Fields: map[string]*structpb.Value{}}, nil
	}
	if s, err := structpb.NewStruct(m); err == nil {
		return s, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(b, s); err != nil {
		return nil, err
	}
	return s, nil
}

// encodeEnvelope is the compact protojson encoding of an event (written
// by appendEnvelope, else by protojson).
func encodeEnvelope(ev *prpv1.Event) ([]byte, error) {
	if b, ok := appendEnvelope(make([]byte, 0, 512), ev); ok {
		return b, nil
	}
	return protojsonEnvelope(ev)
}

// protojsonEnvelope is encodeEnvelope by protojson and json.Compact.
func protojsonEnvelope(ev *prpv1.Event) ([]byte, error) {
	b, err := protojson.Marshal(ev)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// batchFrames packs journaled envelopes into EventBatch frames, byte for byte.
func batchFrames(recs []statedir.Record) [][]byte {
	var frames [][]byte
	for len(recs) > 0 {
		var buf bytes.Buffer
		buf.WriteString(`{"events":{"events":[`)
		n := 0
		for n < len(recs) && n < maxBatchEvents {
			if n > 0 && buf.Len()+len(recs[n].Envelope)+1 > maxBatchBytes {
				break
			}
			if n > 0 {
				buf.WriteByte(',')
			}
			buf.Write(recs[n].Envelope)
			n++
		}
		buf.WriteString(`]}}`)
		frames = append(frames, buf.Bytes())
		recs = recs[n:]
	}
	return frames
}

// eventQueue is an unbounded FIFO so the provider's emit never blocks on the
// runner loop (which may itself be waiting for a provider response).
type eventQueue struct {
	mu     sync.Mutex
	items  []queued
	signal chan struct{}
}

type queued struct {
	gen int
	ev  ProviderEvent
}

func newEventQueue() *eventQueue { return &eventQueue{signal: make(chan struct{}, 1)} }

func (q *eventQueue) push(gen int, ev ProviderEvent) {
	q.mu.Lock()
	q.items = append(q.items, queued{gen, ev})
	q.mu.Unlock()
	q.poke()
}

// poke wakes the loop's drain.
func (q *eventQueue) poke() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// has reports whether a queued event satisfies pred.
func (q *eventQueue) has(pred func(ProviderEvent) bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.items {
		if pred(it.ev) {
			return true
		}
	}
	return false
}

// drain takes what is queued but the trailing events of a provider line
// still being handed on (ProviderEvent.More): they are taken with the
// line's last event, on the wake-up its push causes.
func (q *eventQueue) drain() []queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.items)
	for n > 0 && q.items[n-1].ev.More {
		n--
	}
	it := q.items[:n:n]
	if n == len(q.items) {
		q.items = nil
	} else {
		q.items = append([]queued(nil), q.items[n:]...)
	}
	return it
}

func nowTS(t interface{ UnixNano() int64 }) *timestamppb.Timestamp {
	n := t.UnixNano()
	return &timestamppb.Timestamp{Seconds: n / 1e9, Nanos: int32(n % 1e9)}
}
