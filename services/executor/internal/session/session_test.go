package session

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// The TestE10_ cases mirror the seed suite "native warm session supervision"
// (seeds/002, lines 2299–2684). The seed's mocked provider sessions are
// plain handles here, its idle timers are replaced by explicit clock values
// passed to Release/Expire, and its mocked database rows are
// durable.PriorRun records.

// handle stands in for a live provider session.
type handle struct{ name string }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// warmExecution mirrors the seed's warm execution input.
func warmExecution(company, run, workspace, cwd, session string) scope.Params {
	return scope.Params{
		RunID: run, CompanyID: company, AgentID: "agent", IssueID: "issue",
		ExecutionWorkspaceID: workspace, Cwd: cwd, NormalizedSessionID: session,
		DriverKind: "codex_app_server", Provider: scope.ProviderConfig{Kind: "codex"},
		Lifecycle: scope.Lifecycle{Mode: scope.LifecycleWarm, IdleTimeout: 20 * time.Millisecond},
	}
}

// runOnce drives one run through the registry as the executor would: acquire,
// attach a new session unless one is reused, release successfully at done.
func runOnce(t *testing.T, r *Registry[*handle], req Request, fresh *handle, done time.Time, idle time.Duration) Acquired[*handle] {
	t.Helper()
	a, err := r.Acquire(req)
	require.NoError(t, err)
	if a.Action != ActionReuse {
		require.True(t, r.Attach(req, fresh))
	}
	require.Empty(t, r.Release(req, true, done, idle))
	return a
}

// Seed: "reuses one session across distinct governed runs and closes it after
// idle expiry" (the in-process path: the live session is handed over).
func TestE10_WarmSessionIsReusedAcrossRunsAndClosedAfterIdleTimeout(t *testing.T) {
	base := warmExecution("company", "run-native-cancel", "workspace", "/tmp/warm-native", "session-warm-native")
	second := base
	second.RunID = "run-native-warm-second"
	idle := base.Lifecycle.EffectiveIdleTimeout()
	var r Registry[*handle]
	shared := &handle{"shared"}

	a1 := runOnce(t, &r, RequestFor(base, false, t0), shared, t0.Add(time.Millisecond), idle)
	require.Equal(t, ActionStart, a1.Action)
	require.Nil(t, a1.Session, "no existing session for the first run")

	a2, err := r.Acquire(RequestFor(second, false, t0.Add(5*time.Millisecond)))
	require.NoError(t, err)
	require.Equal(t, ActionReuse, a2.Action)
	require.Same(t, shared, a2.Session)
	require.Empty(t, a2.Closing)
	require.Empty(t, r.Release(RequestFor(second, false, t0), true, t0.Add(10*time.Millisecond), idle))

	require.Empty(t, r.Expire(t0.Add(29*time.Millisecond)), "not closed before the idle timeout")
	closed := r.Expire(t0.Add(30 * time.Millisecond))
	require.Equal(t, []Closing[*handle]{{Session: shared, Reason: "warm native session idle timeout"}}, closed)
	_, ok := r.Lookup(base.Key().RootName(), base.CompanyID)
	require.False(t, ok)
}

