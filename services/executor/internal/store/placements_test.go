package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/placement"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func register(t *testing.T, s *store.Store, id string, capacity, sessions int, labels map[string]string) {
	t.Helper()
	_, err := s.RegisterGateway(context.Background(), store.GatewayAnnouncement{ID: id, Address: "addr-" + id, Labels: labels,
		Capacity: capacity, Sessions: sessions}, gatewayTTL)
	require.NoError(t, err)
}

func place(t *testing.T, s *store.Store, scope string, labels map[string]string) (*store.Placement, error) {
	t.Helper()
	return s.PlaceScope(context.Background(), store.PlaceRequest{Scope: scope, Labels: labels, TTL: gatewayTTL, Fallback: "static"})
}

func TestF2_StorePlacesEachScopeOnceOnTheLeastLoadedGatewayWhoseLabelsMatch(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()

	// An empty registry: every scope goes to the static gateway.
	p, err := place(t, s, "scope-static", nil)
	require.NoError(t, err)
	require.Equal(t, "static", p.GatewayID)
	require.Empty(t, p.Address, "not registered: dialed at -gateway-addr")

	register(t, s, "gw-a", 2, 0, map[string]string{"zone": "a"})
	register(t, s, "gw-b", 4, 1, map[string]string{"zone": "b"})
	// The placement is durable: the scope stays where it was placed.
	p, err = place(t, s, "scope-static", nil)
	require.NoError(t, err)
	require.Equal(t, "static", p.GatewayID)

	// Least loaded relative to capacity (0/2 < 1/4), then counting the
	// placements made since each gateway's last heartbeat.
	var got []string
	for i := range 4 {
		p, err := place(t, s, fmt.Sprintf("scope-%d", i), nil)
		require.NoError(t, err)
		require.Equal(t, "active", p.State)
		require.Equal(t, "addr-"+p.GatewayID, p.Address)
		got = append(got, p.GatewayID)
	}
	require.Equal(t, []string{"gw-a", "gw-b", "gw-b", "gw-a"}, got) // 0/2; 1/2 > 1/4; 1/2 = 2/4 with more free on gw-b; 1/2 < 3/4
	again, err := s.ScopePlacement(ctx, "scope-0", gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, "gw-a", again.GatewayID)

	// Labels select: gw-a is full, a zone=a scope waits; zone=b has room.
	p, err = place(t, s, "scope-zone-b", map[string]string{"zone": "b"})
	require.NoError(t, err)
	require.Equal(t, "gw-b", p.GatewayID)
	_, err = place(t, s, "scope-zone-a", map[string]string{"zone": "a"})
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err))
	require.Contains(t, err.Error(), "at capacity")
	_, err = place(t, s, "scope-zone-c", map[string]string{"zone": "c"})
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err))
	require.Contains(t, err.Error(), "no active gateway has the labels zone=c")
	p, err = s.ScopePlacement(ctx, "scope-zone-a", gatewayTTL)
	require.NoError(t, err)
	require.Nil(t, p, "nothing written for a scope that could not be placed")

	// A heartbeat announcing fewer sessions frees capacity.
	register(t, s, "gw-a", 2, 1, map[string]string{"zone": "a"})
	p, err = place(t, s, "scope-zone-a", map[string]string{"zone": "a"})
	require.NoError(t, err)
	require.Equal(t, "gw-a", p.GatewayID)

	// Lost and draining gateways take no new placements.
	register(t, s, "gw-c", 100, 0, nil)
	silence(t, s, "gw-c", gatewayTTL+time.Second)
	_, err = s.DrainGateway(ctx, "gw-b", "maintenance", gatewayTTL)
	require.NoError(t, err)
	_, err = place(t, s, "scope-late", nil)
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err))
}

