package dispatch

import (
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

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
