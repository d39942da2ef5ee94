package store_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func claimed(t *testing.T, s *store.Store, runID, owner string) *store.Claim {
	t.Helper()
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, runID, input("s-"+runID, "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, owner, time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Equal(t, runID, c.RunID)
	return c
}

func deltas(run, inst string, from, n int) []*prpv1.Event {
	evs := make([]*prpv1.Event, n)
	for i := range evs {
		evs[i] = event(run, inst, uint64(from+i), "item.delta", map[string]any{"delta": fmt.Sprintf("d%d", from+i), "n": from + i})
	}
	return evs
}

// The one-statement append: contiguous run-local seqs across batches and
// source instances, the deterministic bytes and their sha256 stored, the
// run's event count bumped, listeners notified.
func TestG4_FastAppendKeepsSeqsContiguousAndStoresTheDeterministicBytes(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")

	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+store.EventsChannel)
	require.NoError(t, err)

	batch := append(deltas("r", "runner-1", 1, 40), deltas("r", "runner-2", 1, 3)...)
	res, err := s.AppendEvents(ctx, c.Fence, batch)
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Inserted: 43}, res)
	res, err = s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 41, 24))
	require.NoError(t, err)
	require.Equal(t, 24, res.Inserted)

	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	note, err := conn.Conn().WaitForNotification(nctx)
	require.NoError(t, err)
	require.Equal(t, "r", note.Payload)

	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 67, run.GetEventCount())
	evs, err := s.EventsAfter(ctx, "r", 0, 100)
	require.NoError(t, err)
	require.Len(t, evs, 67)
	want := append(batch, deltas("r", "runner-1", 41, 24)...)
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq)
		require.True(t, proto.Equal(want[i], e.Event), "event %d", i+1)
	}

	rows, err := s.Pool().Query(ctx, `SELECT seq, writer_attempt, payload_sha256, event FROM executor.events WHERE run_id = 'r' ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	for i := 0; rows.Next(); i++ {
		var (
			seq, writer int64
			sum, raw    []byte
		)
		require.NoError(t, rows.Scan(&seq, &writer, &sum, &raw))
		det, err := proto.MarshalOptions{Deterministic: true}.Marshal(want[i])
		require.NoError(t, err)
		require.Equal(t, det, raw, "seq %d stores the deterministic encoding", seq)
		h := sha256.Sum256(det)
		require.Equal(t, h[:], sum)
		require.EqualValues(t, c.Attempt, writer)
	}
	require.NoError(t, rows.Err())
}

// A batch that replays stored events takes the careful path: the fast
// statement writes nothing, the duplicates are dropped, the new events get
// the next seqs, and a replay with other bytes is refused whole.
func TestG4_FastAppendFallsBackOnAReplayAndWritesNothingTwice(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 10))
	require.NoError(t, err)

	res, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 6, 10))
	require.NoError(t, err)
	require.Equal(t, store.AppendResult{Inserted: 5, Duplicates: 5}, res)

	changed := deltas("r", "runner-1", 14, 5)
	changed[1] = event("r", "runner-1", 15, "item.delta", map[string]any{"delta": "other bytes"})
	_, err = s.AppendEvents(ctx, c.Fence, changed)
	require.EqualValues(t, failure.NativeEventReplayConflict, failure.CodeOf(err))

	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.EqualValues(t, 15, run.GetEventCount())
	evs, err := s.EventsAfter(ctx, "r", 0, 100)
	require.NoError(t, err)
	require.Len(t, evs, 15)
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq)
		require.EqualValues(t, i+1, e.Event.GetSourceSeq())
	}
}

// A stale writer's fast append writes nothing: no event, no count.
func TestE7_StaleFastAppendWritesNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	stale := c.Fence
	stale.Attempt++
	_, err := s.AppendEvents(ctx, stale, deltas("r", "runner-1", 1, 8))
	require.EqualValues(t, "native_session_lease_lost", failure.CodeOf(err))
	stale = c.Fence
	stale.Owner = "other"
	_, err = s.AppendEvents(ctx, stale, deltas("r", "runner-1", 1, 8))
	require.EqualValues(t, "native_session_lease_lost", failure.CodeOf(err))
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Zero(t, run.GetEventCount())
	evs, err := s.EventsAfter(ctx, "r", 0, 100)
	require.NoError(t, err)
	require.Empty(t, evs)
}

func requireFKViolation(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a PostgreSQL error, got %v", err)
	require.Equal(t, "23503", pgErr.Code, pgErr.Message)
}

// Events and coordinators reference their run as a foreign key would,
// checked once per statement.
func TestRunReferencesHoldLikeForeignKeys(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 2))
	require.NoError(t, err)
	db := s.Pool()

	_, err = db.Exec(ctx, `
INSERT INTO executor.events (run_id, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
VALUES ('r', 3, 'i', 1, 'e', 't', '\x00', '\x00'), ('nope', 1, 'i', 1, 'e', 't', '\x00', '\x00')`)
	requireFKViolation(t, err)
	_, err = db.Exec(ctx, `INSERT INTO executor.coordinators (run_id, session_scope, submit_seq) VALUES ('nope', 's', 99)`)
	requireFKViolation(t, err)
	_, err = db.Exec(ctx, `DELETE FROM executor.runs WHERE run_id = 'r'`)
	requireFKViolation(t, err)
	for _, table := range []string{"runs", "coordinators", "events"} {
		_, err = db.Exec(ctx, `UPDATE executor.`+table+` SET run_id = 'r2' WHERE run_id = 'r'`)
		requireFKViolation(t, err)
	}
	_, err = db.Exec(ctx, `TRUNCATE executor.runs CASCADE`)
	requireFKViolation(t, err)

	// Events of a run not in the database are not filed (careful path).
	res, err := s.AppendEvents(ctx, store.Fence{}, deltas("nope", "runner-9", 1, 1))
	require.NoError(t, err)
	require.Zero(t, res.Inserted)
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM executor.events`).Scan(&n))
	require.Equal(t, 2, n)

	// A run nothing references can still be deleted.
	_, _, err = s.SubmitRun(ctx, "lonely", input("lonely", "x"))
	require.NoError(t, err)
	_, err = db.Exec(ctx, `DELETE FROM executor.coordinators WHERE run_id = 'lonely'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `DELETE FROM executor.runs WHERE run_id = 'lonely'`)
	require.NoError(t, err)
}

// One statement renews exactly the listed leases whose (owner, attempt) is
// current and unexpired: not another lease of the same owner, not a lease
// taken over, expired or finished.
func TestE7_RenewLeasesRenewsExactlyTheListedHeldLeases(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const n = 40
	var leases []store.Lease
	for i := range n {
		c := claimed(t, s, fmt.Sprintf("run-%02d", i), "owner")
		leases = append(leases, store.Lease{RunID: c.RunID, Attempt: c.Attempt})
	}
	other := claimed(t, s, "run-other", "someone-else")
	db := s.Pool()
	expiry := func(run string) time.Time {
		var at time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT lease_expires_at FROM executor.coordinators WHERE run_id = $1`, run).Scan(&at))
		return at
	}

	renewed, err := s.RenewLeases(ctx, "owner", leases, time.Hour)
	require.NoError(t, err)
	require.Len(t, renewed, n)
	for _, l := range leases {
		require.True(t, renewed[l.RunID])
		require.Greater(t, time.Until(expiry(l.RunID)), 50*time.Minute)
	}

	// run-00 expired, run-01 taken over, run-02 finished, run-03 listed with
	// a stale attempt, run-04 held but not listed; a lease of another owner
	// listed under this owner.
	_, err = db.Exec(ctx, `UPDATE executor.coordinators SET lease_expires_at = now() - interval '1 second' WHERE run_id = 'run-00'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE executor.coordinators SET attempt = attempt + 1, lease_owner = 'thief' WHERE run_id = 'run-01'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE executor.coordinators SET phase = 'completed' WHERE run_id = 'run-02'`)
	require.NoError(t, err)
	list := append([]store.Lease{}, leases...)
	list[3].Attempt++
	unlisted := list[4]
	list = append(list[:4], list[5:]...)
	list = append(list, store.Lease{RunID: other.RunID, Attempt: other.Attempt})
	before := expiry(unlisted.RunID)
	otherBefore := expiry(other.RunID)

	renewed, err = s.RenewLeases(ctx, "owner", list, 2*time.Hour)
	require.NoError(t, err)
	require.Len(t, renewed, n-5)
	for _, lost := range []string{"run-00", "run-01", "run-02", "run-03", other.RunID} {
		require.False(t, renewed[lost], lost)
	}
	for _, l := range leases[5:] {
		require.True(t, renewed[l.RunID], l.RunID)
		require.Greater(t, time.Until(expiry(l.RunID)), 110*time.Minute)
	}
	require.Equal(t, before, expiry(unlisted.RunID), "a held lease not listed is not renewed")
	require.Equal(t, otherBefore, expiry(other.RunID), "another owner's lease is not renewed")
	require.Less(t, time.Until(expiry("run-00")), time.Duration(0), "an expired lease stays expired")

	renewed, err = s.RenewLeases(ctx, "owner", nil, time.Hour)
	require.NoError(t, err)
	require.Empty(t, renewed)
}

