package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Migrator is the executor schema for pgtest templates.
var Migrator = pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version"))

func newStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), pgtest.NewDB(t, Migrator), runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func input(session, prompt string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: prompt},
		Session: &prpv1.Session{NormalizedSessionId: session,
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

func event(run, inst string, seq uint64, typ string, payload map[string]any) *prpv1.Event {
	p, _ := structpb.NewStruct(payload)
	return &prpv1.Event{
		Schema: "tether.prp.event.v1", SourceInstanceId: inst, SourceSeq: seq,
		SourceEventId: fmt.Sprintf("event_%s_%016d", inst, seq), SourceKind: "runner",
		RunId: run, EventType: typ, SchemaVersion: 1, Priority: 1, Payload: p,
	}
}

func TestSubmitRunIsIdempotentByRunID(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	run, created, err := s.SubmitRun(ctx, "r1", input("s", "hello"))
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
	require.Equal(t, "queued", run.GetPhase())

	again, created, err := s.SubmitRun(ctx, "r1", input("s", "hello"))
	require.NoError(t, err)
	require.False(t, created)
	require.True(t, proto.Equal(run, again))

	_, _, err = s.SubmitRun(ctx, "r1", input("s", "another prompt"))
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.EqualValues(t, "run_id_conflict", failure.CodeOf(err))

	runs, _, err := s.ListRuns(ctx, store.ListFilter{}, 10, "")
	require.NoError(t, err)
	require.Len(t, runs, 1)
}

func TestSubmitRunRacingClientsYieldOneRun(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	var wg sync.WaitGroup
	createdCount := 0
	var mu sync.Mutex
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, created, err := s.SubmitRun(context.Background(), "race", input("s", "same"))
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

func TestE7_ClaimIsFencedAndSessionOrdered(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i, id := range []string{"a1", "a2"} {
		_, _, err := s.SubmitRun(ctx, id, input("sess-a", fmt.Sprint("turn ", i)))
		require.NoError(t, err)
	}
	_, _, err := s.SubmitRun(ctx, "b1", input("sess-b", "other session"))
	require.NoError(t, err)

	c1, err := s.ClaimNext(ctx, "owner-1", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "a1", c1.RunID)
	require.EqualValues(t, 1, c1.Attempt)
	// a2 waits behind a1 in the same session; b1 is free.
	c2, err := s.ClaimNext(ctx, "owner-2", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "b1", c2.RunID)
	none, err := s.ClaimNext(ctx, "owner-2", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Nil(t, none)

	// Only the exact (owner, attempt) renews.
	renewed, err := s.RenewLeases(ctx, "owner-1", []store.Lease{{RunID: "a1", Attempt: 1}, {RunID: "b1", Attempt: 1}}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"a1": true}, renewed)
	renewed, err = s.RenewLeases(ctx, "owner-1", []store.Lease{{RunID: "a1", Attempt: 2}}, time.Minute)
	require.NoError(t, err)
	require.Empty(t, renewed)
}

func TestE7_ExpiredLeaseIsTakenOverAndStaleWritesChangeNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s", "x"))
	require.NoError(t, err)
	old, err := s.ClaimNext(ctx, "old", time.Millisecond, store.Controller{})
	require.NoError(t, err)
	var taken *store.Claim
	require.Eventually(t, func() bool { // once the 1 ms lease expired in the database clock
		taken, err = s.ClaimNext(ctx, "new", time.Minute, store.Controller{})
		return err == nil && taken != nil
	}, time.Minute, time.Millisecond)
	require.Equal(t, "r", taken.RunID)
	require.EqualValues(t, 2, taken.Attempt)

	_, err = s.AppendEvents(ctx, old.Fence, []*prpv1.Event{event("r", "runner-1", 1, "turn.started", nil)})
	require.EqualValues(t, "native_session_lease_lost", failure.CodeOf(err))
	require.EqualValues(t, "native_session_lease_lost", failure.CodeOf(s.FailRun(ctx, old.Fence, "x_failed", "stale")))
	require.EqualValues(t, "native_session_lease_lost", failure.CodeOf(s.RecordRunner(ctx, old.Fence, "runner-1", nil, nil)))
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Zero(t, run.GetEventCount())
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())
	require.EqualValues(t, 2, run.GetAttempt())
}

