package governed

import (
	"context"
	"sync"
)

// EventID identifies one PRP event exactly.
type EventID struct {
	SourceInstanceID string
	SourceEventID    string
	SourceSeq        uint64
}

func (e EventID) valid() bool { return e.SourceInstanceID != "" && e.SourceEventID != "" }

// Lookup finds the run's pending governed wait, if any. It is the storage
// query (newest pending interaction of the run) turned into a result.
type Lookup func(ctx context.Context) (result RunResult, found bool, err error)

// Observation remembers the governed wait that one event revealed until the
// event's consumer takes it. It models a race the executor has: the pending
// interaction is looked up asynchronously when an event is observed, while
// the consumer of that same event may already have moved on.
//
// Rules:
//   - Observe forgets whatever was held, then (when eligible) runs the
//     lookup and holds the result for the event, unless another Observe or
//     Consume happened while the lookup ran: a late result is discarded.
//   - Consume forgets whatever was held and returns it only when it was
//     held for exactly this event (same source instance, source event id and
//     source seq). A held result is therefore returned at most once, and a
//     lookup that resolves after a Consume was attempted yields nothing.
//
// An Observation is safe for concurrent use.
type Observation struct {
	lookup Lookup

	mu   sync.Mutex
	gen  uint64
	held *heldWait
}

type heldWait struct {
	event  EventID
	result RunResult
}

// NewObservation returns an Observation that resolves waits with lookup.
func NewObservation(lookup Lookup) *Observation {
	return &Observation{lookup: lookup}
}

// Observe records that ev happened. When eligible is false, or ev has no
// source identity, it only forgets any held wait. The lookup's error is
// returned (and nothing is held).
func (o *Observation) Observe(ctx context.Context, ev EventID, eligible bool) error {
	o.mu.Lock()
	o.gen++
	gen := o.gen
	o.held = nil
	o.mu.Unlock()
	if !eligible || !ev.valid() || o.lookup == nil {
		return nil
	}
	result, found, err := o.lookup(ctx)
	if err != nil || !found {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gen == gen {
		o.held = &heldWait{event: ev, result: result}
	}
	return nil
}

// Consume takes the wait held for exactly ev. Whatever the outcome, nothing
// is held afterwards and any lookup still running is discarded.
func (o *Observation) Consume(ev EventID) (RunResult, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gen++
	held := o.held
	o.held = nil
	if held == nil || held.event != ev {
		return RunResult{}, false
	}
	return held.result, true
}

// Event types and reasons that decide eligibility.
const (
	EventItemCompleted         = "item.completed"
	EventRuntimeRequestExpired = "runtime_request.expired"
	ReasonProviderProcessLost  = "provider_process_lost"
)

// EventFacts is what [Eligible] needs to know about an event and the run.
type EventFacts struct {
	EventType string
	// Reason is the payload reason of runtime_request.* events.
	Reason string
	// MaterializedQuestionFallback: handling the event created a durable
	// question interaction (see package runtimeq).
	MaterializedQuestionFallback bool
	// PendingToolItems counts tool items (dynamic tool, MCP tool, command
	// execution) started but not completed.
	PendingToolItems int
	// ProviderProcessLost: the run already saw runtime_request.expired
	// with reason provider_process_lost.
	ProviderProcessLost bool
}

// Eligible reports whether observing the event should look for a pending
// governed wait: an item.completed event, or an event whose handling
// materialised a question fallback; never while tool items are pending or
// once the provider process was lost (the wait is then handled by the
// question fallback's own wake, not by this run's result).
func Eligible(f EventFacts) bool {
	if f.PendingToolItems > 0 || f.ProviderProcessLost ||
		(f.EventType == EventRuntimeRequestExpired && f.Reason == ReasonProviderProcessLost) {
		return false
	}
	return f.EventType == EventItemCompleted || f.MaterializedQuestionFallback
}
