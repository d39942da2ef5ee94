package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/services/backup/internal/manifest"
)

// makeLegacy turns the one stored checkpoint of e into what a verifier
// before SafeDirMode (SPEC S4) stored: its archive keeps the directory
// codex-home/sessions at mode 0777 as found, and its manifest records
// directory digests under those raw modes. rules is what its row then
// records (nil: nothing, as rows stored before SPEC L5).
func makeLegacy(t *testing.T, e *env, id string, rules *int) {
	t.Helper()
	ctx := context.Background()
	path := storedArchive(t, e)
	old, err := os.ReadFile(path)
	require.NoError(t, err)
	var b bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(old)), tar.NewWriter(&b)
	var rewrote bool
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeDir && h.Name == "codex-home/sessions/" {
			h.Mode, rewrote = 0o777, true
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err = io.Copy(tw, tr)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.True(t, rewrote)
	data := b.Bytes()
	raw, _, err := archive.DigestTarWith(bytes.NewReader(data), archive.Limits{MaxArchiveBytes: 1 << 30, MaxExpandedBytes: 1 << 30, MaxEntries: 1 << 20}, archive.DigestRulesRawDirModes)
	require.NoError(t, err)
	safe, _, err := archive.DigestTar(bytes.NewReader(data), archive.Limits{MaxArchiveBytes: 1 << 30, MaxExpandedBytes: 1 << 30, MaxEntries: 1 << 20})
	require.NoError(t, err)
	require.NotEqual(t, safe["codex-home"].Digest, raw["codex-home"].Digest, "the two rules differ on this archive")

	conn, err := pgx.Connect(ctx, e.dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var stored []byte
	require.NoError(t, conn.QueryRow(ctx, `SELECT manifest FROM backup.checkpoints WHERE checkpoint_id = $1`, id).Scan(&stored))
	m, err := manifest.ParseManifest(stored)
	require.NoError(t, err)
	for i := range m.Directories {
		r := raw[m.Directories[i].Name]
		m.Directories[i].SHA256, m.Directories[i].Bytes = r.Digest, r.Bytes
	}
	sum := sha256.Sum256(data)
	m.Archive.SHA256, m.Archive.Bytes = digest.Prefix+hex.EncodeToString(sum[:]), int64(len(data))
	canon, err := m.CanonicalJSON()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	_, err = conn.Exec(ctx, `UPDATE backup.checkpoints SET manifest = $2, manifest_digest = $3, archive_sha256 = $4,
    archive_bytes = $5, digest_rules = $6 WHERE checkpoint_id = $1`, id, canon, digest.Bytes(canon), m.Archive.SHA256, m.Archive.Bytes, rules)
	require.NoError(t, err)
}

func digestRulesOf(t *testing.T, e *env, id string) *int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), e.dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var rules *int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT digest_rules FROM backup.checkpoints WHERE checkpoint_id = $1`, id).Scan(&rules))
	return rules
}

// TestL5_ACheckpointStoredBeforeTheDirectoryModeRuleVerifiesAgain: a
// checkpoint stored before directory modes were digested through
// SafeDirMode (its archive and manifest with a 0777 directory as found)
// failed deep verification with backup_digest_mismatch. It has no rules
// recorded: verification tries the current rules, then the older ones,
// finds it intact, records the rules it matched, and verifies under them
// from then on.
func TestL5_ACheckpointStoredBeforeTheDirectoryModeRuleVerifiesAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	receipt, err := upload(ctx, e.client, header("lease-1"), tarOf(t, harnessTree(t)))
	require.NoError(t, err)
	id := receipt.GetCheckpoint().GetCheckpointId()
	require.Equal(t, int(archive.CurrentDigestRules), *digestRulesOf(t, e, id), "a new checkpoint records the rules it was made with")

	makeLegacy(t, e, id, nil)
	deep := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.True(t, deep.GetValid(), "%s: %s", deep.GetReason(), deep.GetDetail())
	require.Equal(t, int(archive.DigestRulesRawDirModes), *digestRulesOf(t, e, id), "the rules it matched are recorded")
	again := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.True(t, again.GetValid(), "%s: %s", again.GetReason(), again.GetDetail())

	// Still a real check: a changed byte fails under the old rules too.
	flipByte(t, storedArchive(t, e), "thread-state")
	bad := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.False(t, bad.GetValid())
}

// TestL5_RecordedRulesAreTheOnlyRulesApplied: a checkpoint that records the
// current rules is verified under them alone: an archive whose directory
// digests only match under the older rules is backup_digest_mismatch, not
// silently accepted under whichever rules fit.
func TestL5_RecordedRulesAreTheOnlyRulesApplied(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	receipt, err := upload(ctx, e.client, header("lease-1"), tarOf(t, harnessTree(t)))
	require.NoError(t, err)
	id := receipt.GetCheckpoint().GetCheckpointId()
	current := int(archive.CurrentDigestRules)
	makeLegacy(t, e, id, &current)
	deep := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.False(t, deep.GetValid())
	require.Equal(t, failure.BackupDigestMismatch, deep.GetReason())
	require.Equal(t, current, *digestRulesOf(t, e, id))
}

// TestL5_DigestRulesDifferOnlyInDirectoryModes: the two rules give the same
// digests for an archive whose directories are already safe (every
// checkpoint made since SPEC S4), and differ for a 0777 or 0500 directory.
func TestL5_DigestRulesDifferOnlyInDirectoryModes(t *testing.T) {
	t.Parallel()
	lim := archive.Limits{MaxArchiveBytes: 1 << 20, MaxExpandedBytes: 1 << 20, MaxEntries: 100}
	for _, tc := range []struct {
		mode int64
		same bool
	}{{0o700, true}, {0o755, true}, {0o777, false}, {0o500, false}, {0o775, false}} {
		data := rawTar(t,
			&tar.Header{Typeflag: tar.TypeDir, Name: "codex-home/", Mode: 0o700},
			&tar.Header{Typeflag: tar.TypeDir, Name: "codex-home/d/", Mode: tc.mode},
			&tar.Header{Typeflag: tar.TypeReg, Name: "codex-home/d/f", Mode: 0o600, Size: 3},
		)
		cur, _, err := archive.DigestTar(bytes.NewReader(data), lim)
		require.NoError(t, err)
		raw, _, err := archive.DigestTarWith(bytes.NewReader(data), lim, archive.DigestRulesRawDirModes)
		require.NoError(t, err)
		require.Equal(t, tc.same, cur["codex-home"].Digest == raw["codex-home"].Digest, "mode %o", tc.mode)
	}
}