func TestF2_ConcurrentPlacementsCountEachOther(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	register(t, s, "gw-a", 10, 0, nil)
	register(t, s, "gw-b", 20, 0, nil)
	register(t, s, "gw-c", 30, 0, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	per := map[string]int{}
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := place(t, s, fmt.Sprintf("burst-%d", i), nil)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			per[p.GatewayID]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Equal(t, map[string]int{"gw-a": 5, "gw-b": 10, "gw-c": 15}, per, "spread by capacity, no pile-up between heartbeats")
}

func TestF2_ADeferredRunIsQueuedWithItsReasonAndKeepsItsAttempt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "waits")
	c, err := s.ClaimRun(ctx, "waits", "owner-1", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Attempt)
	require.NoError(t, s.DeferRun(ctx, c.Fence, failure.GatewayCapacityExhausted, "every active gateway is at capacity", 0))
	run, err := s.GetRun(ctx, "waits")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
	require.EqualValues(t, 0, run.GetAttempt())
	require.Nil(t, run.GetStartedAt())
	require.Empty(t, run.GetLeaseOwner())
	require.Equal(t, string(failure.GatewayCapacityExhausted), run.GetQueuedReason().GetCode())
	require.Contains(t, run.GetQueuedReason().GetMessage(), "capacity")
	// The old fence holds nothing now.
	require.EqualValues(t, failure.NativeSessionLeaseLost, failure.CodeOf(s.DeferRun(ctx, c.Fence, failure.GatewayCapacityExhausted, "", 0)))

	// Claimed again and placed: the reason is gone.
	again, err := s.ClaimNext(ctx, "owner-2", time.Minute, ctl)
	require.NoError(t, err)
	require.Equal(t, "waits", again.RunID)
	require.EqualValues(t, 1, again.Attempt, "the deferral spent no attempt")
	_, err = s.PlaceScope(ctx, store.PlaceRequest{Scope: again.Scope(), RunID: "waits", TTL: gatewayTTL, Fallback: "static"})
	require.NoError(t, err)
	run, err = s.GetRun(ctx, "waits")
	require.NoError(t, err)
	require.Nil(t, run.GetQueuedReason())
}