func TestG4_AppendEventsDedupesAndRefusesConflicts(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s", "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	batch := []*prpv1.Event{
		event("r", "runner-1", 1, "turn.started", map[string]any{"n": 1}),
		event("r", "runner-1", 2, "item.delta", map[string]any{"delta": "he"}),
	}
	res, err := s.AppendEvents(ctx, c.Fence, batch)
	require.NoError(t, err)
	require.Equal(t, 2, res.Inserted)

	// Identical replay (plus one new event): duplicates are dropped.
	res, err = s.AppendEvents(ctx, c.Fence, append(batch, event("r", "runner-1", 3, "item.delta", map[string]any{"delta": "llo"})))
	require.NoError(t, err)
	require.Equal(t, 1, res.Inserted)
	require.Equal(t, 2, res.Duplicates)

	// Same seq, other bytes: the batch is refused, nothing is written.
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{
		event("r", "runner-1", 4, "item.delta", nil),
		event("r", "runner-1", 2, "item.delta", map[string]any{"delta": "HE"}),
	})
	require.EqualValues(t, failure.NativeEventReplayConflict, failure.CodeOf(err))
	require.Contains(t, err.Error(), "native_event_replay_conflict: source sequence 2 contained different bytes")
	evs, err := s.EventsAfter(ctx, "r", 0, 100)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq)
		require.EqualValues(t, i+1, e.Event.GetSourceSeq())
	}
	n, err := s.HighestContiguousSourceSeq(ctx, "runner-1", 0)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
}

func TestTerminalEventRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s", "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 1, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded", "finalMessage": "ECHO: x",
		"usage": map[string]any{"inputTokens": 10, "cachedInputTokens": 2, "outputTokens": 3},
	})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState())
	require.Equal(t, "completed", run.GetPhase())
	require.Equal(t, "ECHO: x", run.GetResult().GetFinalMessage())
	require.EqualValues(t, 10, run.GetResult().GetUsage().GetInputTokens())
	require.NotNil(t, run.GetEndedAt())
	// A completed run is never claimed again.
	again, err := s.ClaimNext(ctx, "o2", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Nil(t, again)
}

func TestFailRunAppendsOneControlPlaneTerminal(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s", "x"))
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.NoError(t, s.FailRun(ctx, c.Fence, "runner_local_connect_failed", "no runner"))
	run, err := s.GetRun(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_FAILED, run.GetState())
	require.Equal(t, "runner_local_connect_failed", run.GetFailure().GetCode())
	require.Equal(t, "terminal_failure", run.GetPhase())
	evs, err := s.EventsAfter(ctx, "r", 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, "run.terminal", evs[0].Event.GetEventType())
	require.Equal(t, "control_plane", evs[0].Event.GetSourceKind())
}

func TestListRunsPagesNewestFirst(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		_, _, err := s.SubmitRun(ctx, fmt.Sprintf("r%d", i), input("s", fmt.Sprint(i)))
		require.NoError(t, err)
	}
	page1, next, err := s.ListRuns(ctx, store.ListFilter{}, 2, "")
	require.NoError(t, err)
	require.Equal(t, []string{"r4", "r3"}, ids(page1))
	page2, next, err := s.ListRuns(ctx, store.ListFilter{}, 2, next)
	require.NoError(t, err)
	require.Equal(t, []string{"r2", "r1"}, ids(page2))
	page3, next, err := s.ListRuns(ctx, store.ListFilter{}, 2, next)
	require.NoError(t, err)
	require.Equal(t, []string{"r0"}, ids(page3))
	require.Empty(t, next)
	_, _, err = s.ListRuns(ctx, store.ListFilter{}, 2, "garbage!")
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

