package manifest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/provenv"
)

func profileNames(t *testing.T, provider map[string]any) []string {
	t.Helper()
	p, err := ResolveProfile(Execution{Provider: provider}.ProviderKind())
	require.NoError(t, err)
	return p.Names()
}

func TestB2_CodexDeclaresRunnerAndCodexHome(t *testing.T) {
	require.Equal(t, []string{"runner", "codex-home"}, profileNames(t, map[string]any{"kind": "codex"}))
	p, _ := ResolveProfile("codex")
	require.Equal(t, provenv.DriverCodexAppServer, p.DriverKind)
	require.Equal(t, LocationRunner, p.Directories[0].Location)
	require.Empty(t, p.Directories[0].ExcludeTopLevel)
}

func TestB2_OpenCodeDeclaresRunnerAndOpenCode(t *testing.T) {
	require.Equal(t, []string{"runner", "opencode"}, profileNames(t, map[string]any{"kind": "opencode"}))
	p, _ := ResolveProfile("opencode")
	require.Equal(t, provenv.DriverOpenCodeServer, p.DriverKind)
}

func TestB2_ACPXPiDeclaresRunnerAndACPX(t *testing.T) {
	require.Equal(t, []string{"runner", "acpx"}, profileNames(t, map[string]any{"kind": "acpx", "agent": "pi"}))
}

func TestB2_ACPXClaudeDeclaresRunnerAndACPX(t *testing.T) {
	require.Equal(t, []string{"runner", "acpx"}, profileNames(t, map[string]any{"kind": "acpx", "agent": "claude"}))
	p, _ := ResolveProfile("acpx")
	require.Equal(t, provenv.DriverACPXRuntime, p.DriverKind)
}

func TestB2_ACPXCodexDeclaresRunnerAndACPX(t *testing.T) {
	require.Equal(t, []string{"runner", "acpx"}, profileNames(t, map[string]any{"kind": "acpx", "agent": "codex"}))
}

func TestB2_CodexHomeExcludesScratchAndCredentials(t *testing.T) {
	p, err := ResolveProfile("codex")
	require.NoError(t, err)
	require.Equal(t, Directory{Name: "codex-home", Location: LocationFilesystem,
		ExcludeTopLevel: []string{"tmp", ".tmp", "auth.json", "config.toml"}, ExcludeAnywhere: []string{"auth.json"}}, p.Directories[1])
	require.Equal(t, []string{"codex-home/auth.json"}, p.ExclusionsAnywhere())
	require.Equal(t, []string{"codex-home/tmp", "codex-home/.tmp", "codex-home/auth.json", "codex-home/config.toml"}, p.Exclusions())
	_, err = ResolveProfile("claude_local")
	require.EqualValues(t, failure.RunnerHarnessProviderUnsupported, failure.CodeOf(err))
}

// backupExecution mirrors the seed's execution input.
func backupExecution() Execution {
	return Execution{
		CompanyID: "company", RunID: "run", IssueID: "issue", AgentID: "agent", ExecutionWorkspaceID: "workspace",
		NormalizedSessionID: "native-session", DriverKind: provenv.DriverCodexAppServer,
		Workspace: Workspace{Cwd: "/workspace", RepoURL: "https://example.test/repo.git", RepoRef: "main", BranchName: "tether/test"},
		Provider:  map[string]any{"kind": "codex", "model": "gpt-5.6-sol", "approvalPolicy": "never"},
	}
}

func put(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
}

// writeBackup lays out failover-backups/<slot> with both codex directories
// and its manifest.
func writeBackup(t *testing.T, sessionRoot, slot string) (string, *Manifest) {
	current := filepath.Join(sessionRoot, "failover-backups", slot)
	put(t, filepath.Join(current, "runner", "runner-state.json"), "runner-state")
	put(t, filepath.Join(current, "codex-home", "sessions", "thread.jsonl"), "thread-state")
	m, err := BuildFromRoot(current, BuildInput{
		Execution: backupExecution(), RunnerInstanceID: "runner-1",
		ProviderSessionIdentity: SessionIdentity{ProviderSessionID: "thread-1", ProviderBackendSessionID: "session-1"},
		SourceLeaseID:           "sandbox-1",
		CompletedAt:             time.Date(2026, 8, 26, 0, 0, 0, 0, time.UTC),
	})
	require.NoError(t, err)
	require.NoError(t, WriteManifestFile(filepath.Join(current, "manifest.json"), m))
	return current, m
}