// Each commit that appends events tells the store's OnEventsCommitted
// function, after the commit: the one-statement append with the events as
// stored, with their seqs (what EventsAfter then reads); the careful path
// (here a run.terminal) with nil, the reader reads them (SPEC P4: the
// run's watchers of this process are woken at the commit).
func TestP4_ACommittedAppendTellsTheStoresListenerWithTheStoredEvents(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	type call struct {
		run string
		evs []store.StoredEvent
	}
	var calls []call
	s.OnEventsCommitted(func(run string, evs []store.StoredEvent) { calls = append(calls, call{run, evs}) })
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 3))
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 4, 2))
	require.NoError(t, err)
	stored, err := s.EventsAfter(ctx, "r", 0, 100)
	require.NoError(t, err)
	require.Len(t, calls, 2)
	require.Equal(t, "r", calls[0].run)
	got := append(calls[0].evs, calls[1].evs...)
	require.Len(t, got, 5)
	for i := range got {
		require.Equal(t, stored[i].Seq, got[i].Seq)
		require.True(t, proto.Equal(stored[i].Event, got[i].Event), "event %d", i)
	}

	// A stale fence commits nothing and tells nobody.
	_, err = s.AppendEvents(ctx, store.Fence{RunID: "r", Owner: "o", Attempt: 9}, deltas("r", "runner-1", 6, 1))
	require.Error(t, err)
	require.Len(t, calls, 2)

	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 6, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	require.Len(t, calls, 3)
	require.Equal(t, call{"r", nil}, calls[2])
}

// EventsAfter reads a run's run.terminal with the run's result, as GetRun
// returns it (usage and cost included), in the same statement: a watcher
// sends the terminal without reading the run again (SPEC P4). Other
// events carry none.
func TestP4_EventsAfterReadsTheTerminalWithTheRunsResult(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	c := claimed(t, s, "r", "o")
	_, err := s.AppendEvents(ctx, c.Fence, deltas("r", "runner-1", 1, 2))
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 3, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded", "finalMessage": "ECHO: x",
		"usage": map[string]any{"inputTokens": 10, "cachedInputTokens": 2, "outputTokens": 3, "costUsd": 0.25},
	})})
	require.NoError(t, err)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.NotNil(t, run.GetResult().GetUsage())
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	require.Nil(t, evs[0].Result)
	require.Nil(t, evs[1].Result)
	require.Equal(t, "run.terminal", evs[2].Event.GetEventType())
	require.True(t, proto.Equal(run.GetResult(), evs[2].Result), "%v vs %v", run.GetResult(), evs[2].Result)
	evs, err = s.EventsAfter(ctx, "r", 2, 10)
	require.NoError(t, err)
	require.True(t, proto.Equal(run.GetResult(), evs[0].Result))
}
