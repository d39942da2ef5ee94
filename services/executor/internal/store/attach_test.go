package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestSubmitIsOneIdempotentStatementThatNotifies(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+store.RunsChannel)
	require.NoError(t, err)

	created, err := s.Submit(ctx, "r1", input("s", "hello"))
	require.NoError(t, err)
	require.True(t, created)
	requireNotified(t, conn, "r1")
	run, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
	require.Equal(t, "queued", run.GetPhase())
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "r1", c.RunID, "the coordinator was stored with the run")

	created, err = s.Submit(ctx, "r1", input("s", "hello"))
	require.NoError(t, err)
	require.False(t, created)
	_, err = s.Submit(ctx, "r1", input("s", "another prompt"))
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.EqualValues(t, "run_id_conflict", failure.CodeOf(err))
	// The same run through SubmitRun: one row, the same answer.
	_, created, err = s.SubmitRun(ctx, "r1", input("s", "hello"))
	require.NoError(t, err)
	require.False(t, created)
}

func TestSubmitRacingClientsYieldOneRun(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	createdCount := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created, err := s.Submit(context.Background(), "race", input("s", "same"))
			require.NoError(t, err)
			if created {
				mu.Lock()
				createdCount++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, createdCount)
}

// AttachFacts reads in one round trip what CurrentCheckpoint, PriorRuns and
// PreviousInScope read one by one.
func TestAttachFactsEqualsTheSeparateReads(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := func(prompt string) *prpv1.ExecutionInput { return input("warm", prompt) }
	for _, id := range []string{"w1", "w2", "w3"} {
		_, err := s.Submit(ctx, id, in(id))
		require.NoError(t, err)
	}
	_, err := s.Submit(ctx, "other", input("cold", "x"))
	require.NoError(t, err)
	sc := scope.OfRun("w3", in("w3"))

	check := func(runID string) *store.AttachFacts {
		t.Helper()
		f, err := s.AttachFacts(ctx, runID, sc, in(runID), 16)
		require.NoError(t, err)
		cp, err := s.CurrentCheckpoint(ctx, sc)
		require.NoError(t, err)
		require.True(t, proto.Equal(cp, f.Checkpoint), "checkpoint")
		prior, err := s.PriorRuns(ctx, runID, 16)
		require.NoError(t, err)
		require.Equal(t, e13Summary(prior), e13Summary(f.PriorRuns), "prior runs")
		prevID, prev, err := s.PreviousInScope(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, prevID, f.PreviousRunID)
		require.True(t, proto.Equal(prev, f.PreviousInput), "previous input")
		cancel, err := s.Cancellation(ctx, runID)
		require.NoError(t, err)
		require.True(t, proto.Equal(cancel, f.Cancellation), "cancellation")
		return f
	}
	f := check("w1")
	require.Nil(t, f.Checkpoint)
	require.Empty(t, f.PreviousRunID)
	require.Nil(t, f.PreviousInput)
	require.Len(t, f.PriorRuns, 2)

	stamp := &backupv1.Stamp{CheckpointId: "cp-1", LeaseId: "local-x", SessionScope: sc, Signature: "ab"}
	_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "warm", LastRunID: "w1",
		GatewayScope: sc, Stamp: stamp, CheckpointID: "cp-1", ManifestDigest: "sha256:00", LeaseID: "local-x",
		RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "idle"})
	require.NoError(t, err)
	f = check("w3")
	require.Equal(t, "cp-1", f.Checkpoint.GetCheckpointId())
	require.Equal(t, "w2", f.PreviousRunID)
	require.Equal(t, "w2", f.PreviousInput.GetTask().GetPrompt())
	require.Equal(t, []string{"w2:queued:false", "w1:queued:false"}, e13Summary(f.PriorRuns))
	require.Nil(t, f.Cancellation)

	_, err = s.RecordCancellation(ctx, store.CancelRequest{RunID: "w3", Scope: "run", Reason: "stop", Actor: "test"})
	require.NoError(t, err)
	f = check("w3")
	require.NotNil(t, f.Cancellation)
	_, err = s.AttachFacts(ctx, "missing", sc, in("missing"), 16)
	require.EqualValues(t, "run_not_found", failure.CodeOf(err))
}

