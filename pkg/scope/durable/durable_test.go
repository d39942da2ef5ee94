package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/scope"
)

// The tests below mirror the seed suite "runnerd provider runtime wiring"
// (seeds/002, lines 2971–4800). The seed's mocked backend factory is replaced
// by Authority.Open / Prepare / PlanLaunch over a real state base on disk;
// the seed's database rows for prior runs are PriorRun records.

// execution mirrors the seed's base execution input.
func execution(company, runID, agent, workspace, session string) scope.Params {
	return scope.Params{
		RunID: runID, CompanyID: company, AgentID: agent, IssueID: "issue",
		ExecutionWorkspaceID: workspace, Cwd: "/tmp/tether-native-session-test",
		NormalizedSessionID: session, DriverKind: "codex_app_server",
		Provider:  scope.ProviderConfig{Kind: "codex"},
		Lifecycle: scope.Lifecycle{Mode: scope.LifecyclePerTurn},
	}
}

func keyOf(p scope.Params) *scope.Key { k := p.Key(); return &k }

func terminalPrior(p scope.Params) PriorRun {
	return PriorRun{RunID: p.RunID, Status: "succeeded", Terminal: true, Scope: keyOf(p)}
}

func launch(p scope.Params, runner string) LaunchRequest {
	return LaunchRequest{RunID: p.RunID, Params: p, RunnerInstanceID: runner}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// controlPlane mirrors the seed's durableControlPlaneState.
func controlPlane(id Identity) map[string]any {
	return map[string]any{"schema": ControlPlaneSchema, "identity": id}
}

// runnerState is runner-state.json in runnerd's own layout (nested identity,
// see services/runnerd/internal/statedir/state.go).
func runnerState(id Identity, lifecycle string) map[string]any {
	return map[string]any{
		"schema": RunnerStateSchema,
		"identity": map[string]any{
			"runnerInstanceId": id.RunnerInstanceID, "environmentLeaseId": id.EnvironmentLeaseID,
			"normalizedSessionId": id.NormalizedSessionID, "sessionScope": "scope",
		},
		"lifecycle": lifecycle, "nextSourceSeq": 1, "ackedSourceSeq": 0,
	}
}

// seedRoot writes both identity documents into root.
func seedRoot(t *testing.T, root string, id Identity, lifecycle string) {
	t.Helper()
	writeJSON(t, filepath.Join(root, ControlPlaneDir, ControlPlaneFile), controlPlane(id))
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), runnerState(id, lifecycle))
}

// scopedRootOf opens p once (as the seed's first createRunnerdBackend call
// does) and returns the state directory it was given.
func scopedRootOf(t *testing.T, a *Authority, p scope.Params, runner string) string {
	t.Helper()
	s, err := a.Open(context.Background(), launch(p, runner))
	require.NoError(t, err)
	s.Release()
	return s.Plan.StateDirectory
}

func requireCode(t *testing.T, err error, code string) *failure.Error {
	t.Helper()
	require.Error(t, err)
	require.EqualValues(t, code, failure.CodeOf(err), err.Error())
	require.Contains(t, err.Error(), code)
	var fe *failure.Error
	require.True(t, errors.As(err, &fe))
	return fe
}

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

func quarantineEntries(t *testing.T, base string) []os.DirEntry {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(base, QuarantineDir))
	require.NoError(t, err)
	return es
}

// nothingClaimed: a refused open left no claim behind.
func nothingClaimed(t *testing.T, a *Authority, p scope.Params) {
	t.Helper()
	_, held := a.Claims.Holder(p.Key().RootName())
	require.False(t, held)
}

// Seed: "rejects overlapping runs for the same runnerd provider session scope".
func TestE13_OverlappingRunsOfOneScopeAreRefusedBusy(t *testing.T) {
	a := &Authority{Base: t.TempDir()}
	first := execution("company", "run-runnerd-overlap-first", "agent", "workspace-runnerd-overlap", "session-runnerd-overlap")
	second := first
	second.RunID = "run-runnerd-overlap-second"

	active, err := a.Open(context.Background(), launch(first, "runner-runnerd-overlap"))
	require.NoError(t, err)
	cpBefore, err := os.ReadFile(filepath.Join(active.Plan.StateDirectory, ControlPlaneDir, ControlPlaneFile))
	require.NoError(t, err)

	_, err = a.Open(context.Background(), launch(second, "runner-runnerd-overlap"))
	requireCode(t, err, failure.NativeSessionSupervisorBusy)
	cpAfter, err := os.ReadFile(filepath.Join(active.Plan.StateDirectory, ControlPlaneDir, ControlPlaneFile))
	require.NoError(t, err)
	require.Equal(t, cpBefore, cpAfter, "the refused run touched nothing")
	b, err := active.Tools.Binding()
	require.NoError(t, err, "the active run keeps its tool authority")
	require.Equal(t, first.RunID, b.RunID)

	active.Release() // the first run resolves
	active.Release() // idempotent
	nothingClaimed(t, a, first)
}