func TestF4_AScopeMovesOffADrainedGatewayOnlyWhileIdleAndItsCheckpointIsCurrent(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	register(t, s, "gw-a", 10, 0, nil)
	in := e13Input("acme", "agent-1", "ws-1", "drain-1")
	sc := scope.OfRun("d1", in)
	e13Run(t, s, "d1", in, store.StateSucceeded)
	p, err := s.PlaceScope(ctx, store.PlaceRequest{Scope: sc, RunID: "d1", TTL: gatewayTTL})
	require.NoError(t, err)
	require.Equal(t, "gw-a", p.GatewayID)

	// The only gateway is drained: the scope is listed but has nowhere to go.
	g, err := s.DrainGateway(ctx, "gw-a", "kernel upgrade", gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_DRAINING, g.GetState())
	require.Equal(t, "kernel upgrade", g.GetDrain().GetReason())
	require.EqualValues(t, 1, g.GetDrain().GetRemainingScopes())
	require.False(t, g.GetDrain().GetDone())
	// A heartbeat (not draining itself) does not undo it.
	register(t, s, "gw-a", 10, 0, nil)
	_, err = s.DrainGateway(ctx, "gw-x", "", gatewayTTL)
	require.EqualValues(t, failure.GatewayNotFound, failure.CodeOf(err))
	require.Equal(t, codes.NotFound, status.Code(err))

	moves, err := s.ScopesToMove(ctx, gatewayTTL, 10)
	require.NoError(t, err)
	require.Len(t, moves, 1)
	require.Equal(t, store.ScopeToMove{Scope: sc, GatewayID: "gw-a", Address: "addr-gw-a", LastRunID: "d1", Input: moves[0].Input}, moves[0])
	_, err = s.RePlace(ctx, store.PlaceRequest{Scope: sc, TTL: gatewayTTL}, store.Move{From: "gw-a", Idle: true})
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err), "never back onto the gateway it leaves")

	// While moving, the scope's runs wait (Placement.Moving); a run
	// queued in the scope refuses the move's start.
	ok, err := s.BeginMove(ctx, sc, "gw-a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	p, err = s.ScopePlacement(ctx, sc, gatewayTTL)
	require.NoError(t, err)
	require.True(t, p.Moving)
	require.NoError(t, s.EndMove(ctx, sc, "gw-a"))
	e13Run(t, s, "d2", in, store.StateQueued)
	ok, err = s.BeginMove(ctx, sc, "gw-a", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a run is queued in the scope")
	moves, err = s.ScopesToMove(ctx, gatewayTTL, 10)
	require.NoError(t, err)
	require.Empty(t, moves)
	g, err = s.DrainGateway(ctx, "gw-a", "", gatewayTTL)
	require.NoError(t, err)
	require.EqualValues(t, 1, g.GetDrain().GetBusyScopes())
	c, err := s.ClaimRun(ctx, "d2", "owner-d2", time.Minute, ctl, nil, nil)
	require.NoError(t, err)

	// Another gateway registers; a run in flight still refuses an idle move.
	register(t, s, "gw-b", 10, 0, nil)
	_, err = s.RePlace(ctx, store.PlaceRequest{Scope: sc, TTL: gatewayTTL}, store.Move{From: "gw-a", Idle: true})
	require.ErrorIs(t, err, store.ErrMoveRefused)
	_, err = s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event("d2", "runner-d2", 1, store.EventTerminal,
		map[string]any{"turnTerminalState": "completed", "runTerminalState": store.StateSucceeded})})
	require.NoError(t, err)

	// A checkpoint that a later run superseded refuses the move.
	rec := store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "drain-1", LastRunID: "d2",
		Stamp: &backupv1.Stamp{CheckpointId: "cp-1", SessionScope: sc}, CheckpointID: "cp-1", ManifestDigest: "sha256:00"}
	_, err = s.RecordCheckpoint(ctx, rec)
	require.NoError(t, err)
	require.NoError(t, s.SupersedeCheckpoints(ctx, sc))
	_, err = s.RePlace(ctx, store.PlaceRequest{Scope: sc, TTL: gatewayTTL}, store.Move{From: "gw-a", Idle: true, Checkpoint: "cp-1"})
	require.ErrorIs(t, err, store.ErrMoveRefused)
	rec.CheckpointID, rec.Stamp = "cp-2", &backupv1.Stamp{CheckpointId: "cp-2", SessionScope: sc}
	_, err = s.RecordCheckpoint(ctx, rec)
	require.NoError(t, err)
	p, err = s.RePlace(ctx, store.PlaceRequest{Scope: sc, TTL: gatewayTTL}, store.Move{From: "gw-a", Idle: true, Checkpoint: "cp-2", Drained: true})
	require.NoError(t, err)
	require.Equal(t, "gw-b", p.GatewayID)
	require.False(t, p.Moving)
	// Moved once: a second move from gw-a is refused.
	_, err = s.RePlace(ctx, store.PlaceRequest{Scope: sc, TTL: gatewayTTL}, store.Move{From: "gw-a"})
	require.ErrorIs(t, err, store.ErrMoveRefused)

	gs, err := s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, "gw-a", gs[0].GetGatewayId())
	require.EqualValues(t, 0, gs[0].GetPlacedScopes())
	require.True(t, gs[0].GetDrain().GetDone())
	require.EqualValues(t, 1, gs[0].GetDrain().GetMovedScopes())
	require.EqualValues(t, 1, gs[1].GetPlacedScopes())
	require.Nil(t, gs[1].GetDrain())

	// The drained gateway restarts (it announced its shutdown, then is
	// back): the drain is over and it takes placements again.
	_, err = s.RegisterGateway(ctx, store.GatewayAnnouncement{ID: "gw-a", Address: "addr-gw-a", Capacity: 10, Draining: true}, gatewayTTL)
	require.NoError(t, err)
	register(t, s, "gw-a", 10, 0, nil)
	gs, err = s.ListGateways(ctx, gatewayTTL)
	require.NoError(t, err)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_ACTIVE, gs[0].GetState())
	require.Nil(t, gs[0].GetDrain())
}