// Seed: "rehydrates a runnerd warm session from its checkpoint under a fresh
// run authority". The durable side runs against a real state base: the first
// run's root holds a suspended runner, the database says the first run
// succeeded, and the second run continues its runner and lease.
func TestE10_RunnerdWarmSessionIsRehydratedUnderAFreshRunAuthority(t *testing.T) {
	stateBase := t.TempDir()
	first := warmExecution("company", "run-runnerd-warm-first", "workspace-runnerd-warm", "/tmp/runnerd-warm-authority", "session-runnerd-warm-authority")
	second := first
	second.RunID = "run-runnerd-warm-second"
	idle := first.Lifecycle.EffectiveIdleTimeout()
	var r Registry[*handle]
	firstSession, secondSession := &handle{"first"}, &handle{"second"}

	// First run: fresh scope, a checkpoint is persisted, the session attached.
	auth := &durable.Authority{Base: stateBase}
	req1 := RequestFor(first, true, t0)
	a1, err := r.Acquire(req1)
	require.NoError(t, err)
	require.Equal(t, ActionStart, a1.Action)
	s1, err := auth.Open(context.Background(), durable.LaunchRequest{RunID: first.RunID, Params: first, RunnerInstanceID: "runner-runnerd-warm"})
	require.NoError(t, err)
	checkpoint := &Checkpoint{ConfigDigest: first.ConfigDigest(), ProviderSessionID: "provider-runnerd-warm",
		Identity: CheckpointIdentity{RunID: first.RunID, SessionID: first.NormalizedSessionID, CompanyID: first.CompanyID,
			IssueID: first.IssueID, AgentID: first.AgentID}, ActiveTurnID: "turn-1"}
	require.True(t, r.Attach(req1, firstSession))
	require.Empty(t, r.Release(req1, true, t0.Add(time.Millisecond), idle))
	s1.Release()

	entries, err := os.ReadDir(stateBase)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.True(t, scope.IsRootName(entries[0].Name()))
	durableRoot := filepath.Join(stateBase, entries[0].Name())
	identity := durable.Identity{RunID: first.RunID, NormalizedSessionID: first.NormalizedSessionID,
		RunnerInstanceID: "runner-runnerd-warm", EnvironmentLeaseID: first.ExecutionWorkspaceID}
	writeJSON(t, filepath.Join(durableRoot, durable.ControlPlaneDir, durable.ControlPlaneFile),
		map[string]any{"schema": durable.ControlPlaneSchema, "identity": identity})
	writeJSON(t, filepath.Join(durableRoot, durable.RunnerDir, durable.RunnerStateFile), map[string]any{
		"schema": durable.RunnerStateSchema, "lifecycle": "suspended",
		"identity": map[string]any{"runnerInstanceId": identity.RunnerInstanceID,
			"environmentLeaseId": identity.EnvironmentLeaseID, "normalizedSessionId": identity.NormalizedSessionID},
	})

	// Second run, within the idle window: the live handle is closed with the
	// rotation reason and the checkpoint is re-bound to the new run.
	req2 := RequestFor(second, true, t0.Add(5*time.Millisecond))
	a2, err := r.Acquire(req2)
	require.NoError(t, err)
	require.Equal(t, ActionRehydrate, a2.Action)
	require.Nil(t, a2.Session, "no existing session is handed over under runnerd")
	require.Equal(t, []Closing[*handle]{{Session: firstSession, Reason: "warm native session authority epoch rotated"}}, a2.Closing)
	require.True(t, a2.LoadCheckpoint)
	persisted, err := RehydrateCheckpoint(checkpoint, second.ConfigDigest(), CheckpointIdentity{RunID: second.RunID,
		SessionID: second.NormalizedSessionID, CompanyID: second.CompanyID, IssueID: second.IssueID, AgentID: second.AgentID})
	require.NoError(t, err)
	require.Equal(t, second.RunID, persisted.Identity.RunID)
	require.Equal(t, second.NormalizedSessionID, persisted.Identity.SessionID)
	require.Equal(t, "provider-runnerd-warm", persisted.ProviderSessionID)
	require.Empty(t, persisted.ActiveTurnID)
	require.Equal(t, first.RunID, checkpoint.Identity.RunID, "the stored checkpoint is not mutated")

	auth.PriorRuns = durable.PriorRunsOf(durable.PriorRun{RunID: first.RunID, Status: "succeeded", Terminal: true, Scope: ptr(first.Key())})
	s2, err := auth.Open(context.Background(), durable.LaunchRequest{RunID: second.RunID, Params: second, RunnerInstanceID: "runner-runnerd-warm"})
	require.NoError(t, err)
	require.Equal(t, durableRoot, s2.Plan.StateDirectory)
	require.Equal(t, durable.SourcePriorRun, s2.Prepared.Source)
	require.Equal(t, second.RunID, s2.Plan.Identity.RunID)
	require.Equal(t, "runner-runnerd-warm", s2.Plan.Identity.RunnerInstanceID)
	_, err = s1.Tools.Binding()
	require.EqualValues(t, failure.NativeToolAuthorityEpochRevoked, failure.CodeOf(err), "the fresh authority revoked the first run's tools")
	s2.Release()

	require.True(t, r.Attach(req2, secondSession))
	require.Empty(t, r.Release(req2, true, t0.Add(6*time.Millisecond), idle))
	closed := r.Expire(t0.Add(26 * time.Millisecond))
	require.Equal(t, []Closing[*handle]{{Session: secondSession, Reason: ReasonIdleTimeout}}, closed)
}