// Seed: "rejects a concurrent first-use backend for the same provider session
// scope". The claim is held from before preparation through construction:
// a second open that re-enters while the first still constructs is busy, and
// of two goroutines racing on an empty base exactly one wins.
func TestE13_ConcurrentFirstUseIsBusyWhileTheClaimIsHeld(t *testing.T) {
	first := execution("company", "run-session-concurrent-first", "agent", "workspace-session-concurrent", "session-concurrent-first-use")
	second := first
	second.RunID = "run-session-concurrent-second"

	// Re-entry at the construction boundary.
	a := &Authority{Base: t.TempDir()}
	s, err := a.Open(context.Background(), launch(first, "runner-session-concurrent-first"))
	require.NoError(t, err)
	_, err = a.Open(context.Background(), launch(second, "runner-session-concurrent-second"))
	requireCode(t, err, failure.NativeSessionSupervisorBusy)
	s.Release()

	// Two goroutines racing for a fresh scope.
	for i := 0; i < 50; i++ {
		a := &Authority{Base: t.TempDir()}
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]error, 2)
		sessions := make([]*Session, 2)
		for j, p := range []scope.Params{first, second} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sessions[j], results[j] = a.Open(context.Background(), launch(p, "runner-"+p.RunID))
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for j := range results {
			if results[j] == nil {
				won++
				sessions[j].Release()
			} else {
				requireCode(t, results[j], failure.NativeSessionSupervisorBusy)
			}
		}
		require.Equal(t, 1, won)
	}
}

// The claim registry on its own, raced by two goroutines many times.
func TestE13_ClaimRegistryAdmitsOneOfTwoRacingClaims(t *testing.T) {
	var c Claims
	for i := 0; i < 200; i++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var releases []func()
		busy := 0
		start := make(chan struct{})
		for _, run := range []string{"run-a", "run-b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rel, err := c.Acquire("scope", run)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err))
					busy++
					return
				}
				releases = append(releases, rel)
			}()
		}
		close(start)
		wg.Wait()
		require.Len(t, releases, 1)
		require.Equal(t, 1, busy)
		releases[0]()
		_, held := c.Holder("scope")
		require.False(t, held)
	}
	// A stale release never frees a later claim.
	rel1, err := c.Acquire("scope", "run-a")
	require.NoError(t, err)
	rel1()
	rel2, err := c.Acquire("scope", "run-b")
	require.NoError(t, err)
	rel1()
	holder, held := c.Holder("scope")
	require.True(t, held)
	require.Equal(t, "run-b", holder)
	rel2()
}

// Seed: "carries the verified runner and lease binding into a projectless
// continuation".
func TestE13_ProjectlessContinuationCarriesVerifiedRunnerAndLease(t *testing.T) {
	base := t.TempDir()
	prior := execution("company-projectless-continuation", "run-projectless-prior", "agent", "run-projectless-prior", "session-projectless-continuation")
	continuation := prior
	continuation.RunID, continuation.ExecutionWorkspaceID = "run-projectless-next", "run-projectless-next"

	root := scopedRootOf(t, &Authority{Base: base}, prior, "runner-projectless-stable")
	priorIdentity := Identity{RunID: "run-projectless-prior", NormalizedSessionID: continuation.NormalizedSessionID,
		RunnerInstanceID: "runner-projectless-stable", EnvironmentLeaseID: "lease-projectless-stable"}
	seedRoot(t, root, priorIdentity, "suspended")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	s, err := a.Open(context.Background(), launch(continuation, "runner-new-heartbeat"))
	require.NoError(t, err)
	require.Equal(t, root, s.Plan.StateDirectory)
	require.Equal(t, SourcePriorRun, s.Prepared.Source)
	require.Equal(t, Identity{RunID: "run-projectless-next", NormalizedSessionID: "session-projectless-continuation",
		RunnerInstanceID: "runner-projectless-stable", EnvironmentLeaseID: "lease-projectless-stable"}, s.Plan.Identity.Identity)
	require.Equal(t, "turn-run-projectless-next", s.Plan.Identity.TurnID)
	s.Release()

	// The control plane is now bound to the continuation, so its own restart
	// resumes the same runner and lease although the runner state still
	// names no newer run.
	id, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, "run-projectless-next", id.RunID)
	s, err = a.Open(context.Background(), launch(continuation, "runner-placeholder"))
	require.NoError(t, err)
	require.Equal(t, SourceExactRun, s.Prepared.Source)
	require.Equal(t, "runner-projectless-stable", s.Plan.Identity.RunnerInstanceID)
	require.Equal(t, "lease-projectless-stable", s.Plan.Identity.EnvironmentLeaseID)
	s.Release()
}

// Seed: "uses the native execution workspace as the local provider
// containment root".
func TestE13_LocalContainmentRootIsTheExecutionWorkspace(t *testing.T) {
	a := &Authority{Base: t.TempDir()}
	p := execution("company", "run-native-cancel", "agent", "workspace", "session-native-cancel")
	req := launch(p, "runner-local-workspace")
	req.Environment = map[string]string{"HOME": "/home/runner", EnvWorkspaceCwd: "/untrusted/configured-workspace"}
	s, err := a.Open(context.Background(), req)
	require.NoError(t, err)
	defer s.Release()
	require.Equal(t, p.Cwd, s.Plan.WorkspaceCwd)
	require.Equal(t, p.Cwd, s.Plan.Environment[EnvWorkspaceCwd])
	require.Equal(t, "/home/runner", s.Plan.Environment["HOME"])
	require.Equal(t, "/untrusted/configured-workspace", req.Environment[EnvWorkspaceCwd], "the caller's map is not mutated")
}

