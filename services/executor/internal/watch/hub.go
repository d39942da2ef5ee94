// Package watch fans a run's new events out to every in-process watcher of
// that run, and PostgreSQL notifications to the dispatcher, so a WatchRun
// served by any executor replica sees events persisted by any other replica
// as they commit.
//
// One feed per watched run reads the run's new events once per notification
// and hands the same events to each of its watchers from memory: with 1,000
// watchers of a run, an event costs one query, not 1,000. A watcher that
// does not keep up is cut off (ErrTooSlow, with the cursor to resume from)
// once its bounded buffer is full; the feed never waits for it. An idle
// watcher costs no query at all: nothing polls, the notification listener
// wakes the feeds (all of them after it reconnects, since notifications may
// have been missed while it was away).
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Reader reads a run's persisted events (the store, on the watch pool).
type Reader interface {
	EventsAfter(ctx context.Context, runID string, after uint64, limit int) ([]store.StoredEvent, error)
}

// Defaults of Hub's bounds.
const (
	// DefaultBuffer is how many delivered events a watcher may hold unsent
	// before it is cut off.
	DefaultBuffer = 4096
	// DefaultPage is how many events one read returns.
	DefaultPage = 256
	// DefaultStallAfter is how long a feed's senders may make no progress
	// (all held by stalled streams) before more start.
	DefaultStallAfter = 10 * time.Millisecond
)

// ErrTooSlow is returned by Watch.Next to a watcher that was cut off because
// its buffer filled up; it resumes with a new watch after Cursor.
type ErrTooSlow struct {
	// Cursor is the seq of the last event Next returned.
	Cursor uint64
	// Buffer is the bound the watcher exceeded.
	Buffer int
}

func (e *ErrTooSlow) Error() string {
	return fmt.Sprintf("watcher fell %d events behind the run's feed; resume after seq %d", e.Buffer, e.Cursor)
}

// ErrStopped is returned by Watch.Next when its stop channel closed.
var ErrStopped = errors.New("watch stopped")

// Event is one event a watch returns: the stored row and, when it came
// through the run's feed and the hub has an encoder, its wire form, made
// once for all of the run's watchers.
type Event struct {
	store.StoredEvent
	// Wire is the encoder's result for the event, or nil (the event was
	// replayed by this watcher, or the hub has no encoder).
	Wire any
}

// Encoder turns an event into the form every watcher sends (for WatchRun, its
// encoded response), so that a feed with 1,000 watchers encodes it once.
type Encoder func(store.StoredEvent) (any, error)

// Hub holds one feed per watched run.
type Hub struct {
	reader     Reader
	encoder    Encoder
	buffer     int
	page       int
	senders    int
	stallAfter time.Duration

	mu    sync.Mutex
	feeds map[string]*feed
}

// Option adjusts a Hub.
type Option func(*Hub)

// WithBuffer sets the per-watcher bound (events delivered, not yet sent);
// it is at least the page.
func WithBuffer(n int) Option { return func(h *Hub) { h.buffer = max(n, 1) } }

// WithEncoder makes each feed encode its events once, for all watchers.
func WithEncoder(e Encoder) Option { return func(h *Hub) { h.encoder = e } }

// WithSenders sets how many goroutines send a feed's events to the streams
// of waiting watchers (SendWith); the default is GOMAXPROCS.
func WithSenders(n int) Option { return func(h *Hub) { h.senders = max(n, 1) } }

// WithStallAfter sets how long the senders may make no progress (all held
// by stalled streams) before more start.
func WithStallAfter(d time.Duration) Option {
	return func(h *Hub) { h.stallAfter = max(d, time.Millisecond) }
}

// WithPage sets how many events one read returns.
func WithPage(n int) Option { return func(h *Hub) { h.page = max(n, 1) } }

// NewHub returns a hub reading events through r.
func NewHub(r Reader, opts ...Option) *Hub {
	h := &Hub{reader: r, buffer: DefaultBuffer, page: DefaultPage, senders: runtime.GOMAXPROCS(0),
		stallAfter: DefaultStallAfter, feeds: map[string]*feed{}}
	for _, o := range opts {
		o(h)
	}
	h.buffer = max(h.buffer, h.page) // one read always fits an empty buffer
	return h
}

