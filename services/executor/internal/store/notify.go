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
	// own counts the event notifications sent and not yet taken by this
	// process's listener (TakeOwnNotification), by the sending
	// connection's backend pid and run; kept only while the store tells a
	// listener of its commits in process (OnEventsCommitted).
	own map[ownNote]int
}

type ownNote struct {
	pid uint32
	run string
}

// maxOwnNotes bounds what own holds for a listener that takes nothing (not
// listening, or disconnected): past it, it is forgotten, and the listener
// reads on each of those notifications, as without the record.
const maxOwnNotes = 4096

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
		s.sendNotes(ctx, batch)
		cancel()
	}
}

// sendNotes sends one batch of notifications, on a connection whose
// backend pid the notifications carry: each event notification is
// recorded as this store's own under that pid before it is sent, and
// forgotten if the statement fails.
func (s *Store) sendNotes(ctx context.Context, batch []notification) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	s.recordOwn(pid, batch, 1)
	if len(batch) == 1 {
		_, err = conn.Exec(ctx, `SELECT pg_notify($1, $2)`, batch[0].channel, batch[0].payload)
	} else {
		channels, payloads := make([]string, len(batch)), make([]string, len(batch))
		for i, b := range batch {
			channels[i], payloads[i] = b.channel, b.payload
		}
		_, err = conn.Exec(ctx, notifyBatchSQL, channels, payloads)
	}
	if err != nil {
		s.recordOwn(pid, batch, -1)
	}
}

// recordOwn adds delta to the record of the event notifications of batch
// sent by the backend pid (see notifier.own).
func (s *Store) recordOwn(pid uint32, batch []notification, delta int) {
	if s.committed == nil {
		return // nobody in process was told of the commits
	}
	n := &s.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.own == nil || len(n.own) >= maxOwnNotes {
		n.own = map[ownNote]int{}
	}
	for _, b := range batch {
		if b.channel != EventsChannel {
			continue
		}
		k := ownNote{pid, b.payload}
		if n.own[k] += delta; n.own[k] <= 0 {
			delete(n.own, k)
		}
	}
}

// TakeOwnNotification reports whether a notification of runID's events,
// sent by the backend pid, is one this store sent after its own commit,
// whose events it handed to its OnEventsCommitted function first (SPEC P4):
// this process's listener then has nothing to read for it (its feed was
// offered the commit and read whatever did not follow). Each notification
// sent is taken once. Notifications of other processes (another backend
// pid), and those sent inside a transaction, are never taken.
func (s *Store) TakeOwnNotification(pid uint32, runID string) bool {
	n := &s.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	k := ownNote{pid, runID}
	if n.own[k] == 0 {
		return false
	}
	if n.own[k]--; n.own[k] == 0 {
		delete(n.own, k)
	}
	return true
}

// ForgetOwnNotifications forgets the notifications recorded as sent: a
// listener that (re)connects calls it, as it may have missed some (a
// backend pid could then be reused by another process's connection).
func (s *Store) ForgetOwnNotifications() {
	n := &s.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	n.own = nil
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