// Seed: "atomically migrates legacy unscoped state only for its exact durable
// run identity".
func TestE13_LegacySessionRootMigratesForItsExactRun(t *testing.T) {
	base := t.TempDir()
	legacyExecution := execution("company-legacy-state", "run-legacy-state", "agent", "workspace", "session-legacy-state")
	legacyRoot := filepath.Join(base, sha("session-legacy-state"))
	legacyIdentity := Identity{RunID: "run-legacy-state", NormalizedSessionID: "session-legacy-state",
		RunnerInstanceID: "runner-legacy-state", EnvironmentLeaseID: "lease-legacy-state"}
	seedRoot(t, legacyRoot, legacyIdentity, "ready")

	a := &Authority{Base: base}
	s, err := a.Open(context.Background(), launch(legacyExecution, "runner-legacy-state"))
	require.NoError(t, err)
	s.Release()
	migratedRoot := s.Plan.StateDirectory
	require.NotEqual(t, legacyRoot, migratedRoot)
	require.Equal(t, filepath.Join(base, legacyExecution.Key().RootName()), migratedRoot)
	require.Equal(t, legacyRoot, s.Prepared.MigratedFrom)
	require.False(t, exists(legacyRoot))
	require.True(t, exists(filepath.Join(migratedRoot, ControlPlaneDir, ControlPlaneFile)))
	require.True(t, exists(filepath.Join(migratedRoot, RunnerDir, RunnerStateFile)))
	require.Equal(t, legacyIdentity, s.Plan.Identity.Identity)

	unrelated := legacyExecution
	unrelated.CompanyID, unrelated.RunID = "company-unrelated-state", "run-unrelated-state"
	s2, err := a.Open(context.Background(), launch(unrelated, "runner-unrelated-state"))
	require.NoError(t, err)
	s2.Release()
	require.NotEqual(t, legacyRoot, s2.Plan.StateDirectory)
	require.NotEqual(t, migratedRoot, s2.Plan.StateDirectory)
	require.Equal(t, SourceFresh, s2.Prepared.Source)
}

// Seed: "migrates the former company/session scope into the full native
// session scope".
func TestE13_LegacyCompanySessionRootMigratesIntoTheFullScope(t *testing.T) {
	base := t.TempDir()
	legacyExecution := execution("company-former-scope", "run-former-scope", "agent-former-scope", "workspace-former-scope", "session-former-scope")
	legacyRoot := filepath.Join(base, sha(`["company-former-scope","session-former-scope"]`))
	require.Equal(t, legacyRoot, filepath.Join(base, scope.LegacyCompanySessionRootName("company-former-scope", "session-former-scope")))
	seedRoot(t, legacyRoot, Identity{RunID: "run-former-scope", NormalizedSessionID: "session-former-scope",
		RunnerInstanceID: "runner-former-scope", EnvironmentLeaseID: "lease-former-scope"}, "ready")

	a := &Authority{Base: base}
	s, err := a.Open(context.Background(), launch(legacyExecution, "runner-former-scope"))
	require.NoError(t, err)
	s.Release()
	require.NotEqual(t, legacyRoot, s.Plan.StateDirectory)
	require.False(t, exists(legacyRoot))
	require.True(t, exists(filepath.Join(s.Plan.StateDirectory, ControlPlaneDir, ControlPlaneFile)))
	require.Equal(t, SourceExactRun, s.Prepared.Source)
}

// Seed: "migrates a suspended prior-run authority only when its persisted
// execution has the same full session scope".
func TestE13_LegacySuspendedPriorRunOfTheSameFullScopeMigrates(t *testing.T) {
	base := t.TempDir()
	prior := execution("company-prior-run-scope", "run-prior-run-scope", "agent-prior-run-scope", "workspace-prior-run-scope", "session-prior-run-scope")
	current := prior
	current.RunID = "run-current-run-scope"
	legacyRoot := filepath.Join(base, scope.LegacyCompanySessionRootName(current.CompanyID, current.NormalizedSessionID))
	seedRoot(t, legacyRoot, Identity{RunID: prior.RunID, NormalizedSessionID: prior.NormalizedSessionID,
		RunnerInstanceID: "runner-prior-run-scope", EnvironmentLeaseID: "lease-prior-run-scope"}, "suspended")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	s, err := a.Open(context.Background(), launch(current, "runner-current-run-scope"))
	require.NoError(t, err)
	s.Release()
	require.NotEqual(t, legacyRoot, s.Plan.StateDirectory)
	require.False(t, exists(legacyRoot))
	require.Equal(t, SourcePriorRun, s.Prepared.Source)
	require.Equal(t, Identity{RunID: current.RunID, NormalizedSessionID: current.NormalizedSessionID,
		RunnerInstanceID: "runner-prior-run-scope", EnvironmentLeaseID: "lease-prior-run-scope"}, s.Plan.Identity.Identity)
}