func TestB3_AcceptsDigestMatchedBackupAndRejectsCorruption(t *testing.T) {
	root := t.TempDir()
	current, _ := writeBackup(t, root, "current")
	exp := Expectation{Execution: backupExecution(), RunnerInstanceID: "runner-1"}

	v := VerifyRoot(root, exp)
	require.NotNil(t, v)
	require.Equal(t, current, v.Root)
	require.Equal(t, "sandbox-1", v.Manifest.SourceLeaseID)
	require.Equal(t, []string{"runner", "codex-home"}, []string{v.Manifest.Directories[0].Name, v.Manifest.Directories[1].Name})
	require.Equal(t, "2026-08-26T00:00:00.000Z", v.Manifest.CompletedAt)
	require.Equal(t, int64(len("runner-state")+len("thread-state")), v.Bytes)

	// A continuation run of the same session verifies the same backup.
	cont := backupExecution()
	cont.RunID, cont.ExecutionWorkspaceID = "run-2", "run-2"
	require.NotNil(t, VerifyRoot(root, Expectation{Execution: cont, RunnerInstanceID: "runner-1"}))

	// Another runner instance, session, model or company does not.
	for name, mutate := range map[string]func(*Expectation){
		"runner":  func(e *Expectation) { e.RunnerInstanceID = "runner-2" },
		"session": func(e *Expectation) { e.Execution.NormalizedSessionID = "other" },
		"model":   func(e *Expectation) { e.Execution.Provider = map[string]any{"kind": "codex", "model": "other"} },
		"company": func(e *Expectation) { e.Execution.CompanyID = "other" },
		"driver":  func(e *Expectation) { e.Execution.DriverKind = provenv.DriverACPXRuntime },
	} {
		e := Expectation{Execution: backupExecution(), RunnerInstanceID: "runner-1"}
		mutate(&e)
		require.Nil(t, VerifyRoot(root, e), name)
	}

	// Any changed byte: nil, not an error.
	put(t, filepath.Join(current, "codex-home", "sessions", "thread.jsonl"), "corrupt")
	require.Nil(t, VerifyRoot(root, exp))

	// ...unless the previous backup is still intact.
	writeBackup(t, root, "previous")
	v = VerifyRoot(root, exp)
	require.NotNil(t, v)
	require.Equal(t, filepath.Join(root, "failover-backups", "previous"), v.Root)

	// A tampered manifest or a missing directory fails too.
	require.NoError(t, os.RemoveAll(filepath.Join(root, "failover-backups", "previous", "runner")))
	require.Nil(t, VerifyRoot(root, exp))
}

func TestB3_BuildWithoutProviderSessionIdentityIsStateMismatch(t *testing.T) {
	root := t.TempDir()
	current := filepath.Join(root, "failover-backups", "current")
	put(t, filepath.Join(current, "runner", "runner-state.json"), "runner-state")
	require.NoError(t, os.MkdirAll(filepath.Join(current, "codex-home"), 0o700))
	_, err := BuildFromRoot(current, BuildInput{Execution: backupExecution(), RunnerInstanceID: "runner-1", SourceLeaseID: "sandbox-1"})
	require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err))
	require.ErrorContains(t, err, "runner_harness_state_mismatch")

	// A missing profile directory is a mismatch as well.
	require.NoError(t, os.RemoveAll(filepath.Join(current, "codex-home")))
	_, err = BuildFromRoot(current, BuildInput{Execution: backupExecution(), RunnerInstanceID: "runner-1",
		ProviderSessionIdentity: SessionIdentity{ProviderSessionID: "thread-1"}})
	require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err))
	require.ErrorContains(t, err, "codex-home is missing")

	// Any one identity field is enough.
	require.NoError(t, os.MkdirAll(filepath.Join(current, "codex-home"), 0o700))
	m, err := BuildFromRoot(current, BuildInput{Execution: backupExecution(), RunnerInstanceID: "runner-1",
		ProviderSessionIdentity: SessionIdentity{ProviderSessionIdentity: map[string]any{"kind": "codex"}}})
	require.NoError(t, err)
	require.Len(t, m.Directories, 2)
}

func acpxIdentity(suffix string) SessionIdentity {
	return SessionIdentity{
		ProviderSessionID:        "record-" + suffix,
		ProviderBackendSessionID: "backend-" + suffix,
		ProviderSessionIdentity: map[string]any{
			"kind": "acpx", "normalizedSessionId": "native-session",
			"acpxRecordId": "record-" + suffix, "backendSessionId": "backend-" + suffix,
			"agentSessionId": "agent-session-" + suffix, "profileDigest": "sha256:profile",
			"workspaceDigest": "sha256:workspace", "requestedModel": "claude-sonnet-5",
			"effectiveModel": "claude-sonnet-5", "permissionMode": "approve-all",
		},
	}
}