// RecordControl writes what SupersedeCheckpoints and AppendControlEvent
// write, in one transaction under the fence.
func TestRecordControlIsFencedAndAppendsControlEventsInOrder(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := input("att", "x")
	sc := scope.OfRun("a1", in)
	_, err := s.Submit(ctx, "a1", in)
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "att", LastRunID: "a1",
		GatewayScope: sc, Stamp: &backupv1.Stamp{CheckpointId: "cp-1"}, CheckpointID: "cp-1", ManifestDigest: "sha256:00",
		LeaseID: "l", RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "idle"})
	require.NoError(t, err)

	stale := c.Fence
	stale.Attempt++
	err = s.RecordControl(ctx, stale, sc, []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a0"}}})
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
	cur, err := s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.NotNil(t, cur, "nothing is written under a stale fence")

	require.NoError(t, s.RecordControl(ctx, c.Fence, sc, []store.ControlEvent{
		{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "a0"}},
		{Type: "session.closed", Payload: &prpv1.SessionClosed{Reason: "r"}},
	}))
	cur, err = s.CurrentCheckpoint(ctx, sc)
	require.NoError(t, err)
	require.Nil(t, cur, "superseded")
	run, err := s.GetRun(ctx, "a1")
	require.NoError(t, err)
	require.EqualValues(t, 2, run.GetEventCount())
	evs, err := s.EventsAfter(ctx, "a1", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, "session.authority_rotated", evs[0].Event.GetEventType())
	require.EqualValues(t, 1, evs[0].Seq)
	require.EqualValues(t, 1, evs[0].Event.GetSourceSeq())
	require.Equal(t, "session.closed", evs[1].Event.GetEventType())
	require.EqualValues(t, 2, evs[1].Seq)
	require.EqualValues(t, 2, evs[1].Event.GetSourceSeq())
	require.Equal(t, store.ControlInstance, evs[1].Event.GetSourceInstanceId())

	// The runner's events follow in the run's log.
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("a1", "runner-1", 1, "run.attached", nil)})
	require.NoError(t, err)
	evs, err = s.EventsAfter(ctx, "a1", 2, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.EqualValues(t, 3, evs[0].Seq)
}

