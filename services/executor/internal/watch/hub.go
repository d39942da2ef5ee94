// Package watch fans PostgreSQL notifications out to in-process watchers, so
// a WatchRun served by any executor replica sees events persisted by any
// other replica as they commit.
package watch

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// Hub distributes "run X has new events" signals.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe returns a channel signalled (coalesced) whenever the run has new
// events, and a function that unsubscribes.
func (h *Hub) Subscribe(runID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[runID] == nil {
		h.subs[runID] = map[chan struct{}]struct{}{}
	}
	h.subs[runID][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[runID], ch)
		if len(h.subs[runID]) == 0 {
			delete(h.subs, runID)
		}
		h.mu.Unlock()
	}
}

// Notify signals the run's subscribers.
func (h *Hub) Notify(runID string) {
	h.mu.Lock()
	for ch := range h.subs[runID] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}

func (h *Hub) notifyAll() {
	h.mu.Lock()
	var ids []string
	for id := range h.subs {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.Notify(id)
	}
}

// Handlers receive notifications other than new events.
type Handlers struct {
	// RunsDue is called when a run was submitted.
	RunsDue func()
	// RunDue, when set, is called instead of RunsDue with the submitted
	// run's id.
	RunDue func(runID string)
	// Cancel is called with a run id whose cancellation awaits dispatch.
	Cancel func(runID string)
}

// Listen holds a dedicated connection LISTENing on the events, runs and
// cancel channels until ctx ends, reconnecting with backoff. After a
// reconnect every subscriber is signalled, since notifications may have been
// missed.
func (h *Hub) Listen(ctx context.Context, pool *pgxpool.Pool, hs Handlers, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := h.listenOnce(ctx, pool, hs)
		if ctx.Err() != nil {
			return
		}
		log.Warn("notification listener reconnecting", "err", err)
		h.notifyAll()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (h *Hub) listenOnce(ctx context.Context, pool *pgxpool.Pool, hs Handlers) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, ch := range []string{store.EventsChannel, store.RunsChannel, store.CancelChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return err
		}
	}
	defer func() {
		// Leave the pooled connection clean.
		uctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = conn.Exec(uctx, "UNLISTEN *")
		cancel()
	}()
	h.notifyAll()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch n.Channel {
		case store.EventsChannel:
			h.Notify(n.Payload)
		case store.RunsChannel:
			if hs.RunDue != nil {
				hs.RunDue(n.Payload)
			} else if hs.RunsDue != nil {
				hs.RunsDue()
			}
		case store.CancelChannel:
			if hs.Cancel != nil {
				hs.Cancel(n.Payload)
			}
		}
	}
}
