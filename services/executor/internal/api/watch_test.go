package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

// countingReader counts the hub's event reads per run.
type countingReader struct {
	watch.Reader
	mu sync.Mutex
	n  map[string]int
}

func (c *countingReader) EventsAfter(ctx context.Context, runID string, after uint64, limit int) ([]store.StoredEvent, error) {
	c.mu.Lock()
	c.n[runID]++
	c.mu.Unlock()
	return c.Reader.EventsAfter(ctx, runID, after, limit)
}

func (c *countingReader) count(runID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[runID]
}

// claimed submits a run and claims it, for appending its events.
func claimed(t *testing.T, e env, runID string) store.Fence {
	t.Helper()
	in := validInput()
	in.Session.NormalizedSessionId = "s-" + runID
	_, err := e.client.SubmitRun(context.Background(), &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(t, err)
	c, err := e.store.ClaimNext(context.Background(), "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, runID, c.RunID)
	return c.Fence
}

// sized is event seq of run with a payload of about n bytes (a terminal one
// when typ is run.terminal).
func sized(run string, seq uint64, typ string, n int) *prpv1.Event {
	p, _ := structpb.NewStruct(map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed",
		"text": strings.Repeat("x", n)})
	return &prpv1.Event{SourceInstanceId: "runner-1", SourceEventId: fmt.Sprintf("%s-%d", run, seq), SourceSeq: seq,
		RunId: run, EventType: typ, Payload: p}
}

// watcher receives a WatchRun stream into a channel of seqs, closed at the
// stream's end; err holds how it ended (nil at EOF).
type watcher struct {
	seqs chan uint64
	done chan struct{}
	err  error
}

func watchFrom(t *testing.T, ctx context.Context, c executorv1.ExecutorServiceClient, runID string, after uint64) *watcher {
	t.Helper()
	s, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: runID, AfterSeq: after})
	require.NoError(t, err)
	w := &watcher{seqs: make(chan uint64, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.seqs)
		for {
			m, err := s.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					w.err = err
				}
				return
			}
			w.seqs <- m.GetSeq()
		}
	}()
	return w
}

func (w *watcher) next(t *testing.T) uint64 {
	t.Helper()
	select {
	case s, ok := <-w.seqs:
		require.True(t, ok, "the stream ended early: %v", w.err)
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("no event within 20 s")
		return 0
	}
}

func TestWatchRunReadsOncePerNotificationForAllWatchersNoneWhenIdleAndEndsWithTheRun(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := claimed(t, e, "w")
	other := claimed(t, e, "other")

	const n = 50
	watchers := make([]*watcher, n)
	for i := range watchers {
		watchers[i] = watchFrom(t, ctx, e.client, "w", 0)
	}
	require.Eventually(t, func() bool { return e.hub.Watchers("w") == n }, 20*time.Second, 5*time.Millisecond)
	_, err := e.store.AppendEvents(ctx, w, []*prpv1.Event{sized("w", 1, "turn.started", 10)})
	require.NoError(t, err)
	for _, x := range watchers {
		require.EqualValues(t, 1, x.next(t))
	}
	// Every watcher has caught up and joined the run's feed. Idle, they
	// read nothing while another run's events flow through the hub.
	idle := e.reads.count("w")
	ow := watchFrom(t, ctx, e.client, "other", 0)
	for seq := uint64(1); seq <= 3; seq++ {
		_, err := e.store.AppendEvents(ctx, other, []*prpv1.Event{sized("other", seq, "item.delta", 10)})
		require.NoError(t, err)
		require.Equal(t, seq, ow.next(t))
	}
	require.Equal(t, idle, e.reads.count("w"), "idle watchers read nothing")

	// One new event: one read for all 50 watchers.
	_, err = e.store.AppendEvents(ctx, w, []*prpv1.Event{sized("w", 2, "item.delta", 10)})
	require.NoError(t, err)
	for _, x := range watchers {
		require.EqualValues(t, 2, x.next(t))
	}
	require.Equal(t, idle+1, e.reads.count("w"), "one read per notification, whatever the watcher count")

	// The run ends: every stream ends after run.terminal, and the feed retires.
	_, err = e.store.AppendEvents(ctx, w, []*prpv1.Event{sized("w", 3, store.EventTerminal, 10)})
	require.NoError(t, err)
	for _, x := range watchers {
		require.EqualValues(t, 3, x.next(t))
		<-x.done
		require.NoError(t, x.err)
	}
	require.Eventually(t, func() bool { return e.hub.Watchers("w") == 0 }, 20*time.Second, 5*time.Millisecond)
}