func ids(runs []*executorv1.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.GetRunId()
	}
	return out
}

// TestE1_TerminalRecordsTheRunsUsageAndUSDCost: the run's result carries
// the normalised usage of its run.terminal event — the run's delta, not the
// session total — and the USD cost (absent for another currency); usage and
// cost are columns of the run (migration 00011).
func TestE1_TerminalRecordsTheRunsUsageAndUSDCost(t *testing.T) {
	tests := []struct {
		name        string
		usage       map[string]any
		want        *executorv1.Usage
		wantSession *executorv1.Usage
		wantCost    *float64
	}{
		{"runner {total, runDelta}: the delta, its cost, the total beside", map[string]any{
			"total":    map[string]any{"inputTokens": 20097, "cachedInputTokens": 8000, "outputTokens": 500, "providerCostUsd": 0.12},
			"runDelta": map[string]any{"inputTokens": 6773, "cacheReadTokens": 1500, "outputTokens": 180, "providerCostUsd": 0.031},
		}, &executorv1.Usage{InputTokens: 6773, CachedInputTokens: 1500, OutputTokens: 180},
			&executorv1.Usage{InputTokens: 20097, CachedInputTokens: 8000, OutputTokens: 500}, proto.Float64(0.031)},
		{"ACPX {cumulative, cost} in USD", map[string]any{
			"cumulative": map[string]any{"inputTokens": 3000, "outputTokens": 240, "cachedReadTokens": 900},
			"cost":       map[string]any{"amount": 0.044, "currency": "USD"},
		}, &executorv1.Usage{InputTokens: 3000, CachedInputTokens: 900, OutputTokens: 240}, nil, proto.Float64(0.044)},
		{"ACPX cost in EUR is no cost", map[string]any{
			"cumulative": map[string]any{"inputTokens": 10, "outputTokens": 1},
			"cost":       map[string]any{"amount": 1.25, "currency": "EUR"},
		}, &executorv1.Usage{InputTokens: 10, OutputTokens: 1}, nil, nil},
		{"flat counters", map[string]any{"inputTokens": 10, "cachedInputTokens": 2, "outputTokens": 3},
			&executorv1.Usage{InputTokens: 10, CachedInputTokens: 2, OutputTokens: 3}, nil, nil},
		{"no usage", nil, nil, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx := context.Background()
			_, _, err := s.SubmitRun(ctx, "r", input("s", "x"))
			require.NoError(t, err)
			c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
			require.NoError(t, err)
			payload := map[string]any{"turnTerminalState": "completed", "runTerminalState": "succeeded", "finalMessage": "done"}
			if tc.usage != nil {
				payload["usage"] = tc.usage
			}
			_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("r", "runner-1", 1, "run.terminal", payload)})
			require.NoError(t, err)
			run, err := s.GetRun(ctx, "r")
			require.NoError(t, err)
			res := run.GetResult()
			require.Equal(t, "done", res.GetFinalMessage())
			require.True(t, proto.Equal(tc.want, res.GetUsage()), "usage %v", res.GetUsage())
			require.True(t, proto.Equal(tc.wantSession, res.GetSessionUsage()), "session usage %v", res.GetSessionUsage())
			if tc.wantCost == nil {
				require.Nil(t, res.CostUsd)
			} else {
				require.NotNil(t, res.CostUsd)
				require.InDelta(t, *tc.wantCost, res.GetCostUsd(), 1e-12)
			}
			// ListRuns reads the same record.
			runs, _, err := s.ListRuns(ctx, store.ListFilter{}, 10, "")
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.True(t, proto.Equal(res, runs[0].GetResult()))
		})
	}
}

