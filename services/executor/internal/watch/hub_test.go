package watch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// events is an in-memory Reader of one run's events.
type events struct {
	mu  sync.Mutex
	evs []store.StoredEvent
}

func (r *events) EventsAfter(_ context.Context, _ string, after uint64, limit int) ([]store.StoredEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []store.StoredEvent
	for _, e := range r.evs {
		if e.Seq > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (r *events) add(typ string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := uint64(len(r.evs) + 1)
	r.evs = append(r.evs, store.StoredEvent{Seq: seq, Event: &prpv1.Event{EventType: typ}})
	return seq
}

// next runs w.Next in a goroutine and returns its result channel.
func next(ctx context.Context, w *Watch, stop <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := w.Next(ctx, stop)
		done <- err
	}()
	return done
}

// A watch waiting for events wakes when its ctx ends or stop closes, and
// closing a watch that waited ends its waker (goleak checks).
func TestWatchWaitingForEventsEndsWithItsContextOrStop(t *testing.T) {
	r := &events{}
	r.add("item.delta")
	h := NewHub(r)

	// The first Next replays seq 1 and joins the feed; the second waits.
	ctx, cancel := context.WithCancel(context.Background())
	w := h.Watch("run", 0)
	if evs, err := w.Next(ctx, nil); err != nil || len(evs) != 1 || evs[0].Seq != 1 {
		t.Fatalf("replay: %v %v", evs, err)
	}
	waiting := next(ctx, w, nil)
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after its ctx ended: %v, want context.Canceled", err)
	}
	w.Close()

	stop := make(chan struct{})
	w = h.Watch("run", 1)
	waiting = next(context.Background(), w, stop)
	close(stop)
	if err := <-waiting; !errors.Is(err, ErrStopped) {
		t.Fatalf("Next after stop closed: %v, want ErrStopped", err)
	}
	w.Close()

	// A watch that waited and is closed while its ctx lives on.
	w = h.Watch("run", 0)
	if _, err := w.Next(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	waiting = next(context.Background(), w, nil)
	h.Notify("run") // nothing new: the feed reads nothing
	seq := r.add("item.delta")
	h.Notify("run")
	if err := <-waiting; err != nil {
		t.Fatalf("Next after seq %d: %v", seq, err)
	}
	if w.Cursor() != seq {
		t.Fatalf("cursor %d, want %d", w.Cursor(), seq)
	}
	w.Close()
	if n := h.Watchers("run"); n != 0 {
		t.Fatalf("%d watchers after every watch closed", n)
	}
}

// sink records what one watcher got, in order, and by which path.
type sink struct {
	mu   sync.Mutex
	seqs []uint64
	sent int // how many the feed sent (SendWith), not Next
	got  chan struct{}
}

func newSink() *sink { return &sink{got: make(chan struct{}, 1024)} }

func (s *sink) add(seq uint64, sent bool) {
	s.mu.Lock()
	s.seqs = append(s.seqs, seq)
	if sent {
		s.sent++
	}
	s.mu.Unlock()
	s.got <- struct{}{}
}

func (s *sink) state() ([]uint64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.seqs...), s.sent
}

// wait waits until the sink holds n events.
func (s *sink) wait(t *testing.T, n int) {
	t.Helper()
	for {
		if seqs, _ := s.state(); len(seqs) >= n {
			return
		}
		select {
		case <-s.got:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d events within 20 s", n)
		}
	}
}

// serve runs w as WatchRun does, recording into s what Next returns, until
// the run's terminal event (nil) or Next's error.
func serve(w *Watch, s *sink) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			evs, err := w.Next(context.Background(), nil)
			if err != nil {
				done <- err
				return
			}
			for _, e := range evs {
				s.add(e.Seq, false)
				if e.Event.GetEventType() == store.EventTerminal {
					done <- nil
					return
				}
			}
		}
	}()
	return done
}

