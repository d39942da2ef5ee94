package dispatch

import (
	"encoding/json"
	"time"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// ackTracker computes, per source instance, the highest source seq below
// which every event is persisted. It starts from the runner's own durable
// cursor: everything at or below it was persisted before.
type ackTracker struct {
	next    map[string]uint64          // next expected seq per instance
	pending map[string]map[uint64]bool // persisted seqs above a gap
}

func newAckTracker() *ackTracker {
	return &ackTracker{next: map[string]uint64{}, pending: map[string]map[uint64]bool{}}
}

// persisted records a persisted batch and returns the instances whose
// contiguous cursor advanced, with the new cursor.
func (a *ackTracker) persisted(floor uint64, evs []*prpv1.Event) map[string]uint64 {
	moved := map[string]uint64{}
	for _, ev := range evs {
		inst, seq := ev.GetSourceInstanceId(), ev.GetSourceSeq()
		next, ok := a.next[inst]
		if !ok {
			next = floor + 1
			a.next[inst] = next
		}
		if seq < next {
			continue
		}
		if a.pending[inst] == nil {
			a.pending[inst] = map[uint64]bool{}
		}
		a.pending[inst][seq] = true
		for a.pending[inst][next] {
			delete(a.pending[inst], next)
			next++
		}
		if next != a.next[inst] {
			a.next[inst] = next
			moved[inst] = next - 1
		}
	}
	return moved
}

// seqGate passes the attached runner's events in source order. An attach
// asks the runner to replay everything after its acknowledged cursor (the
// gateway's Replay), but the runner may send events it produces live before
// it reads that request: they arrive ahead of the replay, after a gap in
// its source seqs, and persisted then they would precede the events the
// replay brings (the run's log out of source order, a turn's deltas
// garbled). They are dropped unpersisted and unacknowledged: the replay
// carries them again, in order. Events of other sources, and duplicates
// below the cursor, pass (the store deduplicates).
type seqGate struct {
	inst string
	next uint64 // the next source seq expected from inst
	// gapSince is when the current gap opened (zero: none).
	gapSince time.Time
}

func newSeqGate(inst string, acked uint64) *seqGate { return &seqGate{inst: inst, next: acked + 1} }

// admit returns evs without the events that follow a gap.
func (g *seqGate) admit(evs []*prpv1.Event, now time.Time) []*prpv1.Event {
	out := evs[:0:0]
	for _, ev := range evs {
		if ev.GetSourceInstanceId() != g.inst || ev.GetSourceSeq() < g.next {
			out = append(out, ev)
			continue
		}
		if ev.GetSourceSeq() > g.next {
			if g.gapSince.IsZero() {
				g.gapSince = now
			}
			continue
		}
		g.next++
		g.gapSince = time.Time{}
		out = append(out, ev)
	}
	return out
}

// gap reports whether events were dropped after a gap not filled since,
// and since when.
func (g *seqGate) gap() (time.Time, bool) { return g.gapSince, !g.gapSince.IsZero() }
