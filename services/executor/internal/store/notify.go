package store

import (
	"context"
	"sync"
	"time"
)

// notification is one pg_notify an append owes its listeners.
type notification struct{ channel, payload string }

// notifier sends the notifications of event appends after their commit,
// beside the committer instead of on its path (SPEC P4): the driver that
// committed a runner's batch acknowledges it to the runner and takes the
// next one without waiting for a round trip whose only effect is to wake
// other replicas' watchers (this replica's were told in process before,
// OnEventsCommitted). Notifications pending while one is sent go in the
// next statement together, each (channel, payload) once — PostgreSQL
// delivers a transaction's identical notifications once anyway.
//
// Its delivery is what notifyCommitted's was: best effort, after the commit;
// what a lost one would have announced is covered as notifyCommitted says.
// Close sends what is pending before the pool closes.
type notifier struct {
	mu      sync.Mutex
	pending []notification
	sending bool       // a sender goroutine runs; it takes what is pending
	idle    *sync.Cond // broadcast when the sender stops (on mu)
}

// notifyAfter queues payload's notification on channel for the store's
// sender (see notifier); it returns at once.
func (s *Store) notifyAfter(channel, payload string) {
	n := &s.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pending {
		if p.channel == channel && p.payload == payload {
			return
		}
	}
	n.pending = append(n.pending, notification{channel, payload})
	if !n.sending {
		n.sending = true
		go s.sendNotifications()
	}
}

// notifyBatchSQL sends a list of notifications in one statement, in order.
const notifyBatchSQL = `SELECT pg_notify(n.c, n.p) FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS n(c, p, o) ORDER BY n.o`

// sendNotifications sends what is pending until nothing is.
func (s *Store) sendNotifications() {
	n := &s.notes
	for {
		n.mu.Lock()
		batch := n.pending
		n.pending = nil
		if len(batch) == 0 {
			n.sending = false
			if n.idle != nil {
				n.idle.Broadcast()
			}
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if len(batch) == 1 {
			_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, batch[0].channel, batch[0].payload)
		} else {
			channels, payloads := make([]string, len(batch)), make([]string, len(batch))
			for i, b := range batch {
				channels[i], payloads[i] = b.channel, b.payload
			}
			_, _ = s.pool.Exec(ctx, notifyBatchSQL, channels, payloads)
		}
		cancel()
	}
}

// FlushNotifications waits until the notifications of the appends that
// returned so far are sent (Close does, before the pool closes).
func (s *Store) FlushNotifications() {
	n := &s.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.idle == nil {
		n.idle = sync.NewCond(&n.mu)
	}
	for n.sending {
		n.idle.Wait()
	}
}
