package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// callerKey marks the context of the call whose statements callerPath
// counts.
type callerKey struct{}

// callerPath records the statements and batches sent with the caller's
// context (callerKey): those the call waited for, not what the store sends
// beside it.
type callerPath struct {
	mu  sync.Mutex
	sql []string
}

func (c *callerPath) add(ctx context.Context, sql string) {
	if ctx.Value(callerKey{}) == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sql = append(c.sql, sql)
}

func (c *callerPath) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sql
	c.sql = nil
	return s
}

func (c *callerPath) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(ctx, d.SQL)
	return ctx
}

func (c *callerPath) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *callerPath) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.add(ctx, "batch")
	return ctx
}

func (c *callerPath) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *callerPath) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// SPEC P4: a runner's batch appended in one statement returns after that
// statement: its notification (for other replicas' watchers; this
// replica's are told in process) is sent beside the caller, which
// acknowledges the batch and takes the next one meanwhile. So is an
// attach's bookkeeping, which the run's first events wait for. Every
// notification still arrives, after the commit it announces. The previous
// code sent it on the caller's path: two statements for the append; four
// for the bookkeeping (now two: its COMMIT goes with its writes too).
func TestP4_AnAppendReturnsWithoutWaitingForItsNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, Migrator)
	path := &callerPath{}
	s, err := store.Open(ctx, dsn, runrules.New(), func(c *pgxpool.Config) { c.ConnConfig.Tracer = path })
	require.NoError(t, err)
	t.Cleanup(s.Close)
	listener, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+store.EventsChannel)
	require.NoError(t, err)
	notified := func(run string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		require.NoError(t, err)
		require.Equal(t, run, n.Payload)
	}

	c := claimed(t, s, "r", "o")
	mine := context.WithValue(ctx, callerKey{}, true)
	rotated := []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "r0"}}}
	require.NoError(t, s.RecordAttach(mine, c.Fence, "s-r", rotated, store.RunnerRecord{InstanceID: "runner-1"}))
	sql := path.take()
	require.Len(t, sql, 2, "BEGIN with the lock and reads, the writes with the COMMIT: %q", sql)
	notified("r")

	for i := range 3 {
		res, err := s.AppendEvents(mine, c.Fence, deltas("r", "runner-1", 1+2*i, 2))
		require.NoError(t, err)
		require.Equal(t, 2, res.Inserted)
		sql = path.take()
		require.Len(t, sql, 1, "the one-statement append alone: %q", sql)
		notified("r")
	}
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 7)
}

// SPEC P4: an attach's bookkeeping hands the control events it appended to
// the store's listener as stored, with their seqs (the run's watchers on
// this replica publish them without reading; the previous code handed
// nothing, so each attach cost the run's feed a read), after the parked
// events it filed first.
func TestP4_AnAttachsControlEventsAreHandedOverAsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	type commit struct {
		run string
		evs []store.StoredEvent
	}
	var (
		mu      sync.Mutex
		commits []commit
	)
	s.OnEventsCommitted(func(run string, evs []store.StoredEvent) {
		mu.Lock()
		defer mu.Unlock()
		commits = append(commits, commit{run, evs})
	})
	c := claimed(t, s, "r", "o")
	rotated := []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "r0"}}}
	require.NoError(t, s.RecordAttach(ctx, c.Fence, "s-r", rotated, store.RunnerRecord{InstanceID: "runner-1"}))
	stored, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, stored, 1)
	mu.Lock()
	require.Len(t, commits, 1)
	got := commits[0]
	mu.Unlock()
	require.Equal(t, "r", got.run)
	require.Len(t, got.evs, 1, "the control event, handed over")
	require.Equal(t, stored[0].Seq, got.evs[0].Seq)
	require.True(t, proto.Equal(stored[0].Event, got.evs[0].Event), "%v\n%v", stored[0].Event, got.evs[0].Event)
}
