package durable

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

func timeNow() time.Time { return time.Now() }

// Rule table for prior-run verification (reference digest §5.9).
func TestE13_VerifyPriorRunRules(t *testing.T) {
	want := execution("c", "run-now", "a", "ws", "s")
	prior := want
	prior.RunID = "run-prior"
	other := prior
	other.AgentID = "other-agent"
	id := Identity{RunID: "run-prior", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}
	dbDown := func(context.Context, string) (*PriorRun, error) { return nil, errors.New("connection refused") }
	for _, tc := range []struct {
		name   string
		lookup PriorRunLookup
		runner RunnerLifecycle
		want   Verification
	}{
		{"verified", PriorRunsOf(terminalPrior(prior)), RunnerSuspended, Verified},
		{"no lookup", nil, RunnerSuspended, PriorIndeterminate},
		{"database unavailable", dbDown, RunnerSuspended, PriorUnavailable},
		{"unknown run", PriorRunsOf(), RunnerSuspended, PriorIndeterminate},
		{"still running", PriorRunsOf(PriorRun{RunID: "run-prior", Status: "running", Scope: keyOf(prior)}), RunnerSuspended, PriorActive},
		{"no persisted input", PriorRunsOf(PriorRun{RunID: "run-prior", Terminal: true}), RunnerSuspended, PriorIndeterminate},
		{"other full scope", PriorRunsOf(terminalPrior(other)), RunnerSuspended, PriorScopeMismatch},
		{"runner ready", PriorRunsOf(terminalPrior(prior)), RunnerNotSuspended, PriorTerminalIndeterminate},
		{"runner absent", PriorRunsOf(terminalPrior(prior)), RunnerAbsent, PriorTerminalIndeterminate},
		{"runner indeterminate", PriorRunsOf(terminalPrior(prior)), RunnerIndeterminate, PriorTerminalIndeterminate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := VerifyPriorRun(context.Background(), tc.lookup, want.Key(), id, tc.runner)
			require.Equal(t, tc.want, got)
		})
	}
}

// An unavailable database fails closed as retryable (Unavailable) and
// leaves the root untouched.
func TestE13_PriorRunLookupUnavailableLeavesTheRootUntouched(t *testing.T) {
	base := t.TempDir()
	prior := execution("c", "run-prior", "a", "ws", "s")
	current := prior
	current.RunID = "run-now"
	root := filepath.Join(base, prior.Key().RootName())
	seedRoot(t, root, Identity{RunID: "run-prior", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}, "suspended")
	a := &Authority{Base: base, PriorRuns: func(context.Context, string) (*PriorRun, error) { return nil, errors.New("down") }}
	_, err := a.Open(context.Background(), launch(current, "runner"))
	fe := requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Equal(t, codes.Unavailable, fe.GRPC)
	require.True(t, exists(root))
	require.False(t, exists(filepath.Join(base, QuarantineDir)))
}

// A terminal prior run of another full scope in a scoped root is quarantined
// as a mismatch (in a legacy root it is left in place, see above).
func TestE13_ScopedPriorRunOfAnotherFullScopeIsQuarantinedMismatch(t *testing.T) {
	base := t.TempDir()
	current := execution("c", "run-now", "a", "ws", "s")
	prior := current
	prior.RunID, prior.AgentID = "run-prior", "other-agent"
	root := filepath.Join(base, current.Key().RootName())
	seedRoot(t, root, Identity{RunID: "run-prior", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}, "suspended")
	a := &Authority{Base: base, PriorRuns: PriorRunsOf(terminalPrior(prior))}
	_, err := a.Open(context.Background(), launch(current, "runner"))
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.Contains(t, es[0].Name(), ".identity_mismatch.")
}