// feed reads one run's new events, once per notification, for all of its
// watchers.
type feed struct {
	hub   *Hub
	runID string
	wake  chan struct{} // coalesced notifications
	stop  context.CancelFunc

	// Guarded by hub.mu.
	watchers map[*Watch]struct{}
	// offered: events this process committed, handed over by Offer.
	offered []store.StoredEvent
	// announced: a commit was announced whose events were not offered (a
	// notification, or an Offer without them or past the bound): the feed
	// reads, whatever else woke it.
	announced bool
	// Owned by the feed goroutine.
	next uint64 // events up to this seq were read
}

// Watch is one watcher of a run: it replays from its cursor through the
// reader, joins the run's feed once caught up, reads once more (what the
// feed published before the watch joined), then takes the feed's events,
// filling any gap from the reader.
type Watch struct {
	hub    *Hub
	feed   *feed // set once joined
	runID  string
	cursor uint64
	live   bool // joined and caught up

	signal chan struct{} // something was delivered, the watch was cut, or Next's ctx or stop ended
	closed chan struct{} // closed by Close: the waker ends
	once   sync.Once     // closes closed
	waker  bool          // the waker runs (owned by Next's caller)
	ended  atomic.Bool   // Next's ctx ended or its stop closed (set by the waker)

	// send, when set (SendWith), sends an event's wire form on the
	// watcher's stream: the run's feed then sends to a waiting watcher
	// itself, instead of waking its goroutine to send.
	send func(wire any) error

	mu      sync.Mutex
	pending []Event
	cut     bool
	idle    bool  // Next waits with nothing pending: a feed sender may take the stream
	sending bool  // a feed sender holds the stream (Next waits for it)
	waiting bool  // Next waits for the sender to let the stream go
	sendErr error // a feed sender's send failed
}

// Watch starts watching runID after seq after. Close it when done.
func (h *Hub) Watch(runID string, after uint64) *Watch {
	return &Watch{hub: h, runID: runID, cursor: after, signal: make(chan struct{}, 1), closed: make(chan struct{})}
}

// join adds the watch to the run's feed, starting one (reading after the
// watch's cursor: every event up to it is persisted) when there is none.
func (w *Watch) join() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.feeds[w.runID]
	if f == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f = &feed{hub: h, runID: w.runID, wake: make(chan struct{}, 1), stop: cancel,
			watchers: map[*Watch]struct{}{}, next: w.cursor}
		h.feeds[w.runID] = f
		go f.run(ctx)
	}
	f.watchers[w] = struct{}{}
	w.feed = f
}

// SendWith lets the run's feed send events on the watcher's stream with
// send while the watcher waits in Next (an event the feed encoded, in
// order after the watch's cursor): with 1,000 watchers of a run, an event is
// then a few sending goroutines' work, not 1,000 goroutine wake-ups. Next
// returns only the events the feed did not send, and never while a feed
// sender holds the stream; a send's error ends the watch (Next returns it).
// Call it before the first Next.
func (w *Watch) SendWith(send func(wire any) error) { w.send = send }

// Cursor is the seq of the last event Next returned or the feed sent.
func (w *Watch) Cursor() uint64 { return w.cursor }

// Close stops the watch; the run's feed stops with its last watcher.
func (w *Watch) Close() {
	w.once.Do(func() { close(w.closed) })
	w.hub.leave(w)
}

func (h *Hub) leave(w *Watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := w.feed
	if f == nil {
		return
	}
	if _, ok := f.watchers[w]; !ok {
		return
	}
	delete(f.watchers, w)
	if len(f.watchers) == 0 && h.feeds[f.runID] == f {
		delete(h.feeds, f.runID)
		f.stop()
	}
}