// Seed: "quarantines legacy prior-run state only after the database proves a
// terminal owner in the same full scope".
func TestE13_LegacyTerminalPriorRunWithoutSuspensionIsQuarantined(t *testing.T) {
	base := t.TempDir()
	prior := execution("company-legacy-terminal-unsuspended", "run-legacy-terminal-unsuspended",
		"agent-legacy-terminal-unsuspended", "workspace-legacy-terminal-unsuspended", "session-legacy-terminal-unsuspended")
	current := prior
	current.RunID = "run-after-legacy-terminal-unsuspended"
	legacyRoot := filepath.Join(base, scope.LegacyCompanySessionRootName(current.CompanyID, current.NormalizedSessionID))
	seedRoot(t, legacyRoot, Identity{RunID: prior.RunID, NormalizedSessionID: prior.NormalizedSessionID,
		RunnerInstanceID: "runner-legacy-terminal-unsuspended", EnvironmentLeaseID: "lease-legacy-terminal-unsuspended"}, "ready")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	s, err := a.Open(context.Background(), launch(current, "runner-after-legacy-terminal-unsuspended"))
	fe := requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s, "nothing was started")
	require.False(t, exists(legacyRoot))
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.Contains(t, es[0].Name(), ".identity_indeterminate.")
	require.True(t, strings.HasPrefix(es[0].Name(), filepath.Base(legacyRoot)+"."))
	require.Equal(t, filepath.Join(base, QuarantineDir, es[0].Name()), fe.Metadata[MetaQuarantined])
	require.False(t, exists(filepath.Join(base, current.Key().RootName())), "no scoped root was created")
	nothingClaimed(t, a, current)
}