// runnerd's nested layout and the flat layout are both understood; a runner
// state bound to another runner or lease is indeterminate.
func TestE13_RunnerStateLayoutsAndIdentityBinding(t *testing.T) {
	id := Identity{RunID: "run", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}
	flat := map[string]any{"schema": RunnerStateSchema, "runId": "run", "normalizedSessionId": "s",
		"runnerInstanceId": "r", "environmentLeaseId": "l", "lifecycle": "suspended"}
	for _, tc := range []struct {
		name string
		doc  any
		want RunnerLifecycle
	}{
		{"nested suspended", runnerState(id, "suspended"), RunnerSuspended},
		{"nested ready", runnerState(id, "ready"), RunnerNotSuspended},
		{"nested draining", runnerState(id, "draining"), RunnerNotSuspended},
		{"flat suspended", flat, RunnerSuspended},
		{"other runner", runnerState(Identity{NormalizedSessionID: "s", RunnerInstanceID: "r2", EnvironmentLeaseID: "l"}, "suspended"), RunnerIndeterminate},
		{"other lease", runnerState(Identity{NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l2"}, "suspended"), RunnerIndeterminate},
		{"other session", runnerState(Identity{NormalizedSessionID: "s2", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}, "suspended"), RunnerIndeterminate},
		{"malformed", "{", RunnerIndeterminate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, RunnerDir, RunnerStateFile)
			if s, ok := tc.doc.(string); ok {
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
				require.NoError(t, os.WriteFile(path, []byte(s), 0o600))
			} else {
				writeJSON(t, path, tc.doc)
			}
			got, _, err := ReadRunnerLifecycle(root, id)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	t.Run("absent and empty", func(t *testing.T) {
		root := t.TempDir()
		got, _, _ := ReadRunnerLifecycle(root, id)
		require.Equal(t, RunnerAbsent, got)
		require.NoError(t, os.Mkdir(filepath.Join(root, RunnerDir), 0o700))
		got, _, _ = ReadRunnerLifecycle(root, id)
		require.Equal(t, RunnerAbsent, got)
		require.NoError(t, os.WriteFile(filepath.Join(root, RunnerDir, "outbox.log"), nil, 0o600))
		got, _, _ = ReadRunnerLifecycle(root, id)
		require.Equal(t, RunnerIndeterminate, got)
	})
	t.Run("symlinked runner dir and file", func(t *testing.T) {
		root, elsewhere := t.TempDir(), t.TempDir()
		writeJSON(t, filepath.Join(elsewhere, RunnerStateFile), runnerState(id, "suspended"))
		require.NoError(t, os.Symlink(elsewhere, filepath.Join(root, RunnerDir)))
		got, _, _ := ReadRunnerLifecycle(root, id)
		require.Equal(t, RunnerIndeterminate, got)
		root2 := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(root2, RunnerDir), 0o700))
		require.NoError(t, os.Symlink(filepath.Join(elsewhere, RunnerStateFile), filepath.Join(root2, RunnerDir, RunnerStateFile)))
		got, _, _ = ReadRunnerLifecycle(root2, id)
		require.Equal(t, RunnerIndeterminate, got)
	})
}

// An entirely empty scoped root carries no authority and is fresh; a
// symlinked control-plane directory is indeterminate.
func TestE13_EmptyScopedRootIsFreshAndSymlinkedControlPlaneIsIndeterminate(t *testing.T) {
	base := t.TempDir()
	p := execution("c", "run", "a", "ws", "s")
	root := filepath.Join(base, p.Key().RootName())
	require.NoError(t, os.Mkdir(root, 0o700))
	prep, err := Prepare(context.Background(), Request{Base: base, Scope: p.Key(), RunID: "run"})
	require.NoError(t, err)
	require.Equal(t, SourceFresh, prep.Source)

	elsewhere := t.TempDir()
	writeJSON(t, filepath.Join(elsewhere, ControlPlaneFile), controlPlane(Identity{RunID: "run", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}))
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(root, ControlPlaneDir)))
	_, err = Prepare(context.Background(), Request{Base: base, Scope: p.Key(), RunID: "run"})
	requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.Contains(t, quarantineEntries(t, base)[0].Name(), ".identity_indeterminate.")
	require.True(t, exists(filepath.Join(elsewhere, ControlPlaneFile)), "the symlink target is untouched")
}

// A symlinked legacy root is unsafe and left in place.
func TestE13_SymlinkedLegacyRootIsUnsafeAndLeftInPlace(t *testing.T) {
	base := t.TempDir()
	p := execution("c", "run", "a", "ws", "s")
	target := t.TempDir()
	seedRoot(t, target, Identity{RunID: "run", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}, "ready")
	legacy := filepath.Join(base, p.Key().LegacyRootNames()[1])
	require.NoError(t, os.Symlink(target, legacy))
	_, err := Prepare(context.Background(), Request{Base: base, Scope: p.Key(), RunID: "run"})
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)
	_, err = os.Readlink(legacy)
	require.NoError(t, err)
	require.False(t, exists(filepath.Join(base, p.Key().RootName())))
}