// SubmitClaim claims a run in its submitting commit only when it can start
// at once: it heads its idle session scope (SPEC P4, one synced write for
// submit and claim). A run behind a busy scope is queued, answered as
// stored, and not announced (nobody can claim it yet; SPEC P1: a
// notification is a commit of its own, serialised on PostgreSQL's
// notification queue lock).
func TestP4_SubmitClaimClaimsOnlyARunThatHeadsAnIdleScope(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	created, c, _, err := s.SubmitClaim(ctx, "sc1", input("sc", "one"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c)
	require.Equal(t, store.Fence{RunID: "sc1", Owner: "o", Attempt: 1}, c.Fence)
	require.True(t, proto.Equal(input("sc", "one"), c.Input))
	require.NotEmpty(t, c.SessionScope)
	run, err := s.GetRun(ctx, "sc1")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())
	require.Equal(t, "o", run.GetLeaseOwner())

	// The same submission again: not created, not claimed again.
	created, c, _, err = s.SubmitClaim(ctx, "sc1", input("sc", "one"), "o2", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.False(t, created)
	require.Nil(t, c)

	// The next run of the busy scope waits, unannounced: no dispatcher can
	// claim it before sc1 ends. SubmitClaim answers with it as stored.
	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+store.RunsChannel)
	require.NoError(t, err)
	created, c, queued, err := s.SubmitClaim(ctx, "sc2", input("sc", "two"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.Nil(t, c)
	require.Equal(t, "sc2", queued.GetRunId())
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, queued.GetState())
	next, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.Nil(t, next, "sc2 waits behind sc1")
	// A run that heads its idle scope and is not claimed (Submit) is
	// announced, and is the first announcement the listener gets.
	created, err = s.Submit(ctx, "idle1", input("idle", "one"))
	require.NoError(t, err)
	require.True(t, created)
	requireNotified(t, conn, "idle1")
	// Submit does not announce a run behind a busy scope either.
	created, err = s.Submit(ctx, "idle2", input("idle", "two"))
	require.NoError(t, err)
	require.True(t, created)
	created, err = s.Submit(ctx, "idle3", input("idle3", "one"))
	require.NoError(t, err)
	require.True(t, created)
	requireNotified(t, conn, "idle3")

	// Another scope is idle: claimed at once.
	created, c, _, err = s.SubmitClaim(ctx, "other1", input("other", "x"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c)
	require.Equal(t, "other1", c.RunID)
}

// SubmitClaim pipelines its claim behind the submission in one implicit
// transaction; the claim takes only a coordinator that transaction
// inserted. A run submitted before (queued, heading its idle scope, due:
// what any claim would take) is not claimed by submitting it again, with
// its input or another (run_id_conflict, and nothing written).
func TestP4_SubmitClaimNeverClaimsARunItDidNotInsert(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	created, err := s.Submit(ctx, "q1", input("q", "one"))
	require.NoError(t, err)
	require.True(t, created)

	created, c, _, err := s.SubmitClaim(ctx, "q1", input("q", "one"), "o", time.Minute, ctl, nil)
	require.NoError(t, err)
	require.False(t, created)
	require.Nil(t, c)
	_, c, _, err = s.SubmitClaim(ctx, "q1", input("q", "another"), "o", time.Minute, ctl, nil)
	require.EqualValues(t, failure.RunIDConflict, failure.CodeOf(err))
	require.Nil(t, c)
	run, err := s.GetRun(ctx, "q1")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
	require.Empty(t, run.GetLeaseOwner())
	require.Zero(t, run.GetAttempt())

	// It is still the scope's head, claimed as usual.
	next, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
	require.NoError(t, err)
	require.NotNil(t, next)
	require.Equal(t, "q1", next.RunID)
}

// requireNotified waits (bounded) for conn's next notification and checks
// its payload.
func requireNotified(t *testing.T, conn *pgxpool.Conn, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, want, n.Payload)
}