// Seed: "rejects scoped prior-run state after restart while its heartbeat is
// still running".
func TestE13_ScopedPriorRunStillRunningFailsClosedUntouched(t *testing.T) {
	base := t.TempDir()
	prior := execution("company-running-prior-scope", "run-running-prior-scope", "agent-running-prior-scope",
		"workspace-running-prior-scope", "session-running-prior-scope")
	current := prior
	current.RunID = "run-after-running-prior-scope"
	identity := Identity{RunID: prior.RunID, NormalizedSessionID: prior.NormalizedSessionID,
		RunnerInstanceID: "runner-running-prior-scope", EnvironmentLeaseID: "lease-running-prior-scope"}
	root := scopedRootOf(t, &Authority{Base: base}, prior, identity.RunnerInstanceID)
	seedRoot(t, root, identity, "suspended")

	running := PriorRun{RunID: prior.RunID, Status: "running", Terminal: false, Scope: keyOf(prior)}
	a := &Authority{Base: base, PriorRuns: PriorRunsOf(running)}
	s, err := a.Open(context.Background(), launch(current, "runner-after-running-prior-scope"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.True(t, exists(root))
	require.False(t, exists(filepath.Join(base, QuarantineDir)))
	got, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, identity, *got, "the root is untouched")
	nothingClaimed(t, a, current)
}

// Seed: "quarantines scoped prior-run state when the heartbeat is terminal
// but runnerd is not suspended".
func TestE13_ScopedTerminalPriorRunWithoutSuspensionIsQuarantined(t *testing.T) {
	base := t.TempDir()
	prior := execution("company-terminal-unsuspended", "run-terminal-unsuspended", "agent-terminal-unsuspended",
		"workspace-terminal-unsuspended", "session-terminal-unsuspended")
	current := prior
	current.RunID = "run-after-terminal-unsuspended"
	identity := Identity{RunID: prior.RunID, NormalizedSessionID: prior.NormalizedSessionID,
		RunnerInstanceID: "runner-terminal-unsuspended", EnvironmentLeaseID: "lease-terminal-unsuspended"}
	root := scopedRootOf(t, &Authority{Base: base}, prior, identity.RunnerInstanceID)
	seedRoot(t, root, identity, "ready")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	s, err := a.Open(context.Background(), launch(current, "runner-after-terminal-unsuspended"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.False(t, exists(root))
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.Contains(t, es[0].Name(), ".identity_indeterminate.")
	nothingClaimed(t, a, current)
}

// Seed: "resumes an existing scoped authority only for the exact current run".
func TestE13_ExistingScopedRootResumesForTheExactRun(t *testing.T) {
	base := t.TempDir()
	current := execution("company-current-scoped-state", "run-current-scoped-state", "agent-current-scoped-state",
		"workspace-current-scoped-state", "session-current-scoped-state")
	identity := Identity{RunID: current.RunID, NormalizedSessionID: current.NormalizedSessionID,
		RunnerInstanceID: "runner-current-scoped-state", EnvironmentLeaseID: "lease-current-scoped-state"}
	a := &Authority{Base: base}
	root := scopedRootOf(t, a, current, identity.RunnerInstanceID)
	seedRoot(t, root, identity, "ready")

	s, err := a.Open(context.Background(), launch(current, "runner-restart-placeholder"))
	require.NoError(t, err)
	defer s.Release()
	require.Equal(t, root, s.Plan.StateDirectory)
	require.Equal(t, SourceExactRun, s.Prepared.Source)
	require.Equal(t, RunnerNotSuspended, s.Prepared.Runner)
	require.Equal(t, identity, s.Plan.Identity.Identity)
}

// exactRunRunnerStateQuarantined is the seed's it.each "quarantines an
// exact-run runner state with %s".
func exactRunRunnerStateQuarantined(t *testing.T, caseName string) {
	base := t.TempDir()
	current := execution("company-"+caseName+"-runner-state", "run-"+caseName+"-runner-state",
		"agent-"+caseName+"-runner-state", "workspace-"+caseName+"-runner-state", "session-"+caseName+"-runner-state")
	identity := Identity{RunID: current.RunID, NormalizedSessionID: current.NormalizedSessionID,
		RunnerInstanceID: "runner-" + caseName + "-runner-state", EnvironmentLeaseID: current.ExecutionWorkspaceID}
	a := &Authority{Base: base}
	root := scopedRootOf(t, a, current, identity.RunnerInstanceID)
	writeJSON(t, filepath.Join(root, ControlPlaneDir, ControlPlaneFile), controlPlane(identity))
	lifecycle := "ready"
	if caseName == "unknown_lifecycle" {
		lifecycle = "future_lifecycle"
	}
	rs := runnerState(identity, lifecycle)
	if caseName == "unknown_schema" {
		rs["schema"] = "tether.runner.durable.state.v999"
	}
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), rs)

	s, err := a.Open(context.Background(), launch(current, "runner-"+caseName+"-retry"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.False(t, exists(root))
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.Contains(t, es[0].Name(), ".identity_indeterminate.")
	nothingClaimed(t, a, current)
}

// Seed: "quarantines an exact-run runner state with unknown_schema".
func TestE13_ExactRunRunnerStateWithUnknownSchemaIsQuarantined(t *testing.T) {
	exactRunRunnerStateQuarantined(t, "unknown_schema")
}

// Seed: "quarantines an exact-run runner state with unknown_lifecycle".
func TestE13_ExactRunRunnerStateWithUnknownLifecycleIsQuarantined(t *testing.T) {
	exactRunRunnerStateQuarantined(t, "unknown_lifecycle")
}

// scopedIdentityFailsClosed is the seed's it.each "fails closed on %s durable
// identity in an existing scoped root".
func scopedIdentityFailsClosed(t *testing.T, caseName string) {
	base := t.TempDir()
	p := execution("company-"+caseName+"-scoped-state", "run-"+caseName+"-scoped-state",
		"agent-"+caseName+"-scoped-state", "workspace-"+caseName+"-scoped-state", "session-"+caseName+"-scoped-state")
	a := &Authority{Base: base}
	root := scopedRootOf(t, a, p, "runner-"+caseName+"-scoped-state")
	cpFile := filepath.Join(root, ControlPlaneDir, ControlPlaneFile)
	switch caseName {
	case "missing":
		require.NoError(t, os.Remove(cpFile))
	case "malformed":
		require.NoError(t, os.WriteFile(cpFile, []byte("{"), 0o600))
	case "unknown_schema":
		doc := controlPlane(Identity{RunID: p.RunID, NormalizedSessionID: p.NormalizedSessionID,
			RunnerInstanceID: "runner-" + caseName + "-scoped-state", EnvironmentLeaseID: p.ExecutionWorkspaceID})
		doc["schema"] = "tether.runner.durable.control-plane-state.v999"
		writeJSON(t, cpFile, doc)
	case "mismatched":
		writeJSON(t, cpFile, controlPlane(Identity{RunID: p.RunID, NormalizedSessionID: "session-owned-by-another-scope",
			RunnerInstanceID: "runner-owned-by-another-scope", EnvironmentLeaseID: "lease-owned-by-another-scope"}))
	}

	s, err := a.Open(context.Background(), launch(p, "runner-"+caseName+"-retry"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.False(t, exists(root))
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.True(t, es[0].IsDir())
	want := ".identity_indeterminate."
	if caseName == "mismatched" {
		want = ".identity_mismatch."
	}
	require.Contains(t, es[0].Name(), want)
	quarantinedControlPlane := filepath.Join(base, QuarantineDir, es[0].Name(), ControlPlaneDir)
	require.True(t, exists(quarantinedControlPlane))
	if caseName != "missing" {
		require.True(t, exists(filepath.Join(quarantinedControlPlane, ControlPlaneFile)))
	}
	fi, err := os.Stat(filepath.Join(base, QuarantineDir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	nothingClaimed(t, a, p)
}

// Seed: "fails closed on missing durable identity in an existing scoped root".
func TestE13_ScopedRootWithMissingIdentityIsQuarantinedIndeterminate(t *testing.T) {
	scopedIdentityFailsClosed(t, "missing")
}

// Seed: "fails closed on malformed durable identity in an existing scoped
// root".
func TestE13_ScopedRootWithMalformedIdentityIsQuarantinedIndeterminate(t *testing.T) {
	scopedIdentityFailsClosed(t, "malformed")
}

// Seed: "fails closed on unknown_schema durable identity in an existing
// scoped root".
func TestE13_ScopedRootWithUnknownIdentitySchemaIsQuarantinedIndeterminate(t *testing.T) {
	scopedIdentityFailsClosed(t, "unknown_schema")
}

// Seed: "fails closed on mismatched durable identity in an existing scoped
// root".
func TestE13_ScopedRootWithAnotherScopesIdentityIsQuarantinedMismatch(t *testing.T) {
	scopedIdentityFailsClosed(t, "mismatched")
}

// Seed: "does not quarantine an unsafe scoped-root symlink".
func TestE13_SymlinkedScopedRootIsUnsafeAndNeverFollowedMovedOrDeleted(t *testing.T) {
	base := t.TempDir()
	p := execution("company-symlink-scoped-state", "run-symlink-scoped-state", "agent-symlink-scoped-state",
		"workspace-symlink-scoped-state", "session-symlink-scoped-state")
	a := &Authority{Base: base}
	root := scopedRootOf(t, a, p, "runner-symlink-scoped-state")
	target := filepath.Join(base, "symlink-target")
	require.NoError(t, os.RemoveAll(root))
	require.NoError(t, os.MkdirAll(target, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(target, "must-remain"), []byte("retained"), 0o600))
	require.NoError(t, os.Symlink(target, root))

	s, err := a.Open(context.Background(), launch(p, "runner-symlink-retry"))
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)
	require.Nil(t, s)
	link, err := os.Readlink(root)
	require.NoError(t, err, "the symlink itself is still there")
	require.Equal(t, target, link)
	b, err := os.ReadFile(filepath.Join(target, "must-remain"))
	require.NoError(t, err)
	require.Equal(t, "retained", string(b))
	es, err := os.ReadDir(target)
	require.NoError(t, err)
	require.Len(t, es, 1, "nothing was written through the symlink")
	require.False(t, exists(filepath.Join(base, QuarantineDir)))
	nothingClaimed(t, a, p)

	// Quarantine itself refuses a symlink too.
	_, err = Quarantine(base, root, IdentityIndeterminate, timeNow())
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)
	require.True(t, exists(root))
}

// Seed: "rejects a suspended prior-run authority whose persisted execution
// belongs to another full session scope".
func TestE13_LegacyPriorRunOfAnotherFullScopeFailsClosedInPlace(t *testing.T) {
	base := t.TempDir()
	current := execution("company-prior-run-mismatch", "run-current-prior-mismatch", "agent-current-prior-mismatch",
		"workspace-prior-mismatch", "session-prior-run-mismatch")
	prior := current
	prior.RunID, prior.AgentID = "run-prior-mismatched-scope", "agent-other-prior-mismatch"
	legacyRoot := filepath.Join(base, scope.LegacyCompanySessionRootName(current.CompanyID, current.NormalizedSessionID))
	seedRoot(t, legacyRoot, Identity{RunID: prior.RunID, NormalizedSessionID: current.NormalizedSessionID,
		RunnerInstanceID: "runner-prior-run-mismatch", EnvironmentLeaseID: "lease-prior-run-mismatch"}, "suspended")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	s, err := a.Open(context.Background(), launch(current, "runner-current-prior-mismatch"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.True(t, exists(legacyRoot))
	require.False(t, exists(filepath.Join(base, QuarantineDir)))
	require.False(t, exists(filepath.Join(base, current.Key().RootName())))
}

// Seed: "fails closed instead of claiming a mismatched former session scope".
func TestE13_LegacyRootOfAnUnrelatedRunFailsClosedInPlace(t *testing.T) {
	base := t.TempDir()
	current := execution("company-mismatched-scope", "run-current-scope", "agent-current-scope",
		"workspace-current-scope", "session-mismatched-scope")
	legacyRoot := filepath.Join(base, scope.LegacyCompanySessionRootName(current.CompanyID, current.NormalizedSessionID))
	writeJSON(t, filepath.Join(legacyRoot, ControlPlaneDir, ControlPlaneFile), controlPlane(Identity{
		RunID: "run-unrelated-scope", NormalizedSessionID: current.NormalizedSessionID,
		RunnerInstanceID: "runner-unrelated-scope", EnvironmentLeaseID: "lease-unrelated-scope"}))

	// The database knows only the current run (the seed's leaseDb).
	a := &Authority{Base: base, PriorRuns: PriorRunsOf(PriorRun{RunID: current.RunID, Status: "running", Scope: keyOf(current)})}
	s, err := a.Open(context.Background(), launch(current, "runner-current-scope"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Nil(t, s)
	require.True(t, exists(filepath.Join(legacyRoot, ControlPlaneDir, ControlPlaneFile)))
	require.False(t, exists(filepath.Join(base, QuarantineDir)))
}

// Seed: "isolates durable state and tool authority for equal session ids in
// different companies".
func TestE13_EqualSessionIDsInDifferentCompaniesIsolateStateAndToolAuthority(t *testing.T) {
	a := &Authority{Base: t.TempDir()}
	scoped := func(company, run string) scope.Params {
		p := execution(company, run, "agent", "workspace", "shared-normalized-session")
		p.Cwd = "/tmp/native-session-isolation"
		p.Provider.ApprovalPolicy = "never"
		return p
	}
	first, err := a.Open(context.Background(), launch(scoped("company-first", "run-first"), "runner-first"))
	require.NoError(t, err)
	defer first.Release()
	second, err := a.Open(context.Background(), launch(scoped("company-second", "run-second"), "runner-second"))
	require.NoError(t, err, "different companies never contend for one claim")
	defer second.Release()
	require.NotEqual(t, first.Plan.StateDirectory, second.Plan.StateDirectory)
	b1, err := first.Tools.Binding()
	require.NoError(t, err)
	require.Equal(t, "run-first", b1.RunID)
	b2, err := second.Tools.Binding()
	require.NoError(t, err)
	require.Equal(t, "run-second", b2.RunID)
}

// Seed: "scopes local durable sessions by agent, workspace, and provider
// profile while reusing them across runs".
func TestE13_ScopeSeparatesAgentWorkspaceAndProviderProfileAndReusesAcrossRuns(t *testing.T) {
	base := t.TempDir()
	scoped := func(run, agent, workspace, provider string) scope.Params {
		p := execution("company-session-scope", run, agent, workspace, "shared-scoped-session")
		p.IssueID, p.Cwd = "issue-session-scope", "/tmp/native-session-scope"
		p.RepoURL, p.Ref, p.Branch = "https://example.test/tether.git", "refs/heads/main", "main"
		p.RuntimeContextDigest = "runtime-context"
		if provider == "opencode" {
			p.DriverKind = "opencode_server"
			p.Provider = scope.ProviderConfig{Kind: "opencode", Model: "openrouter/deepseek/deepseek-v4-flash-0731", PermissionMode: "ask"}
		} else {
			p.Provider = scope.ProviderConfig{Kind: "codex", ApprovalPolicy: "never"}
		}
		return p
	}
	first := scoped("run-session-scope-first", "agent-session-scope", "workspace-session-scope", "codex")
	continuation := scoped("run-session-scope-continuation", "agent-session-scope", "workspace-session-scope", "codex")
	differentAgent := scoped("run-session-scope-agent", "agent-session-scope-other", "workspace-session-scope", "codex")
	differentWorkspace := scoped("run-session-scope-workspace", "agent-session-scope", "workspace-session-scope-other", "codex")
	differentProvider := scoped("run-session-scope-provider", "agent-session-scope", "workspace-session-scope", "opencode")

	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(first))}
	var dirs []string
	var sessions []*Session
	for _, c := range []scope.Params{first, continuation, differentAgent, differentWorkspace, differentProvider} {
		s, err := a.Open(context.Background(), launch(c, "runner-"+c.RunID))
		require.NoError(t, err, c.RunID)
		s.Release()
		dirs = append(dirs, s.Plan.StateDirectory)
		sessions = append(sessions, s)
		if c.RunID == first.RunID {
			seedRoot(t, s.Plan.StateDirectory, Identity{RunID: first.RunID, NormalizedSessionID: first.NormalizedSessionID,
				RunnerInstanceID: "runner-" + first.RunID, EnvironmentLeaseID: first.ExecutionWorkspaceID}, "suspended")
		}
	}
	require.Equal(t, dirs[0], dirs[1])
	require.Equal(t, SourcePriorRun, sessions[1].Prepared.Source)
	require.Equal(t, "runner-"+first.RunID, sessions[1].Plan.Identity.RunnerInstanceID)
	distinct := map[string]bool{dirs[0]: true, dirs[2]: true, dirs[3]: true, dirs[4]: true}
	require.Len(t, distinct, 4)

	_, err := sessions[0].Tools.Binding()
	requireCode(t, err, failure.NativeToolAuthorityEpochRevoked)
	b, err := sessions[1].Tools.Binding()
	require.NoError(t, err)
	require.Equal(t, continuation.RunID, b.RunID)
	require.Equal(t, "issue-session-scope", b.IssueID)
	require.Equal(t, uint64(2), sessions[1].Tools.Epoch())
}

// Seed: "uses the remote workspace for both the runner backend and native
// session".
func TestE13_RemoteWorkspaceIsTheContainmentRootForBackendAndSession(t *testing.T) {
	const remoteCwd = "/home/sandbox/tether-workspace"
	a := &Authority{Base: t.TempDir()}
	p := execution("company", "run-remote-workspace-test", "agent", "workspace", "remote-workspace-session")
	p.Cwd = "/host/tether-workspace"
	p.Provider.ApprovalPolicy = "never"
	req := launch(p, "runner")
	req.Target = Target{Remote: true, RemoteWorkspacePath: remoteCwd}
	s, err := a.Open(context.Background(), req)
	require.NoError(t, err, "remote codex needs no provider pack")
	defer s.Release()
	require.Equal(t, remoteCwd, s.Plan.WorkspaceCwd)
	require.Equal(t, remoteCwd, s.Plan.Environment[EnvWorkspaceCwd])
	require.Equal(t, remoteCwd, s.Plan.Environment[EnvHome])
	require.Equal(t, remoteCwd+"/.codex", s.Plan.Environment[EnvCodexHome])
	// Scoping uses the controller's workspace identity, not the sandbox path.
	require.Equal(t, filepath.Join(a.Base, p.Key().RootName()), s.Plan.StateDirectory)
}

// remoteProviderNeedsPack is the seed's it.each "requires the build-owned
// provider pack before launching remote %s".
func remoteProviderNeedsPack(t *testing.T, provider scope.ProviderConfig, driver string) {
	base := t.TempDir()
	a := &Authority{Base: base}
	p := execution("company", "run-remote-"+provider.Kind+"-rejected", "agent", "workspace", "remote-"+provider.Kind+"-rejected")
	p.Provider, p.DriverKind = provider, driver
	req := launch(p, "runner")
	req.Target = Target{Remote: true, RemoteWorkspacePath: "/home/sandbox/tether-workspace"}
	s, err := a.Open(context.Background(), req)
	requireCode(t, err, failure.RunnerRemoteProviderArtifactIncompatible)
	require.Contains(t, err.Error(), "runner_remote_provider_artifact_incompatible: configure TETHER_PROVIDER_PACK_PATH")
	require.Nil(t, s)
	es, err := os.ReadDir(base)
	require.NoError(t, err)
	require.Empty(t, es, "no durable state was touched")
	nothingClaimed(t, a, p)

	req.Target.ProviderPackPath = "/opt/tether/provider-pack"
	s, err = a.Open(context.Background(), req)
	require.NoError(t, err)
	s.Release()
	require.Equal(t, "/opt/tether/provider-pack", s.Plan.ProviderPackPath)
}

// Seed: "requires the build-owned provider pack before launching remote
// opencode".
func TestE13_RemoteOpenCodeRequiresTheProviderPack(t *testing.T) {
	remoteProviderNeedsPack(t, scope.ProviderConfig{Kind: "opencode"}, "opencode_server")
}

// Seed: "requires the build-owned provider pack before launching remote acpx".
func TestE13_RemoteACPXRequiresTheProviderPack(t *testing.T) {
	remoteProviderNeedsPack(t, scope.ProviderConfig{Kind: "acpx", Agent: "codex"}, "acpx_runtime")
}

// Seed: "passes the isolated ACPX runtime directory to the native backend
// factory".
func TestE13_ACPXGetsAnIsolatedRuntimeDirectoryAndItsPinnedPermissionMode(t *testing.T) {
	a := &Authority{Base: t.TempDir()}
	p := execution("company", "run-native-cancel", "agent", "workspace", "acpx-session")
	p.Cwd, p.DriverKind = "/tmp/acpx-native", "acpx_runtime"
	p.Provider = scope.ProviderConfig{Kind: "acpx", Agent: "codex", Model: "gpt-5.6-sol", PermissionMode: "approve-reads",
		Profile: "acpx@0.13.1/codex@1"}
	s, err := a.Open(context.Background(), launch(p, "runner"))
	require.NoError(t, err)
	defer s.Release()
	require.Contains(t, s.Plan.ACPXRuntimeDirectory, "/runtime/tether-runner/acpx")
	require.True(t, strings.HasPrefix(s.Plan.ACPXRuntimeDirectory, s.Plan.StateDirectory+string(filepath.Separator)))
	require.Equal(t, "acpx", s.Plan.Provider)
	require.Equal(t, "codex", s.Plan.ACPXAgent)
	require.Equal(t, "approve-reads", s.Plan.ACPXPermissionMode)
	require.Equal(t, "gpt-5.6-sol", s.Plan.Model)

	// Another ACPX agent is another scope, so another runtime directory.
	other := p
	other.Provider.Agent = "claude"
	other.RunID = "run-acpx-claude"
	s2, err := a.Open(context.Background(), launch(other, "runner"))
	require.NoError(t, err)
	defer s2.Release()
	require.NotEqual(t, s.Plan.ACPXRuntimeDirectory, s2.Plan.ACPXRuntimeDirectory)
}

// Seed: "passes the persisted OpenCode permission mode to runnerd".
func TestE13_OpenCodePermissionModeReachesTheRunnerUnchanged(t *testing.T) {
	a := &Authority{Base: t.TempDir()}
	p := execution("company", "run-opencode-permissions", "agent", "workspace", "opencode-permissions-session")
	p.DriverKind = "opencode_server"
	p.Provider = scope.ProviderConfig{Kind: "opencode", Model: "openrouter/deepseek/deepseek-v4-flash-0731", PermissionMode: "deny"}
	s, err := a.Open(context.Background(), launch(p, "runner"))
	require.NoError(t, err)
	defer s.Release()
	require.Equal(t, "opencode", s.Plan.Provider)
	require.Equal(t, "deny", s.Plan.OpenCodePermissionMode)
	require.Empty(t, s.Plan.ACPXRuntimeDirectory)
}