// Quarantine only moves real root-named directories directly under the base
// into a real quarantine directory.
func TestE13_QuarantineRefusesAnythingButARootUnderTheBase(t *testing.T) {
	base := t.TempDir()
	notRoot := filepath.Join(base, "not-a-root")
	require.NoError(t, os.Mkdir(notRoot, 0o700))
	_, err := Quarantine(base, notRoot, IdentityIndeterminate, timeNow())
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)

	nested := filepath.Join(base, "sub", sha("x"))
	require.NoError(t, os.MkdirAll(nested, 0o700))
	_, err = Quarantine(base, nested, IdentityIndeterminate, timeNow())
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)

	root := filepath.Join(base, sha("y"))
	require.NoError(t, os.Mkdir(root, 0o700))
	require.NoError(t, os.Symlink(t.TempDir(), filepath.Join(base, QuarantineDir)))
	_, err = Quarantine(base, root, IdentityIndeterminate, timeNow())
	requireCode(t, err, failure.RunnerStateDirectoryUnsafe)
	require.True(t, exists(root))
}

// Bind writes the identity atomically with private modes and preserves the
// control plane's other fields.
func TestE13_BindPreservesOtherControlPlaneFields(t *testing.T) {
	root := filepath.Join(t.TempDir(), sha("r"))
	id := Identity{RunID: "run-1", NormalizedSessionID: "s", RunnerInstanceID: "r", EnvironmentLeaseID: "l"}
	require.NoError(t, Bind(root, id))
	path := filepath.Join(root, ControlPlaneDir, ControlPlaneFile)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(filepath.Join(root, ControlPlaneDir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	writeJSON(t, path, map[string]any{"schema": ControlPlaneSchema, "identity": id, "ackedSourceSeq": 7})
	id.RunID = "run-2"
	require.NoError(t, Bind(root, id))
	var doc map[string]any
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Equal(t, float64(7), doc["ackedSourceSeq"])
	got, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, id, *got)

	err = Bind(root, Identity{RunID: "x"})
	require.EqualValues(t, failure.RunnerStateIdentityMismatch, failure.CodeOf(err))
}

// A tool authority that was revoked explicitly (e.g. tool definitions failed
// to load) refuses calls; epochs of different scopes are independent.
func TestE13_ToolAuthorityEpochsArePerScope(t *testing.T) {
	var e Epochs
	a1 := e.Begin("scope-a", ToolBinding{RunID: "run-a1"})
	b1 := e.Begin("scope-b", ToolBinding{RunID: "run-b1"})
	_, err := a1.Binding()
	require.NoError(t, err)
	a2 := e.Begin("scope-a", ToolBinding{RunID: "run-a2"})
	_, err = a1.Binding()
	requireCode(t, err, failure.NativeToolAuthorityEpochRevoked)
	b, err := b1.Binding()
	require.NoError(t, err)
	require.Equal(t, "run-b1", b.RunID)
	a1.Revoke() // a stale revoke never ends the current epoch
	b, err = a2.Binding()
	require.NoError(t, err)
	require.Equal(t, "run-a2", b.RunID)
	a2.Revoke()
	_, err = a2.Binding()
	requireCode(t, err, failure.NativeToolAuthorityEpochRevoked)
}

// A quarantined root keeps the session's state but not the launch-only
// entries of its provider home: credentials and launch configuration are
// removed first, a symlinked credential as the link itself.
func TestE13_QuarantineRemovesLaunchOnlyProviderHomeEntriesFirst(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, sha("launch-only"))
	home := filepath.Join(root, CodexHomeDir)
	require.NoError(t, os.MkdirAll(filepath.Join(home, "sessions"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(home, "tmp"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, "sessions", "rollout.jsonl"), []byte("{}"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(home, "config.toml"), []byte("model = \"m\""), 0o600))
	outside := filepath.Join(t.TempDir(), "auth.json")
	require.NoError(t, os.WriteFile(outside, []byte(`{"token":"secret"}`), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(home, "auth.json")))

	dest, err := Quarantine(base, root, IdentityIndeterminate, timeNow())
	require.NoError(t, err)
	qhome := filepath.Join(dest, CodexHomeDir)
	require.FileExists(t, filepath.Join(qhome, "sessions", "rollout.jsonl"), "the session's state is kept")
	for _, e := range LaunchOnlyCodexHomeEntries {
		_, err := os.Lstat(filepath.Join(qhome, e))
		require.True(t, os.IsNotExist(err), "%s removed", e)
	}
	require.FileExists(t, outside, "a symlink's target is never touched")
}
