package watch

import (
	"context"
	"errors"
	"sync"
	"testing"

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