// Next returns the next events after the watch's cursor, in order, waiting
// for them when there are none. It returns ctx's error when ctx ends,
// ErrStopped when stop closes, and *ErrTooSlow once the watch was cut off.
// Every call passes the same ctx and stop (the first wait binds them).
func (w *Watch) Next(ctx context.Context, stop <-chan struct{}) ([]Event, error) {
	for !w.live {
		evs, err := w.hub.reader.EventsAfter(ctx, w.runID, w.cursor, w.hub.page)
		if err != nil {
			return nil, err
		}
		if len(evs) < w.hub.page {
			// Caught up. Once joined, the feed has everything after this
			// read; before, what it published meanwhile is read once more.
			if w.feed != nil {
				w.live = true
			} else {
				w.join()
			}
		}
		if len(evs) > 0 {
			w.cursor = evs[len(evs)-1].Seq
			return unencoded(evs), nil
		}
	}
	for {
		w.mu.Lock()
		if w.sending {
			// A feed sender holds the stream: it signals once done.
			w.waiting = true
			w.mu.Unlock()
			<-w.signal
			continue
		}
		got, cut, sendErr := w.pending, w.cut, w.sendErr
		w.pending, w.idle, w.waiting = nil, false, false
		w.mu.Unlock()
		if sendErr != nil {
			return nil, sendErr
		}
		// Already replayed events come again from the feed: skip them.
		for len(got) > 0 && got[0].Seq <= w.cursor {
			got = got[1:]
		}
		if len(got) > 0 {
			if got[0].Seq > w.cursor+1 {
				// The feed started after this cursor (or read past it
				// before this watch joined): read the gap.
				evs, err := w.hub.reader.EventsAfter(ctx, w.runID, w.cursor, int(min(got[0].Seq-w.cursor-1, uint64(w.hub.page))))
				if err != nil {
					return nil, err
				}
				if len(evs) == 0 {
					return nil, fmt.Errorf("watch %s: events after %d are missing before %d", w.runID, w.cursor, got[0].Seq)
				}
				w.requeue(got)
				got = unencoded(evs)
			}
			w.cursor = got[len(got)-1].Seq
			return got, nil
		}
		if cut {
			return nil, &ErrTooSlow{Cursor: w.cursor, Buffer: w.hub.buffer}
		}
		// The watch waits on one channel, its own. With 1,000 watchers of
		// a run, a select that also waited on ctx and the server-wide stop
		// channel locked that shared channel twice per watcher and event,
		// and asking ctx (a chain of contexts, cold in the cache by the
		// next event) cost as much as the send: the waker asks them once.
		if !w.waker {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			select {
			case <-stop:
				return nil, ErrStopped
			default:
			}
			w.waker = true
			go w.wake(ctx.Done(), stop)
		} else if w.ended.Load() {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, ErrStopped
		}
		w.mu.Lock()
		w.idle = w.send != nil && len(w.pending) == 0 && !w.cut
		w.mu.Unlock()
		<-w.signal
	}
}

// wake marks the watch ended and signals it when its Next's ctx ends or
// stop closes, until the watch is closed.
func (w *Watch) wake(done <-chan struct{}, stop <-chan struct{}) {
	select {
	case <-done:
	case <-stop:
	case <-w.closed:
		return
	}
	w.ended.Store(true)
	w.poke()
}

// poke signals the watch's Next; signals coalesce.
func (w *Watch) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// unencoded wraps events read by the watcher itself (no wire form).
func unencoded(evs []store.StoredEvent) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		out[i].StoredEvent = e
	}
	return out
}

// requeue puts events taken from pending back in front of it.
func (w *Watch) requeue(evs []Event) {
	w.mu.Lock()
	w.pending = append(append([]Event(nil), evs...), w.pending...)
	w.mu.Unlock()
}

// deliver hands events to the watch, or cuts it off when its buffer would
// overflow. It never blocks. When sendable (every event has its wire form,
// none is the terminal one) and the watch waits with nothing pending, its
// cursor right before evs, it takes the watch's stream instead (take): the
// caller then sends evs with sendTaken.
func (w *Watch) deliver(evs []Event, sendable bool) (take, ok bool) {
	w.mu.Lock()
	if sendable && w.idle && len(w.pending) == 0 && evs[0].Seq == w.cursor+1 {
		w.idle, w.sending = false, true
		w.mu.Unlock()
		return true, true
	}
	switch {
	case len(w.pending)+len(evs) > w.hub.buffer:
		w.cut, w.pending = true, nil
	case w.pending == nil:
		// Shared with the other watchers, read only: a later append
		// copies (the capacity ends at the length).
		w.pending = evs[:len(evs):len(evs)]
	default:
		w.pending = append(w.pending, evs...)
	}
	ok = !w.cut
	w.mu.Unlock()
	w.poke()
	return false, ok
}