// RecordAttach is RecordControl and RecordRunner in one transaction (one
// commit on the warm path, SPEC P4): a stale fence writes neither.
func TestP4_RecordAttachWritesControlAndRunnerInOneFencedTransaction(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, err := s.Submit(ctx, "b1", input("att1", "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	rotated := []store.ControlEvent{{Type: "session.authority_rotated", Payload: &prpv1.SessionAuthorityRotated{PreviousRunId: "b0"}}}
	rec := store.RunnerRecord{InstanceID: "runner-1", Runner: &prpv1.ProcessInfo{Pid: 42}}

	stale := c.Fence
	stale.Attempt++
	err = s.RecordAttach(ctx, stale, "", rotated, rec)
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(err))
	run, err := s.GetRun(ctx, "b1")
	require.NoError(t, err)
	require.Zero(t, run.GetEventCount())
	require.Empty(t, run.GetRunnerInstanceId())

	require.NoError(t, s.RecordAttach(ctx, c.Fence, "", rotated, rec))
	run, err = s.GetRun(ctx, "b1")
	require.NoError(t, err)
	require.EqualValues(t, 1, run.GetEventCount())
	require.Equal(t, "runner-1", run.GetRunnerInstanceId())
	require.EqualValues(t, 42, run.GetRunnerProcess().GetPid())

	// Without control events it records the runner alone.
	require.NoError(t, s.RecordAttach(ctx, c.Fence, "", nil, store.RunnerRecord{InstanceID: "runner-2"}))
	run, err = s.GetRun(ctx, "b1")
	require.NoError(t, err)
	require.Equal(t, "runner-2", run.GetRunnerInstanceId())
	require.EqualValues(t, 1, run.GetEventCount())
}

// SubmitClaim with AttachReads reads, in its one round trip and after the
// claim, what the claimed run's first attach needs: the facts AttachFacts
// reads and the scope's placement as ScopePlacement reads it (SPEC P4: no
// read between the claim's commit and the Open). A move that holds the
// placement is waited for, as by ScopePlacement.
func TestP4_SubmitClaimReadsTheFirstAttachsFactsAndPlacementInItsRoundTrip(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	in := func(prompt string) *prpv1.ExecutionInput { return input("warm", prompt) }
	sc := scope.OfRun("w2", in("w2"))
	reads := &store.AttachReads{PriorRuns: 16, GatewayTTL: gatewayTTL}

	// The scope's first run: no placement yet, nothing before it.
	created, c, _, err := s.SubmitClaim(ctx, "w1", in("w1"), "o", time.Minute, ctl, reads)
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c.Preread)
	require.Nil(t, c.Preread.Placement, "the scope is not placed: the driver places it")
	require.Empty(t, c.Preread.Facts.PreviousRunID)
	_, err = s.PlaceScope(ctx, store.PlaceRequest{Scope: sc, RunID: "w1", TTL: gatewayTTL, Fallback: "static"})
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("w1", "runner-1", 1, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	stamp := &backupv1.Stamp{CheckpointId: "cp-1", LeaseId: "local-x", SessionScope: sc, Signature: "ab"}
	_, err = s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "warm", LastRunID: "w1",
		GatewayScope: sc, Stamp: stamp, CheckpointID: "cp-1", ManifestDigest: "sha256:00", LeaseID: "local-x",
		RunnerInstanceID: "runner-1", ProviderThreadID: "thread-1", Reason: "idle"})
	require.NoError(t, err)

	// The next run: what it read is what the separate reads see after the commit.
	created, c, _, err = s.SubmitClaim(ctx, "w2", in("w2"), "o", time.Minute, ctl, reads)
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c)
	pre := c.Preread
	require.NotNil(t, pre)
	want, err := s.AttachFacts(ctx, "w2", sc, in("w2"), 16)
	require.NoError(t, err)
	require.Equal(t, "cp-1", pre.Facts.Checkpoint.GetCheckpointId())
	require.True(t, proto.Equal(want.Checkpoint, pre.Facts.Checkpoint), "checkpoint")
	require.True(t, proto.Equal(want.Restorable, pre.Facts.Restorable), "restorable checkpoint")
	require.Equal(t, e13Summary(want.PriorRuns), e13Summary(pre.Facts.PriorRuns), "prior runs")
	require.Equal(t, "w1", pre.Facts.PreviousRunID)
	require.True(t, proto.Equal(want.PreviousInput, pre.Facts.PreviousInput), "previous input")
	require.Equal(t, want.ContinuityRequired, pre.Facts.ContinuityRequired)
	require.Nil(t, pre.Facts.Cancellation)
	require.Nil(t, pre.Facts.Replacement)
	placed, err := s.ScopePlacement(ctx, sc, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, placed, pre.Placement)
	require.Equal(t, "static", pre.Placement.GatewayID)

	// Without a gateway TTL the placement is not read; a run that is not
	// claimed (it waits behind w2) has nothing read for it.
	created, c, _, err = s.SubmitClaim(ctx, "w3", in("w3"), "o", time.Minute, ctl, &store.AttachReads{PriorRuns: 16})
	require.NoError(t, err)
	require.True(t, created)
	require.Nil(t, c)
	created, c, _, err = s.SubmitClaim(ctx, "cold1", input("cold", "x"), "o", time.Minute, ctl, &store.AttachReads{PriorRuns: 16})
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c.Preread)
	require.Nil(t, c.Preread.Placement)

	// A move in progress holds the placement: the claim waits for it and
	// reads where the scope went.
	register(t, s, "gw-a", 10, 0, nil)
	register(t, s, "gw-b", 10, 0, nil)
	mv := scope.OfRun("m1", input("moving", "m1"))
	p, err := place(t, s, mv, nil)
	require.NoError(t, err)
	to := "gw-b"
	if p.GatewayID == to {
		to = "gw-a"
	}
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var movePID int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&movePID))
	_, err = tx.Exec(ctx, `UPDATE executor.placements SET gateway_id = $1 WHERE session_scope = $2`, to, mv)
	require.NoError(t, err)
	got := make(chan *store.Claim, 1)
	go func() {
		_, c, _, err := s.SubmitClaim(ctx, "m1", input("moving", "m1"), "o", time.Minute, ctl, reads)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND $1 = ANY (pg_blocking_pids(pid))`, movePID).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	c = <-got
	require.NotNil(t, c)
	require.Equal(t, to, c.Preread.Placement.GatewayID, "the read returns the committed move")
}
