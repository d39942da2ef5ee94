package runner

import (
	"context"
	"time"

	"github.com/tether-run/tether/pkg/prp"
)

// supervisor is runnerd's provider supervision: the one live provider
// session, the queue its events wait in for the loop (the provider's emit
// never blocks on the loop), and what the live provider was opened with.
// When to start, stop or restart the provider, and what its events and
// exit mean for the turn, are the Runner's (commands.go, recovery.go). The
// loop goroutine owns it.
type supervisor struct {
	start StartFunc
	queue *eventQueue
	prov  Provider // nil: none running
	gen   int      // the live provider's generation (its events carry it)
	// configuredEnv is the attached run's configured provider environment
	// (SPEC E2). It may hold provider credentials, so it is kept in memory
	// only: the persisted session input (the state document, which a
	// suspension archives) carries the policy without it.
	configuredEnv map[string]string
	// tools is the digest of the dynamic tools the live provider's thread
	// was opened or resumed with (its tool contract, see toolContract).
	tools string
}

func newSupervisor(start StartFunc) *supervisor {
	return &supervisor{start: start, queue: newEventQueue()}
}

// launch starts a provider with cfg under a new generation; it becomes the
// live one.
func (s *supervisor) launch(ctx context.Context, cfg ProviderConfig) (Provider, error) {
	s.gen++
	gen, q := s.gen, s.queue
	p, err := s.start(ctx, cfg, func(ev ProviderEvent) { q.push(gen, ev) })
	if err != nil {
		return nil, err
	}
	s.prov = p
	return p, nil
}

// release forgets the live provider and returns it (nil: none).
func (s *supervisor) release() Provider {
	p := s.prov
	s.prov = nil
	return p
}

// signals are the live provider's turn results and exit (nil channels
// without a provider).
func (s *supervisor) signals() (<-chan TurnResult, <-chan struct{}) {
	if s.prov == nil {
		return nil, nil
	}
	return s.prov.TurnDone(), s.prov.Exited()
}

// events drains the provider events queued so far, and the provider host
// cursor they reach (0: none); any says whether anything was queued.
func (s *supervisor) events() (evs []pendingEvent, cursor uint64, any bool) {
	return s.collect(s.queue.drain())
}

func (s *supervisor) collect(items []queued) (evs []pendingEvent, cursor uint64, any bool) {
	if len(items) == 0 {
		return nil, 0, false
	}
	evs = make([]pendingEvent, 0, len(items))
	for _, it := range items {
		cursor = max(cursor, it.ev.Cursor) // a provider host mark
		if it.ev.Type == "" {
			continue
		}
		evs = append(evs, pendingEvent{prio: it.ev.Priority, typ: it.ev.Type, turnID: it.ev.TurnID, itemID: it.ev.ItemID, body: it.ev.Body, payload: it.ev.Payload})
	}
	return evs, cursor, true
}

// awaitTurnStarted waits (at most max) until the provider's turn.started
// is queued.
func (s *supervisor) awaitTurnStarted(max time.Duration) {
	// The wake-ups this takes are the loop's: leave it one.
	defer s.queue.poke()
	isStarted := func(ev ProviderEvent) bool { return ev.Type == prp.EventTurnStarted }
	if s.queue.has(isStarted) {
		return
	}
	t := time.NewTimer(max)
	defer t.Stop()
	for {
		select {
		case <-s.queue.signal:
			if s.queue.has(isStarted) {
				return
			}
		case <-t.C:
			return
		}
	}
}