// waitIdle waits until every watch waits with nothing pending (the feed
// may send to it).
func waitIdle(t *testing.T, ws ...*Watch) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, w := range ws {
		for {
			w.mu.Lock()
			idle := w.idle
			w.mu.Unlock()
			if idle {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the watch did not start waiting within 20 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func seqWire(e store.StoredEvent) (any, error) { return e.Seq, nil }

// holding reports whether a feed sender holds w's stream.
func (h *Hub) holding(w *Watch) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sending
}

// The feed sends its encoded events on the streams of waiting watchers
// itself. Sends that block (stalled streams) hold neither the other
// watchers nor the feed: with one sender, more start while no send
// completes for StallAfter; a stalled watcher's later events fill its
// buffer, and once its send returns, Next reports the cut with the cursor
// of what was sent.
func TestFeedSendsToWaitingWatchersAndStalledSendsHoldNoOther(t *testing.T) {
	r := &events{}
	h := NewHub(r, WithEncoder(seqWire), WithBuffer(4), WithPage(4), WithSenders(1), WithStallAfter(time.Millisecond))
	release := make(chan struct{})
	const stalls = 3
	stalled := make([]*Watch, stalls)
	stalledGot := make([]*sink, stalls)
	stalledDone := make([]<-chan error, stalls)
	for i := range stalled {
		w, got := h.Watch("run", 0), newSink()
		defer w.Close()
		w.SendWith(func(wire any) error {
			<-release
			got.add(wire.(uint64), true)
			return nil
		})
		stalled[i], stalledGot[i], stalledDone[i] = w, got, serve(w, got)
	}
	reader, b := newSink(), h.Watch("run", 0)
	defer b.Close()
	b.SendWith(func(wire any) error {
		reader.add(wire.(uint64), true)
		return nil
	})
	bDone := serve(b, reader)
	waitIdle(t, append(stalled, b)...)

	const n = 12
	for i := 1; i <= n; i++ {
		waitIdle(t, b)
		r.add("item.delta")
		h.Notify("run")
		reader.wait(t, i)
	}
	if seqs, sent := reader.state(); len(seqs) != n || sent != n || seqs[n-1] != n {
		t.Fatalf("the reading watcher got %v (%d sent by the feed), want 1…%d all sent", seqs, sent, n)
	}
	close(release)
	for i, w := range stalled {
		var slow *ErrTooSlow
		if err := <-stalledDone[i]; !errors.As(err, &slow) || slow.Cursor != 1 || w.Cursor() != 1 {
			t.Fatalf("stalled watcher %d ended with %v at cursor %d, want ErrTooSlow at 1", i, err, w.Cursor())
		}
		if seqs, _ := stalledGot[i].state(); len(seqs) != 1 || seqs[0] != 1 {
			t.Fatalf("stalled watcher %d got %v, want [1]", i, seqs)
		}
	}
	r.add(store.EventTerminal) // the terminal event goes through Next
	h.Notify("run")
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
}

// Events delivered while the feed sends on a watcher's stream come from Next
// after the send, in order; a failed send ends the watch with its error.
func TestFeedSendKeepsTheOrderAndItsErrorEndsTheWatch(t *testing.T) {
	r := &events{}
	h := NewHub(r, WithEncoder(seqWire))
	hold, broken := make(chan struct{}), errors.New("stream broken")
	got := newSink()
	w := h.Watch("run", 0)
	defer w.Close()
	w.SendWith(func(wire any) error {
		seq := wire.(uint64)
		if seq == 1 {
			<-hold
		}
		if seq == 4 {
			return broken
		}
		got.add(seq, true)
		return nil
	})
	done := serve(w, got)
	waitIdle(t, w)
	r.add("item.delta")
	h.Notify("run")
	// Seq 1's send holds the stream: 2 and 3 wait in the buffer.
	for !h.holding(w) {
		time.Sleep(time.Millisecond)
	}
	r.add("item.delta")
	h.Notify("run")
	r.add("item.delta")
	h.Notify("run")
	for {
		w.mu.Lock()
		n := len(w.pending)
		w.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	got.wait(t, 3)
	if seqs, sent := got.state(); len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || sent != 1 {
		t.Fatalf("got %v (%d sent by the feed), want [1 2 3] with 1 sent", seqs, sent)
	}
	waitIdle(t, w)
	r.add("item.delta")
	h.Notify("run")
	if err := <-done; !errors.Is(err, broken) || w.Cursor() != 3 {
		t.Fatalf("Next after a failed send: %v at cursor %d, want %v at 3", err, w.Cursor(), broken)
	}
}

// got is what one Next returned.
type got struct {
	evs []Event
	err error
}

// countingReader counts its reads.
type countingReader struct {
	events
	n   int
	nmu sync.Mutex
}

func (r *countingReader) EventsAfter(ctx context.Context, run string, after uint64, limit int) ([]store.StoredEvent, error) {
	r.nmu.Lock()
	r.n++
	r.nmu.Unlock()
	return r.events.EventsAfter(ctx, run, after, limit)
}

func (r *countingReader) count() int {
	r.nmu.Lock()
	defer r.nmu.Unlock()
	return r.n
}

// Events a process committed and offered to the hub reach the run's
// watchers without a read when they follow what the feed has (SPEC P4: no
// notification round trip and no read after a local commit); offered
// events after a gap (another replica's commit in between) are read.
func TestP4_EventsOfferedByTheirCommitterReachWatchersWithoutARead(t *testing.T) {
	r := &countingReader{}
	h := NewHub(r)
	w := h.Watch("run", 0)
	defer w.Close()
	nextEvents := func() <-chan got {
		ch := make(chan got, 1)
		go func() {
			evs, err := w.Next(context.Background(), nil)
			ch <- got{evs, err}
		}()
		return ch
	}
	waiting := nextEvents() // replays nothing, joins the feed, waits
	deadline := time.Now().Add(10 * time.Second)
	for h.Watchers("run") == 0 || r.count() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the watch never joined its feed")
		}
		time.Sleep(time.Millisecond)
	}
	before := r.count()
	r.add("turn.started")
	r.add("item.delta")
	h.Offer("run", append([]store.StoredEvent(nil), r.evs...))
	g := <-waiting
	if g.err != nil || len(g.evs) != 2 || g.evs[0].Seq != 1 || g.evs[1].Seq != 2 {
		t.Fatalf("offered events: %v %v", g.evs, g.err)
	}
	if n := r.count() - before; n != 0 {
		t.Fatalf("%d reads for events offered in order, want none", n)
	}

	// Seq 3 was committed elsewhere (only notified); seq 4 is offered.
	waiting = nextEvents()
	r.add("item.delta")
	r.add("item.completed")
	h.Offer("run", []store.StoredEvent{r.evs[3]})
	g = <-waiting
	if g.err != nil || len(g.evs) == 0 || g.evs[0].Seq != 3 {
		t.Fatalf("after a gap: %v %v", g.evs, g.err)
	}
	if g.evs[len(g.evs)-1].Seq != 4 {
		if g2 := <-nextEvents(); g2.err != nil || g2.evs[len(g2.evs)-1].Seq != 4 {
			t.Fatalf("after a gap: %v then %v %v", g.evs, g2.evs, g2.err)
		}
	}
	if r.count() == before {
		t.Fatal("events after a gap were not read")
	}
}

// heldReader answers a read with what the run held when the read began,
// but only once the test lets it go (hold), so a test can commit and
// announce events while the feed is reading.
type heldReader struct {
	events
	gate  chan heldRead // the next read takes it and waits
	reads atomic.Int64
}

type heldRead struct{ began, release chan struct{} }

func (r *heldReader) EventsAfter(ctx context.Context, run string, after uint64, limit int) ([]store.StoredEvent, error) {
	out, err := r.events.EventsAfter(ctx, run, after, limit)
	r.reads.Add(1)
	select {
	case h := <-r.gate:
		close(h.began)
		<-h.release
	default:
	}
	return out, err
}

// hold makes the next read wait until release is called; began closes
// when that read began.
func (r *heldReader) hold() (began <-chan struct{}, release func()) {
	h := heldRead{began: make(chan struct{}), release: make(chan struct{})}
	r.gate <- h
	return h.began, func() { close(h.release) }
}

// An offered commit and an announcement of another (a commit whose events
// were not offered: the careful path, or another replica's) that arrive
// while the feed is busy wake it once; after publishing the offered events
// it still reads what was announced. (Before: the feed published the
// offered events and went back to sleep, so a run.terminal announced beside
// an offered commit never reached the run's watchers — WatchRun hung until
// its caller's deadline.)
func TestP4_AnAnnouncedCommitBesideAnOfferedOneIsReadToo(t *testing.T) {
	r := &heldReader{gate: make(chan heldRead, 1)}
	h := NewHub(r)
	w := h.Watch("run", 0)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nextEvents := func() got {
		evs, err := w.Next(ctx, nil)
		return got{evs, err}
	}
	waiting := make(chan got, 1)
	go func() { waiting <- nextEvents() }()            // replays nothing, joins, waits
	for h.Watchers("run") == 0 || r.reads.Load() < 2 { // read, join, read again
		time.Sleep(time.Millisecond)
	}
	// The feed reads on a notification of seq 1; while that read is held,
	// seq 2 is committed and offered, then the terminal (seq 3) committed
	// and announced without its events.
	began, release := r.hold()
	r.add("item.delta")
	h.Notify("run")
	<-began
	seq2 := r.add("item.delta")
	h.Offer("run", []store.StoredEvent{r.evs[seq2-1]})
	r.add(store.EventTerminal)
	h.Notify("run")
	release()

	var seqs []uint64
	g := <-waiting
	for {
		if g.err != nil {
			t.Fatalf("after %v: %v", seqs, g.err)
		}
		for _, e := range g.evs {
			seqs = append(seqs, e.Seq)
		}
		if len(seqs) > 0 && seqs[len(seqs)-1] == 3 {
			break
		}
		g = nextEvents()
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("watched %v, want 1 2 3", seqs)
	}
}