// Seed: "does not replace a different company's warm session with the same
// normalized id".
func TestE10_EqualSessionIDsInDifferentCompaniesNeverShareAWarmSession(t *testing.T) {
	first := warmExecution("company-warm-first", "run-warm-first", "workspace", "/tmp/warm-native-company-isolation", "shared-company-warm-session")
	second := first
	second.CompanyID, second.RunID = "company-warm-second", "run-warm-second"
	require.NotEqual(t, first.Key().RootName(), second.Key().RootName())
	idle := first.Lifecycle.EffectiveIdleTimeout()
	var r Registry[*handle]
	firstSession, secondSession := &handle{"first"}, &handle{"second"}

	a1 := runOnce(t, &r, RequestFor(first, false, t0), firstSession, t0.Add(time.Millisecond), idle)
	require.Equal(t, ActionStart, a1.Action)
	a2 := runOnce(t, &r, RequestFor(second, false, t0.Add(2*time.Millisecond)), secondSession, t0.Add(3*time.Millisecond), idle)
	require.Equal(t, ActionStart, a2.Action, "the other company's session is neither reused")
	require.Empty(t, a2.Closing, "nor closed")

	closed := r.Expire(t0.Add(time.Second))
	require.ElementsMatch(t, []Closing[*handle]{
		{Session: firstSession, Reason: "warm native session idle timeout"},
		{Session: secondSession, Reason: "warm native session idle timeout"},
	}, closed)

	// Even a caller that passes the same (weaker) scope name for both
	// companies gets separate entries.
	var weak Registry[*handle]
	reqA := Request{Scope: "session", CompanyID: "a", ConfigDigest: "d", RunID: "ra", Now: t0}
	reqB := Request{Scope: "session", CompanyID: "b", ConfigDigest: "d", RunID: "rb", Now: t0}
	_, err := weak.Acquire(reqA)
	require.NoError(t, err)
	b, err := weak.Acquire(reqB)
	require.NoError(t, err, "company a's busy session does not make company b busy")
	require.Equal(t, ActionStart, b.Action)
}

// Seed: "replaces an idle warm provider session when its pinned permission
// mode changes" (codex approval policy never → on-request).
func TestE10_PinnedPermissionChangeReplacesTheIdleWarmSession(t *testing.T) {
	base := warmExecution("company", "run-permission-never", "workspace", "/tmp/warm-native-permission", "session-warm-permission")
	base.Provider.ApprovalPolicy = "never"
	base.RuntimeContextDigest = "runtime-context"
	lowered := base
	lowered.RunID = "run-permission-on-request"
	lowered.Provider.ApprovalPolicy = "on-request"
	require.Equal(t, base.Key().RootName(), lowered.Key().RootName(), "same scope")
	require.NotEqual(t, base.ConfigDigest(), lowered.ConfigDigest(), "different pinned configuration")
	idle := base.Lifecycle.EffectiveIdleTimeout()
	var r Registry[*handle]
	firstSession, secondSession := &handle{"first"}, &handle{"second"}

	runOnce(t, &r, RequestFor(base, false, t0), firstSession, t0.Add(time.Millisecond), idle)
	req := RequestFor(lowered, false, t0.Add(2*time.Millisecond))
	a, err := r.Acquire(req)
	require.NoError(t, err)
	require.Equal(t, ActionReplace, a.Action)
	require.Nil(t, a.Session)
	require.Equal(t, []Closing[*handle]{{Session: firstSession, Reason: "warm native session configuration changed"}}, a.Closing)
	// The old configuration's checkpoint is not resumed.
	old := &Checkpoint{ConfigDigest: base.ConfigDigest(), ProviderSessionID: "provider-warm-permission",
		Identity: CheckpointIdentity{RunID: base.RunID, SessionID: base.NormalizedSessionID, CompanyID: base.CompanyID, AgentID: base.AgentID}}
	cp, err := RehydrateCheckpoint(old, lowered.ConfigDigest(), CheckpointIdentity{RunID: lowered.RunID,
		SessionID: lowered.NormalizedSessionID, CompanyID: lowered.CompanyID, AgentID: lowered.AgentID})
	require.NoError(t, err)
	require.Nil(t, cp)
	require.True(t, r.Attach(req, secondSession))
	require.Empty(t, r.Release(req, true, t0.Add(3*time.Millisecond), idle))
	require.Equal(t, []Closing[*handle]{{Session: secondSession, Reason: "warm native session idle timeout"}},
		r.Expire(t0.Add(23*time.Millisecond)))
}