// sendTaken sends evs, taken by deliver, on the watch's stream, then lets
// the stream go: Next is signalled only when it has something to do (events
// delivered meanwhile, a cut, the send's error, or it waits for the stream).
func (w *Watch) sendTaken(evs []Event) {
	cursor := w.cursor // deliver took the stream at this cursor
	var err error
	for _, e := range evs {
		if err = w.send(e.Wire); err != nil {
			break
		}
		cursor = e.Seq
	}
	w.mu.Lock()
	w.cursor, w.sending = cursor, false
	if err != nil {
		w.sendErr = err
	}
	wake := w.waiting || err != nil || len(w.pending) > 0 || w.cut
	if !wake {
		w.idle = true // Next still waits, and nothing came meanwhile
	}
	w.mu.Unlock()
	if wake {
		w.poke()
	}
}

// Notify tells the run's feed (when the run is watched here) that the run
// has new events.
func (h *Hub) Notify(runID string) { h.Offer(runID, nil) }

// Offer tells the run's feed (when the run is watched here) that this
// process just committed events of the run: evs, in seq order, when the
// committer knows them (nil: the feed reads them). The feed publishes
// offered events that follow what it read without reading them (SPEC P4:
// no notification round trip and no read between a local commit and the
// watchers); anything else it reads, as on a notification. Offered events
// are shared, read only, with the watchers.
func (h *Hub) Offer(runID string, evs []store.StoredEvent) {
	h.mu.Lock()
	f := h.feeds[runID]
	if f != nil {
		if len(evs) > 0 && len(f.offered) < h.page {
			f.offered = append(f.offered, evs...)
		} else {
			f.announced = true
		}
	}
	h.mu.Unlock()
	if f != nil {
		f.poke()
	}
}

// takeOffered returns the offered events that follow f.next without a gap
// (nil when none do: the feed reads), and forgets every offered event.
// read reports that the feed must also read: a commit was announced
// without its events, or offered events were left out after a gap.
// (Wake-ups coalesce: one may stand for an offered commit and for others
// announced beside it, whose notifications came before the feed woke.)
func (f *feed) takeOffered() (evs []store.StoredEvent, read bool) {
	f.hub.mu.Lock()
	off, read := f.offered, f.announced
	f.offered, f.announced = nil, false
	f.hub.mu.Unlock()
	for len(off) > 0 && off[0].Seq <= f.next {
		off = off[1:]
	}
	if len(off) == 0 || off[0].Seq != f.next+1 {
		return nil, true
	}
	for i := 1; i < len(off); i++ {
		if off[i].Seq != off[i-1].Seq+1 {
			return off[:i], true
		}
	}
	return off, read
}

func (f *feed) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (h *Hub) notifyAll() {
	h.mu.Lock()
	fs := make([]*feed, 0, len(h.feeds))
	for _, f := range h.feeds {
		fs = append(fs, f)
	}
	h.mu.Unlock()
	for _, f := range fs {
		f.poke()
	}
}

// Watchers returns how many watches of runID are open (for metrics and tests).
func (h *Hub) Watchers(runID string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f := h.feeds[runID]; f != nil {
		return len(f.watchers)
	}
	return 0
}

// run reads the run's new events on every wake-up until the run's terminal
// event or its last watcher leaves.
func (f *feed) run(ctx context.Context) {
	defer f.stop()
	retry := backoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		evs, read := f.takeOffered()
		if evs != nil {
			// Committed here: published without a read.
			f.next = evs[len(evs)-1].Seq
			if f.publish(f.encode(evs)) {
				return
			}
		}
		if !read {
			continue
		}
		for {
			evs, err := f.hub.reader.EventsAfter(ctx, f.runID, f.next, f.hub.page)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// Transient: try again shortly (the events stay in the table).
				f.poke()
				if !backoff.Sleep(ctx, retry.Next()) {
					return
				}
				break
			}
			retry.Reset()
			if len(evs) == 0 {
				break
			}
			f.next = evs[len(evs)-1].Seq
			if f.publish(f.encode(evs)) {
				return
			}
			if len(evs) < f.hub.page {
				break
			}
		}
	}
}

// encode gives each event its wire form once, when the hub has an encoder;
// an event the encoder refuses goes without (each watcher then encodes it,
// and sees the error itself).
func (f *feed) encode(evs []store.StoredEvent) []Event {
	out := unencoded(evs)
	if f.hub.encoder == nil {
		return out
	}
	for i := range out {
		if wire, err := f.hub.encoder(out[i].StoredEvent); err == nil {
			out[i].Wire = wire
		}
	}
	return out
}

