package stamp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/services/backup/internal/manifest"
)

var key = []byte("0123456789abcdef0123456789abcdef")

var scope = strings.Repeat("5c", 32)

func put(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
}

func execution() manifest.Execution {
	return manifest.Execution{
		CompanyID: "company", RunID: "run", IssueID: "issue", AgentID: "agent", NormalizedSessionID: "native-session",
		DriverKind: provenv.DriverCodexAppServer, Workspace: manifest.Workspace{Cwd: "/workspace"},
		Provider: map[string]any{"kind": "codex", "model": "gpt-5.6-sol", "approvalPolicy": "never"},
	}
}

func TestB3_StampVerifiesOnlyForItsLeaseWhileDigestsMatch(t *testing.T) {
	current := filepath.Join(t.TempDir(), scope, "failover-backups", "current")
	put(t, filepath.Join(current, "runner", "runner-state.json"), "runner-state")
	put(t, filepath.Join(current, "codex-home", "sessions", "thread.jsonl"), "thread-state")
	m, err := manifest.BuildFromRoot(current, manifest.BuildInput{
		Execution: execution(), RunnerInstanceID: "runner-1", SessionScope: scope, CheckpointID: "cp-1",
		ProviderSessionIdentity: manifest.SessionIdentity{ProviderSessionID: "thread-1", ProviderBackendSessionID: "session-1"},
		SourceLeaseID:           "sandbox-1",
	})
	require.NoError(t, err)
	s, err := Issue(key, m, "sandbox-1")
	require.NoError(t, err)
	digests := manifest.RootDigests(current)

	ok, reason := VerifyBackup(key, s, "sandbox-1", m, digests)
	require.True(t, ok, reason)
	ok, reason = VerifyBackup(key, s, "sandbox-2", m, digests)
	require.False(t, ok)
	require.Equal(t, failure.BackupStampLeaseMismatch, reason)

	put(t, filepath.Join(current, "runner", "runner-state.json"), "corrupt")
	ok, reason = VerifyBackup(key, s, "sandbox-1", m, digests)
	require.False(t, ok)
	require.Equal(t, failure.BackupDigestMismatch, reason)
	put(t, filepath.Join(current, "runner", "runner-state.json"), "runner-state")

	// A re-issued stamp authorises a replacement lease; the old one does not.
	s2, err := Issue(key, m, "sandbox-2")
	require.NoError(t, err)
	ok, _ = VerifyBackup(key, s2, "sandbox-2", m, digests)
	require.True(t, ok)
	ok, _ = VerifyBackup(key, s2, "sandbox-1", m, digests)
	require.False(t, ok)

	// Another manifest (same directories, other identity) does not match.
	other := *m
	other.RunnerInstanceID = "runner-2"
	ok, reason = VerifyBackup(key, s, "sandbox-1", &other, digests)
	require.False(t, ok)
	require.Equal(t, failure.BackupStampManifestMismatch, reason)
	ok, reason = VerifyBackup(key, s, "sandbox-1", nil, digests)
	require.False(t, ok)
	require.Equal(t, failure.BackupStampCheckpointMissing, reason)

	_, err = Issue(key, m, "")
	require.EqualValues(t, failure.RunnerHarnessBackupLeaseMissing, failure.CodeOf(err))
	noScope := *m
	noScope.SessionScope = "native-session"
	_, err = Issue(key, &noScope, "sandbox-1")
	require.EqualValues(t, failure.RunnerHarnessBackupScopeInvalid, failure.CodeOf(err))
}

func TestB3_StampVerifiesOnlyForItsLeaseAndBytes(t *testing.T) {
	s := &backupv1.Stamp{
		Schema: Schema, ManifestDigest: "sha256:abc", SessionScope: scope, RunnerInstanceId: "runner-1",
		NormalizedSessionId: "s", CheckpointId: "cp", SourceLeaseId: "lease-0",
		LeaseId: "lease-1", CompletedAt: timestamppb.New(time.Unix(1700000000, 5)),
	}
	Sign(key, s)
	ok, reason := Verify(key, s, "lease-1")
	require.True(t, ok, reason)

	cases := map[string]struct {
		mutate func(*backupv1.Stamp)
		lease  string
		key    []byte
		reason string
	}{
		"other lease":      {func(*backupv1.Stamp) {}, "lease-2", key, failure.BackupStampLeaseMismatch},
		"changed manifest": {func(s *backupv1.Stamp) { s.ManifestDigest = "sha256:abd" }, "lease-1", key, failure.BackupStampSignatureInvalid},
		"changed time":     {func(s *backupv1.Stamp) { s.CompletedAt = timestamppb.New(time.Unix(1700000000, 6)) }, "lease-1", key, failure.BackupStampSignatureInvalid},
		"rebound lease":    {func(s *backupv1.Stamp) { s.LeaseId = "lease-2" }, "lease-2", key, failure.BackupStampSignatureInvalid},
		"source lease":     {func(s *backupv1.Stamp) { s.SourceLeaseId = "lease-9" }, "lease-1", key, failure.BackupStampSignatureInvalid},
		"checkpoint":       {func(s *backupv1.Stamp) { s.CheckpointId = "cp2" }, "lease-1", key, failure.BackupStampSignatureInvalid},
		"other key":        {func(*backupv1.Stamp) {}, "lease-1", []byte("another key of thirty-two bytes!"), failure.BackupStampSignatureInvalid},
		"missing field":    {func(s *backupv1.Stamp) { s.RunnerInstanceId = "" }, "lease-1", key, failure.BackupStampIncomplete},
		"bad scope":        {func(s *backupv1.Stamp) { s.SessionScope = "s" }, "lease-1", key, failure.BackupStampIncomplete},
		"old schema":       {func(s *backupv1.Stamp) { s.Schema = "" }, "lease-1", key, failure.BackupStampIncomplete},
		"empty lease":      {func(*backupv1.Stamp) {}, "", key, failure.BackupStampIncomplete},
		"garbage sig":      {func(s *backupv1.Stamp) { s.Signature = "zz" }, "lease-1", key, failure.BackupStampSignatureInvalid},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := proto.Clone(s).(*backupv1.Stamp)
			c.mutate(m)
			ok, reason := Verify(c.key, m, c.lease)
			require.False(t, ok)
			require.Equal(t, c.reason, reason)
		})
	}
}