// Every branch of Decide.
func TestE10_DecideTable(t *testing.T) {
	idleEntry := Entry{Scope: "s", CompanyID: "c", ConfigDigest: "d1", RunID: "r1", IdleDeadline: t0.Add(time.Minute)}
	busyEntry := idleEntry
	busyEntry.Busy, busyEntry.IdleDeadline = true, time.Time{}
	req := Request{Scope: "s", CompanyID: "c", ConfigDigest: "d1", RunID: "r2", Now: t0}
	with := func(f func(*Request)) Request { r := req; f(&r); return r }
	entry := func(f func(*Entry)) *Entry { e := idleEntry; f(&e); return &e }
	for _, tc := range []struct {
		name     string
		existing *Entry
		req      Request
		want     Decision
		busy     bool
	}{
		{"no entry", nil, req, Decision{Action: ActionStart, LoadCheckpoint: true}, false},
		{"idle, same config, in process", &idleEntry, req, Decision{Action: ActionReuse}, false},
		{"idle, same config, runnerd", &idleEntry, with(func(r *Request) { r.Runnerd = true }),
			Decision{Action: ActionRehydrate, CloseReason: ReasonAuthorityRotated, LoadCheckpoint: true}, false},
		{"idle, config changed", &idleEntry, with(func(r *Request) { r.ConfigDigest = "d2" }),
			Decision{Action: ActionReplace, CloseReason: ReasonConfigChanged, LoadCheckpoint: true}, false},
		{"idle, config changed, runnerd", &idleEntry, with(func(r *Request) { r.ConfigDigest = "d2"; r.Runnerd = true }),
			Decision{Action: ActionReplace, CloseReason: ReasonConfigChanged, LoadCheckpoint: true}, false},
		{"idle deadline passed", &idleEntry, with(func(r *Request) { r.Now = t0.Add(time.Minute) }),
			Decision{Action: ActionStart, CloseReason: ReasonIdleTimeout, LoadCheckpoint: true}, false},
		{"busy, same config", &busyEntry, req, Decision{}, true},
		{"busy, config changed", &busyEntry, with(func(r *Request) { r.ConfigDigest = "d2" }), Decision{}, true},
		{"another company", entry(func(e *Entry) { e.CompanyID = "c2" }), req, Decision{Action: ActionStart, LoadCheckpoint: true}, false},
		{"another scope", entry(func(e *Entry) { e.Scope = "s2"; e.Busy = true }), req, Decision{Action: ActionStart, LoadCheckpoint: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.existing, tc.req)
			if tc.busy {
				require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Model and runtime-context changes are pinned configuration too; run and
// issue changes are not.
func TestE10_ModelAndRuntimeContextChangesReplaceTheWarmSession(t *testing.T) {
	base := warmExecution("company", "run-1", "workspace", "/tmp/w", "s")
	for name, f := range map[string]func(*scope.Params){
		"model":           func(p *scope.Params) { p.Provider.Model = "gpt-x" },
		"runtime context": func(p *scope.Params) { p.RuntimeContextDigest = "rc-2" },
		"execution mode":  func(p *scope.Params) { p.ExecutionMode = "plan" },
	} {
		next := base
		next.RunID = "run-2"
		f(&next)
		d, err := Decide(&Entry{Scope: base.Key().RootName(), CompanyID: "company", ConfigDigest: base.ConfigDigest(),
			IdleDeadline: t0.Add(time.Minute)}, RequestFor(next, true, t0))
		require.NoError(t, err)
		require.Equal(t, ActionReplace, d.Action, name)
	}
	next := base
	next.RunID, next.IssueID = "run-2", "issue-2"
	d, err := Decide(&Entry{Scope: base.Key().RootName(), CompanyID: "company", ConfigDigest: base.ConfigDigest(),
		IdleDeadline: t0.Add(time.Minute)}, RequestFor(next, true, t0))
	require.NoError(t, err)
	require.Equal(t, ActionRehydrate, d.Action)
}

// Checkpoint rehydration rules.
func TestE10_CheckpointRehydrationRules(t *testing.T) {
	run := CheckpointIdentity{RunID: "r2", SessionID: "s", CompanyID: "c", IssueID: "i2", AgentID: "a"}
	cp := &Checkpoint{ConfigDigest: "d", ProviderSessionID: "p", Terminal: true, SemanticResult: "done",
		Identity: CheckpointIdentity{RunID: "r1", SessionID: "s", CompanyID: "c", IssueID: "i1", AgentID: "a"}}
	got, err := RehydrateCheckpoint(nil, "d", run)
	require.NoError(t, err)
	require.Nil(t, got)
	got, err = RehydrateCheckpoint(cp, "d", run)
	require.NoError(t, err)
	require.Equal(t, &Checkpoint{ConfigDigest: "d", ProviderSessionID: "p", Identity: run}, got)
	for name, id := range map[string]CheckpointIdentity{
		"session": {RunID: "r2", SessionID: "s2", CompanyID: "c", AgentID: "a"},
		"company": {RunID: "r2", SessionID: "s", CompanyID: "c2", AgentID: "a"},
		"agent":   {RunID: "r2", SessionID: "s", CompanyID: "c", AgentID: "a2"},
	} {
		_, err := RehydrateCheckpoint(cp, "d", id)
		require.EqualValues(t, failure.NativeSessionSupervisorCheckpointMismatch, failure.CodeOf(err), name)
	}
}

// A failed run closes its session with the failure reason; a late release
// by an earlier run cannot free or close the current run's session; an
// attach by a run that lost the scope is ignored.
func TestE10_ReleaseIsFencedByRunAndFailureClosesTheSession(t *testing.T) {
	var r Registry[*handle]
	p := warmExecution("c", "run-1", "ws", "/tmp/w", "s")
	req1 := RequestFor(p, false, t0)
	_, err := r.Acquire(req1)
	require.NoError(t, err)
	h := &handle{"h"}
	require.True(t, r.Attach(req1, h))
	require.Equal(t, []Closing[*handle]{{Session: h, Reason: "warm native session failed"}}, r.Release(req1, false, t0, time.Second))

	_, err = r.Acquire(req1)
	require.NoError(t, err)
	require.True(t, r.Attach(req1, h))
	require.Empty(t, r.Release(req1, true, t0, time.Second))
	p2 := p
	p2.RunID = "run-2"
	req2 := RequestFor(p2, true, t0.Add(time.Millisecond))
	a, err := r.Acquire(req2)
	require.NoError(t, err)
	require.Equal(t, ActionRehydrate, a.Action)
	require.Empty(t, r.Release(req1, false, t0, time.Second), "the earlier run no longer holds the scope")
	require.False(t, r.Attach(req1, &handle{"stale"}))
	e, ok := r.Lookup(p.Key().RootName(), "c")
	require.True(t, ok)
	require.True(t, e.Busy)
	require.Equal(t, "run-2", e.RunID)
	// The run never attached a session: releasing removes the reservation.
	require.Empty(t, r.Release(req2, true, t0, time.Second))
	_, ok = r.Lookup(p.Key().RootName(), "c")
	require.False(t, ok)
}

// Two goroutines racing for one scope: exactly one proceeds, the other is
// busy (the reservation is taken before any session exists).
func TestE10_ConcurrentRunsOfOneScopeOneIsBusy(t *testing.T) {
	p := warmExecution("c", "run-a", "ws", "/tmp/w", "s")
	for i := 0; i < 200; i++ {
		var r Registry[*handle]
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 2)
		for j, run := range []string{"run-a", "run-b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := p
				q.RunID = run
				<-start
				_, errs[j] = r.Acquire(RequestFor(q, true, t0))
			}()
		}
		close(start)
		wg.Wait()
		busy := 0
		for _, err := range errs {
			if err != nil {
				require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err))
				busy++
			}
		}
		require.Equal(t, 1, busy)
	}
}

func TestE10_NextDeadlineSchedulesExpiry(t *testing.T) {
	var r Registry[*handle]
	_, ok := r.NextDeadline()
	require.False(t, ok)
	a := warmExecution("c", "r1", "ws-a", "/tmp/a", "s")
	b := warmExecution("c", "r2", "ws-b", "/tmp/b", "s")
	runOnce(t, &r, RequestFor(a, false, t0), &handle{"a"}, t0.Add(time.Second), time.Minute)
	runOnce(t, &r, RequestFor(b, false, t0), &handle{"b"}, t0, time.Minute)
	d, ok := r.NextDeadline()
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Minute), d)
}

func ptr[T any](v T) *T { return &v }

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
}