func TestWatchRunCutsOffAStalledWatcherWithoutDelayingOthersAndItResumesFromItsCursor(t *testing.T) {
	t.Parallel()
	e := start(t, watch.WithBuffer(16), watch.WithPage(16))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := claimed(t, e, "w")

	// The stalled watcher never reads: its own connection with fixed 64 KiB
	// flow-control windows fills up, the server's Send blocks, and its
	// buffer of 16 events overflows.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	require.NoError(t, err)
	defer conn.Close()
	stalled, err := executorv1.NewExecutorServiceClient(conn).WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w"})
	require.NoError(t, err)
	reader := watchFrom(t, ctx, e.client, "w", 0)
	require.Eventually(t, func() bool { return e.hub.Watchers("w") == 2 }, 20*time.Second, 5*time.Millisecond)

	// 400 events of ≈ 2 KiB (≈ 800 KiB), 10 per batch; the reading watcher
	// gets each batch, in order, before the next is appended.
	const batches, per = 40, 10
	seq := uint64(0)
	for range batches {
		evs := make([]*prpv1.Event, per)
		for i := range evs {
			evs[i] = sized("w", seq+uint64(i)+1, "item.delta", 2048)
		}
		_, err := e.store.AppendEvents(ctx, f, evs)
		require.NoError(t, err)
		for range per {
			seq++
			require.Equal(t, seq, reader.next(t))
		}
	}
	seq++
	_, err = e.store.AppendEvents(ctx, f, []*prpv1.Event{sized("w", seq, store.EventTerminal, 10)})
	require.NoError(t, err)
	require.Equal(t, seq, reader.next(t))
	<-reader.done
	require.NoError(t, reader.err)

	// The stalled one, read at last: a prefix, then watch_consumer_too_slow
	// naming the cursor to resume from.
	var last uint64
	for {
		m, err := stalled.Recv()
		if err != nil {
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.EqualValues(t, failure.WatchConsumerTooSlow, failure.CodeOf(err))
			var after string
			for _, d := range status.Convert(err).Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					after = info.GetMetadata()["after_seq"]
				}
			}
			require.Equal(t, strconv.FormatUint(last, 10), after)
			break
		}
		require.Equal(t, last+1, m.GetSeq())
		last = m.GetSeq()
	}
	require.Less(t, last, seq, "the stalled watcher was cut off before the end")
	resumed := watchFrom(t, ctx, e.client, "w", last)
	for want := last + 1; want <= seq; want++ {
		require.Equal(t, want, resumed.next(t))
	}
	<-resumed.done
	require.NoError(t, resumed.err)
}

func TestWatchRunSendsEachFeedEventEncodedOnceForAllWatchersIdenticalToTheStoredEvent(t *testing.T) {
	t.Parallel()
	var encoded sync.Map // seq → times encoded
	e := start(t, watch.WithEncoder(func(ev store.StoredEvent) (any, error) {
		n, _ := encoded.LoadOrStore(ev.Seq, new(int))
		*n.(*int)++ // the feed goroutine is the only caller
		return api.EncodeWatchEvent(ev)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := claimed(t, e, "enc")

	const n = 20
	streams := make([]executorv1.ExecutorService_WatchRunClient, n)
	for i := range streams {
		s, err := e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "enc"})
		require.NoError(t, err)
		streams[i] = s
	}
	require.Eventually(t, func() bool { return e.hub.Watchers("enc") == n }, 20*time.Second, 5*time.Millisecond)
	want := []*prpv1.Event{sized("enc", 1, "item.delta", 300), sized("enc", 2, "item.delta", 5), sized("enc", 3, store.EventTerminal, 1)}
	for _, ev := range want {
		_, err := e.store.AppendEvents(ctx, f, []*prpv1.Event{ev})
		require.NoError(t, err)
	}
	stored, err := e.store.EventsAfter(ctx, "enc", 0, 10)
	require.NoError(t, err)
	require.Len(t, stored, 3)
	for _, s := range streams {
		for i := range 3 {
			m, err := s.Recv()
			require.NoError(t, err)
			require.EqualValues(t, i+1, m.GetSeq())
			require.True(t, proto.Equal(stored[i].Event, m.GetEvent()), "event %d as stored", i+1)
		}
		_, err := s.Recv()
		require.ErrorIs(t, err, io.EOF)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		times, ok := encoded.Load(seq)
		if !ok {
			continue // read by the watchers themselves before they joined the feed
		}
		require.Equal(t, 1, *times.(*int), "event %d encoded once for %d watchers", seq, n)
	}
	_, ok := encoded.Load(uint64(2))
	require.True(t, ok, "events after every watcher joined come through the feed")
}