// A heartbeat lags the gateway: one counted before a scope's runner came up
// says 0 sessions although the scope is resident. Its run ended after that
// heartbeat, so the scope still fills a capacity-1 gateway; a later
// heartbeat that counts no session (the scope was suspended) frees it.
func TestF2_AScopeWhoseRunnerCameUpAfterTheLastHeartbeatStillFillsItsGateway(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	register(t, s, "gw-a", 1, 0, nil)
	submitted(t, s, "first")
	var scope string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT session_scope FROM executor.runs WHERE run_id = 'first'`).Scan(&scope))
	p, err := place(t, s, scope, nil)
	require.NoError(t, err)
	require.Equal(t, "gw-a", p.GatewayID)
	register(t, s, "gw-a", 1, 0, nil) // counted before the runner came up
	finish(t, s, "first")

	_, err = place(t, s, "second-scope", nil)
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err), "the first scope's runner holds the only place")

	register(t, s, "gw-a", 1, 1, nil) // the runner is counted
	_, err = place(t, s, "second-scope", nil)
	require.EqualValues(t, failure.GatewayCapacityExhausted, failure.CodeOf(err))

	// The run ended well before the next heartbeat, which counts no
	// session (the scope was suspended): the place is free.
	_, err = s.Pool().Exec(ctx, `UPDATE executor.runs SET ended_at = ended_at - interval '3 seconds' WHERE run_id = 'first'`)
	require.NoError(t, err)
	register(t, s, "gw-a", 1, 0, nil)
	p, err = place(t, s, "second-scope", nil)
	require.NoError(t, err)
	require.Equal(t, "gw-a", p.GatewayID)
}

// TestP4_ALockedPlacementReadStillWaitsForAMoveAndLeavesNoSettingBehind: the
// read a driver makes before each attach commits asynchronously (no WAL
// flush for its row lock) but keeps its lock: a move holding the row is
// waited for, and the read returns where the move put the scope. The
// setting ends with the read's own transaction.
func TestP4_ALockedPlacementReadStillWaitsForAMoveAndLeavesNoSettingBehind(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	register(t, s, "gw-a", 10, 0, nil)
	register(t, s, "gw-b", 10, 0, nil)
	p, err := place(t, s, "scope-locked", nil)
	require.NoError(t, err)
	from, to := p.GatewayID, "gw-b"
	if from == to {
		to = "gw-a"
	}

	// A move in progress: the row is locked, the new gateway not committed.
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var movePID int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&movePID))
	_, err = tx.Exec(ctx, `SELECT 1 FROM executor.placements WHERE session_scope = 'scope-locked' FOR UPDATE`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE executor.placements SET gateway_id = $1 WHERE session_scope = 'scope-locked'`, to)
	require.NoError(t, err)

	got := make(chan *store.Placement, 1)
	go func() {
		p, err := s.ScopePlacement(ctx, "scope-locked", gatewayTTL)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	// The read waits on the move's lock.
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND $1 = ANY (pg_blocking_pids(pid))`, movePID).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, to, (<-got).GatewayID, "the read returns the committed move")

	// No connection of the pool keeps the read's setting: each has the
	// session's own value (test clusters run with it off, durable ones on).
	for range 4 {
		c, err := s.Pool().Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		var source string
		require.NoError(t, c.QueryRow(ctx, `SELECT source FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&source))
		require.NotEqual(t, "session", source)
	}
}