// publish hands evs to every watcher and drops the ones cut off. It
// reports whether the feed is done: the run ended (its terminal event was
// among evs) or every watcher was cut off. The feed then retires, and a
// later watch of the run starts a new one.
func (f *feed) publish(evs []Event) (done bool) {
	// The terminal event goes through Next: the watcher ends with it.
	sendable := true
	for _, e := range evs {
		sendable = sendable && e.Wire != nil && e.Event.GetEventType() != store.EventTerminal
	}
	var taken []*Watch
	f.hub.mu.Lock()
	for w := range f.watchers {
		take, ok := w.deliver(evs, sendable)
		if !ok {
			delete(f.watchers, w)
		} else if take {
			taken = append(taken, w)
		}
	}
	done = evs[len(evs)-1].Event.GetEventType() == store.EventTerminal || len(f.watchers) == 0
	if done && f.hub.feeds[f.runID] == f {
		delete(f.hub.feeds, f.runID)
	}
	f.hub.mu.Unlock()
	if len(taken) > 0 {
		f.hub.sendAll(taken, evs)
	}
	return done
}

// sendAll sends evs on the streams taken from ws, from a few goroutines
// (the hub's senders) that share the list. A send blocks while its stream's
// flow-control window and write quota are full (a stalled watcher), holding
// its sender: when no send completed for StallAfter while streams are left,
// as many senders again start, so a stalled stream holds back the others
// once, by about StallAfter, on the event that found it stalled. Its later
// events wait in its bounded buffer (it is cut off when that fills), as
// when its own goroutine was stuck sending.
func (h *Hub) sendAll(ws []*Watch, evs []Event) {
	j := &sendJob{ws: ws, evs: evs}
	j.left.Store(int64(len(ws)))
	n := min(h.senders, len(ws))
	j.started.Store(int64(n))
	j.seen.Store(int64(len(ws)))
	stall := func() {
		left, next := j.left.Load(), j.next.Load()
		if left == 0 || next >= int64(len(ws)) {
			return
		}
		if j.seen.Swap(left) == left { // no send completed since the last look
			more := min(j.started.Load(), int64(len(ws))-next)
			j.started.Add(more)
			for range more {
				go j.run()
			}
		}
		j.timer.Reset(h.stallAfter)
	}
	// Armed once j.timer is set: stall reads it.
	j.timer = time.AfterFunc(time.Hour, stall)
	j.timer.Reset(h.stallAfter)
	for range n {
		go j.run()
	}
}

// sendJob is one publish's sends to the watchers whose streams it took.
type sendJob struct {
	ws      []*Watch
	evs     []Event
	next    atomic.Int64 // index of the next watcher to send to
	left    atomic.Int64 // watchers not yet sent to
	seen    atomic.Int64 // left at the last stall check
	started atomic.Int64 // senders started
	timer   *time.Timer
}

func (j *sendJob) run() {
	for {
		i := j.next.Add(1) - 1
		if i >= int64(len(j.ws)) {
			return
		}
		j.ws[i].sendTaken(j.evs)
		if j.left.Add(-1) == 0 {
			j.timer.Stop()
		}
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
	// Own, when set, reports whether a notification of a run's events,
	// sent by the backend pid, announces a commit of this process whose
	// events the hub was offered already (Offer; store.TakeOwnNotification):
	// no feed reads for it (SPEC P4). Forget is called whenever the
	// listener (re)connects: notifications may have been missed.
	Own    func(pid uint32, runID string) bool
	Forget func()
}

// Listen holds a dedicated connection LISTENing on the events, runs and
// cancel channels until ctx ends, reconnecting with backoff. After a
// reconnect every feed reads again, since notifications may have been
// missed.
func (h *Hub) Listen(ctx context.Context, pool *pgxpool.Pool, hs Handlers, log *slog.Logger) {
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		err := h.listenOnce(ctx, pool, hs)
		if ctx.Err() != nil {
			return
		}
		log.Warn("notification listener reconnecting", "err", err)
		h.notifyAll()
		if !backoff.Sleep(ctx, retry.Next()) {
			return
		}
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
	if hs.Forget != nil {
		hs.Forget()
	}
	h.notifyAll()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch n.Channel {
		case store.EventsChannel:
			if hs.Own != nil && hs.Own(n.PID, n.Payload) {
				continue // offered at its commit
			}
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
