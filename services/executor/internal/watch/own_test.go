package watch_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

// readCounter counts a hub's reads.
type readCounter struct {
	watch.Reader
	n atomic.Int64
}

func (r *readCounter) EventsAfter(ctx context.Context, run string, after uint64, limit int) ([]store.StoredEvent, error) {
	r.n.Add(1)
	return r.Reader.EventsAfter(ctx, run, after, limit)
}

// SPEC P4: a run's watchers on the replica that commits its events are
// offered them at the commit; the notification the store sends after that
// commit (for other replicas' watchers) is recognised by the listener of
// the same process (the sending connection's backend pid, the run) and
// wakes no read. A notification from elsewhere is read as before. The
// previous code read once more per such commit, and found nothing.
func TestP4_AReplicaReadsNothingOnItsOwnCommitsNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	reads := &readCounter{Reader: s}
	h := watch.NewHub(reads)
	s.OnEventsCommitted(h.Offer)

	type seen struct {
		run string
		own bool
	}
	var (
		mu        sync.Mutex
		notes     []seen
		listening = make(chan struct{})
		once      sync.Once
	)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() {
		defer close(done)
		h.Listen(lctx, s.Pool(), watch.Handlers{
			Own: func(pid uint32, run string) bool {
				own := s.TakeOwnNotification(pid, run)
				mu.Lock()
				notes = append(notes, seen{run, own})
				mu.Unlock()
				return own
			},
			Forget: func() { s.ForgetOwnNotifications(); once.Do(func() { close(listening) }) },
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	<-listening

	_, _, err = s.SubmitRun(ctx, "r", &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"}, Binding: &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task: &prpv1.Task{Prompt: "x"}, Session: &prpv1.Session{NormalizedSessionId: "s",
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	})
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NotNil(t, c)

	w := h.Watch("r", 0)
	defer w.Close()
	got := make(chan []watch.Event, 4)
	nctx, endNext := context.WithCancel(ctx)
	nextDone := make(chan struct{})
	defer func() { endNext(); <-nextDone }()
	go func() {
		defer close(nextDone)
		for {
			evs, err := w.Next(nctx, nil)
			if err != nil {
				return
			}
			select {
			case got <- evs:
			case <-nctx.Done():
				return
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for h.Watchers("r") == 0 || reads.n.Load() < 2 { // the replay, and the read once joined
		require.True(t, time.Now().Before(deadline), "the watch never joined its feed")
		time.Sleep(time.Millisecond)
	}
	before := reads.n.Load()

	payload, _ := structpb.NewStruct(map[string]any{"delta": "d"})
	evs := make([]*prpv1.Event, 2)
	for i := range evs {
		evs[i] = &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "runner-1", SourceSeq: uint64(i + 1),
			SourceEventId: "e" + string(rune('1'+i)), SourceKind: "runner", RunId: "r", EventType: "item.delta",
			SchemaVersion: 1, Priority: 1, Payload: payload}
	}
	res, err := s.AppendEvents(ctx, c.Fence, evs)
	require.NoError(t, err)
	require.Equal(t, 2, res.Inserted)
	n := 0
	for n < 2 {
		n += len(<-got)
	}
	s.FlushNotifications() // its notification is sent (committed) before the one below
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()
	_, err = other.Exec(ctx, `SELECT pg_notify($1, 'r')`, store.EventsChannel)
	require.NoError(t, err)

	for {
		mu.Lock()
		k := len(notes)
		mu.Unlock()
		if k >= 2 && reads.n.Load() > before {
			break
		}
		require.True(t, time.Now().Before(deadline), "notifications %d, reads %d", k, reads.n.Load()-before)
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	require.Equal(t, []seen{{"r", true}, {"r", false}}, notes, "the store's own notification, then another process's")
	mu.Unlock()
	require.EqualValues(t, 1, reads.n.Load()-before, "one read: the other process's notification's; none for the commit offered")
}