// TestF7_AnUnplacedRunIsClaimedLessOftenTheLongerItWaits: a run handed back
// unplaced waits the poll interval at first; once it has waited long for
// the same reason (a lost gateway, SPEC F7) its next claim is
// placement.MaxDeferDelay away, not one poll; a new reason starts the
// count again, and placing the run clears it.
func TestF7_AnUnplacedRunIsClaimedLessOftenTheLongerItWaits(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submitted(t, s, "waits-long")
	delay := func() time.Duration {
		var d time.Duration
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT next_attempt_at - now() FROM executor.coordinators WHERE run_id = 'waits-long'`).Scan(&d))
		return d
	}
	claim := func() *store.Claim {
		_, err := s.Pool().Exec(ctx, `UPDATE executor.coordinators SET next_attempt_at = now() WHERE run_id = 'waits-long'`)
		require.NoError(t, err)
		c, err := s.ClaimNext(ctx, "owner-1", time.Minute, ctl)
		require.NoError(t, err)
		require.Equal(t, "waits-long", c.RunID)
		return c
	}
	c, err := s.ClaimRun(ctx, "waits-long", "owner-1", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	require.NoError(t, s.DeferRun(ctx, c.Fence, failure.WaitingForGateway, "its gateway is lost", time.Second))
	require.InDelta(t, time.Second.Seconds(), delay().Seconds(), 0.5, "first deferral: one poll")

	_, err = s.Pool().Exec(ctx, `UPDATE executor.runs SET queued_since = now() - interval '10 minutes' WHERE run_id = 'waits-long'`)
	require.NoError(t, err)
	require.NoError(t, s.DeferRun(ctx, claim().Fence, failure.WaitingForGateway, "its gateway is lost", time.Second))
	require.InDelta(t, placement.MaxDeferDelay.Seconds(), delay().Seconds(), 0.5, "after ten minutes of waiting: the cap")
	require.NoError(t, s.DeferRun(ctx, claim().Fence, failure.WaitingForGateway, "its gateway is lost", time.Second))
	require.InDelta(t, placement.MaxDeferDelay.Seconds(), delay().Seconds(), 0.5, "the same reason keeps its start")

	require.NoError(t, s.DeferRun(ctx, claim().Fence, failure.GatewayCapacityExhausted, "every active gateway is at capacity", time.Second))
	require.InDelta(t, time.Second.Seconds(), delay().Seconds(), 0.5, "a new reason starts again")

	again := claim()
	_, err = s.PlaceScope(ctx, store.PlaceRequest{Scope: again.Scope(), RunID: "waits-long", TTL: gatewayTTL, Fallback: "static"})
	require.NoError(t, err)
	var since *time.Time
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT queued_since FROM executor.runs WHERE run_id = 'waits-long'`).Scan(&since))
	require.Nil(t, since, "placed: no longer waiting")
}

func TestF2_AScopeThatRanBeforePlacementsExistedStaysOnTheStaticGateway(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	placeRun := func(runID, session string) *store.Placement {
		t.Helper()
		_, _, err := s.SubmitRun(ctx, runID, input(session, "x"))
		require.NoError(t, err)
		p, err := s.PlaceScope(ctx, store.PlaceRequest{Scope: scope.OfRun(runID, input(session, "x")), RunID: runID,
			TTL: gatewayTTL, Fallback: "static"})
		require.NoError(t, err)
		return p
	}
	// A run of the scope started before any placement (its root is on the
	// static gateway); then a gateway registers.
	claimed(t, s, "ran-before", "owner-1")
	_, _, err := s.SubmitRun(ctx, "queued-only", input("s-queued-only", "x"))
	require.NoError(t, err)
	register(t, s, "gw-a", 10, 0, nil)

	require.Equal(t, "static", placeRun("ran-before-2", "s-ran-before").GatewayID, "a scope that ran stays where its root is")
	require.Equal(t, "gw-a", placeRun("queued-only-2", "s-queued-only").GatewayID, "a run that never started left no root")
	require.Equal(t, "gw-a", placeRun("fresh", "s-fresh").GatewayID, "the run being placed does not count")
}