func TestB3_ACPXRotationOnlyAfterGovernedInteraction(t *testing.T) {
	exec := backupExecution()
	exec.Provider = map[string]any{"kind": "acpx", "agent": "claude", "model": "claude-sonnet-5"}
	exec.DriverKind = provenv.DriverACPXRuntime
	exec.InteractionResponses = []string{"interaction-1"}
	previous, current := acpxIdentity("previous"), acpxIdentity("current")

	require.True(t, TransitionAllowed(exec, previous, current))

	noInteraction := exec
	noInteraction.InteractionResponses = nil
	require.False(t, TransitionAllowed(noInteraction, previous, current))

	otherWorkspace := acpxIdentity("current")
	otherWorkspace.ProviderSessionIdentity["workspaceDigest"] = "sha256:different-workspace"
	require.False(t, TransitionAllowed(exec, previous, otherWorkspace))

	unbound := acpxIdentity("current")
	unbound.ProviderBackendSessionID = "unbound-backend"
	require.False(t, TransitionAllowed(exec, previous, unbound))

	// The same identity is always allowed, for any provider.
	require.True(t, TransitionAllowed(backupExecution(), previous, acpxIdentity("previous")))
	// A codex execution never rotates.
	codex := backupExecution()
	codex.InteractionResponses = []string{"i"}
	require.False(t, TransitionAllowed(codex, previous, current))
	// The current identity must be of the execution's session.
	otherSession := exec
	otherSession.NormalizedSessionID = "other"
	require.False(t, TransitionAllowed(otherSession, previous, current))
}

func TestB3_RestoresIntoFreshNonReusableSandboxOnly(t *testing.T) {
	require.True(t, ShouldRestoreIntoSandbox("created", false, true))
	require.False(t, ShouldRestoreIntoSandbox("created", true, true))
	require.False(t, ShouldRestoreIntoSandbox("created", false, false))
	require.False(t, ShouldRestoreIntoSandbox("resumed", false, true))

	cases := []struct {
		outcome                   string
		reusable, inPlace, backup bool
		want                      RestoreAction
		mismatch                  bool
	}{
		{"created", false, false, true, RestoreBackup, false},
		{"created", true, true, true, UseInPlace, false},
		{"created", true, false, true, "", true},
		{"created", true, false, false, StartFresh, false},
		{"resumed", false, true, true, UseInPlace, false},
		{"resumed", false, false, true, "", true},
		{"replacement", true, true, true, RestoreBackup, false},
		{"replacement", true, true, false, "", true},
	}
	for _, c := range cases {
		got, err := DecideRestore(c.outcome, c.reusable, c.inPlace, c.backup)
		if c.mismatch {
			require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err), "%+v", c)
			continue
		}
		require.NoError(t, err, "%+v", c)
		require.Equal(t, c.want, got, "%+v", c)
	}
}

func TestManifestRoundTripAndStrictParsing(t *testing.T) {
	_, m := writeBackup(t, t.TempDir(), "current")
	d1, err := m.Digest()
	require.NoError(t, err)
	data, err := m.CanonicalJSON()
	require.NoError(t, err)
	back, err := ParseManifest(data)
	require.NoError(t, err)
	d2, err := back.Digest()
	require.NoError(t, err)
	require.Equal(t, d1, d2)

	for name, bad := range map[string]string{
		"unknown field": `{"schema":"tether.harness-backup.v1","extra":1}`,
		"dup key":       `{"schema":"a","schema":"b"}`,
		"schema":        string(data[:len(data)-1]) + `,"x":1}`,
		"not json":      `{`,
		"trailing":      string(data) + ` {}`,
		"too big":       string(make([]byte, MaxManifestBytes+1)),
	} {
		_, err := ParseManifest([]byte(bad))
		require.EqualValues(t, failure.RunnerHarnessBackupManifestInvalid, failure.CodeOf(err), name)
	}
	m2 := *m
	m2.Directories = append(m2.Directories, m2.Directories[0])
	data, _ = m2.CanonicalJSON()
	_, err = ParseManifest(data)
	require.EqualValues(t, failure.RunnerHarnessBackupManifestInvalid, failure.CodeOf(err))
}
