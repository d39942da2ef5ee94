package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob/fileblob"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/backup/internal/checkpoint"
	"github.com/tether-run/tether/services/backup/internal/store"
)

// Environment of the unprivileged child of
// TestS4_NonRootUploadsLeaveNoStagingAfterLockedDirectories.
const (
	envS4Child   = "TETHER_TEST_S4_CHILD"
	envS4DSN     = "TETHER_TEST_S4_DSN"
	envS4Staging = "TETHER_TEST_S4_STAGING"
	envS4Bucket  = "TETHER_TEST_S4_BUCKET"
	// stuckName is a staging leftover the root parent plants so that the
	// unprivileged child cannot remove it (a failed cleanup must be
	// logged and counted, never ignored).
	stuckName = "tether-backup-upload-stuck"
	nobodyID  = 65534
)

// TestS4_NonRootUploadsLeaveNoStagingAfterLockedDirectories runs the
// verifier's upload path as a non-root user: as root (CI) it re-executes
// this test binary as nobody; as any other user it runs in place.
func TestS4_NonRootUploadsLeaveNoStagingAfterLockedDirectories(t *testing.T) {
	t.Parallel()
	if os.Getenv(envS4Child) == "1" {
		s4Child(t, os.Getenv(envS4DSN), os.Getenv(envS4Staging), os.Getenv(envS4Bucket), true)
		return
	}
	dsn := pgtest.NewDB(t, migrator)
	if os.Geteuid() != 0 {
		s4Child(t, dsn, filepath.Join(t.TempDir(), "staging"), t.TempDir(), false)
		return
	}
	// A directory nobody can traverse, holding a copy of this binary
	// (go test's build directory is private to root).
	base, err := os.MkdirTemp("", "tether-s4-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	bin := filepath.Join(base, "api.test")
	copyFile(t, self, bin)
	staging, bucket := filepath.Join(base, "staging"), filepath.Join(base, "bucket")
	for _, d := range []string{staging, bucket} {
		require.NoError(t, os.Mkdir(d, 0o700))
		require.NoError(t, os.Chown(d, nobodyID, nobodyID))
	}
	// A leftover the child cannot remove: root's directory with a file.
	stuck := filepath.Join(staging, stuckName)
	require.NoError(t, os.Mkdir(stuck, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(stuck, "f"), []byte("x"), 0o644))

	cmd := exec.Command(bin, "-test.run", "^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Dir = base
	cmd.Env = append(os.Environ(), envS4Child+"=1", envS4DSN+"="+dsn, envS4Staging+"="+staging, envS4Bucket+"="+bucket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyID, Gid: nobodyID, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the unprivileged upload path failed:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+t.Name())

	// Checked again as root: only the planted leftover remains.
	ents, err := os.ReadDir(staging)
	require.NoError(t, err)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	require.Equal(t, []string{stuckName}, left)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// tarHeaders lists the headers of a tar stream.
func tarHeaders(t *testing.T, data []byte) []*tar.Header {
	t.Helper()
	var out []*tar.Header
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, h)
	}
}

// s4Child is the unprivileged half: a verifier with its own staging
// directory receives archives with 0000 and 0500 directories, accepted and
// refused, and leaves no staging behind.
func s4Child(t *testing.T, dsn, staging, bucketDir string, planted bool) {
	require.NotZero(t, os.Geteuid(), "the upload path must run as a non-root user")
	metrics := checkpoint.NewMetrics(prometheus.NewRegistry())
	logPath := filepath.Join(t.TempDir(), "verifier.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	t.Cleanup(func() { logFile.Close() })
	logs := func() string {
		b, err := os.ReadFile(logPath)
		require.NoError(t, err)
		return string(b)
	}
	e := newEnv(t, false, func(s *checkpoint.Service) {
		st, err := store.Open(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		bucket, err := fileblob.OpenBucket(bucketDir, nil)
		require.NoError(t, err)
		t.Cleanup(func() { bucket.Close() })
		s.Store, s.Bucket, s.StagingDir, s.Metrics = st, bucket, staging, metrics
		s.Log = slog.New(slog.NewTextHandler(logFile, nil))
		require.NoError(t, s.PrepareStaging(staging))
	})
	wantFailures := 0.0
	if planted {
		// The leftover that is not ours could not be removed: logged and
		// counted, and the verifier still starts.
		wantFailures = 1
		require.Contains(t, logs(), "removing upload staging directory")
		require.Contains(t, logs(), stuckName)
	}
	require.Equal(t, wantFailures, testutil.ToFloat64(metrics.StagingCleanupFailures))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := func(n string, mode int64) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: mode} }
	file := func(n string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o600, Size: 3} }
	state := &tar.Header{Typeflag: tar.TypeReg, Name: "runner/runner-state.json", Mode: 0o600, Size: 3}
	cases := map[string]struct {
		data []byte
		code string // "" accepted
	}{
		"0000 directory accepted": {rawTar(t, dir("runner/", 0o700), state, dir("codex-home/", 0o700),
			dir("codex-home/locked/", 0o000), file("codex-home/locked/secret")), ""},
		"0500 directories accepted": {rawTar(t, dir("runner/", 0o500), state, dir("codex-home/", 0o500),
			dir("codex-home/ro/", 0o500), file("codex-home/ro/x")), ""},
		"0777 directory accepted": {rawTar(t, dir("runner/", 0o700), state, dir("codex-home/", 0o777),
			dir("codex-home/open/", 0o777), file("codex-home/open/x")), ""},
		"0000 directory then an unsafe entry": {rawTar(t, dir("runner/", 0o700), dir("codex-home/", 0o700),
			dir("codex-home/locked/", 0o000), file("codex-home/locked/secret"),
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "codex-home/locked/link", Linkname: "/etc/passwd"}), failure.RunnerRemoteCheckpointArchiveUnsafeEntry},
		"0500 directory in an archive refused after extraction": {rawTar(t, dir("runner/", 0o500),
			dir("runner/ro/", 0o500), file("runner/ro/x")), "runner_harness_state_mismatch"},
		"0000 directory and a duplicate": {rawTar(t, dir("runner/", 0o000), file("runner/a"), file("runner/a")), failure.RunnerRemoteCheckpointArchiveDuplicateEntry},
	}
	for name, c := range cases {
		resp, err := upload(ctx, e.client, header("sandbox-s4"), c.data)
		if c.code == "" {
			require.NoError(t, err, name)
			_, data, err := download(ctx, t, e.client, resp.GetCheckpoint().GetCheckpointId())
			require.NoError(t, err, name)
			for _, h := range tarHeaders(t, data) {
				if h.Typeflag == tar.TypeDir {
					require.Equal(t, int64(archive.SafeDirMode(os.FileMode(h.Mode))), h.Mode, "%s: stored %s with mode %o", name, h.Name, h.Mode)
				}
			}
		} else {
			require.EqualValues(t, c.code, failure.CodeOf(err), "%s: %v", name, err)
		}
		ents, err := os.ReadDir(staging)
		require.NoError(t, err)
		for _, ent := range ents {
			require.True(t, planted && ent.Name() == stuckName, "%s: staging %s left behind", name, ent.Name())
		}
	}
	require.Equal(t, wantFailures, testutil.ToFloat64(metrics.StagingCleanupFailures), "no further cleanup failed:\n%s", logs())
}

func TestS4_TheVerifierCreatesAndChecksItsStagingDirectory(t *testing.T) {
	t.Parallel()
	svc := &checkpoint.Service{Log: slog.New(slog.DiscardHandler), Metrics: checkpoint.NewMetrics(nil)}
	base := t.TempDir()

	fresh := filepath.Join(base, "a", "staging")
	require.NoError(t, svc.PrepareStaging(fresh))
	fi, err := os.Stat(fresh)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	// Leftovers of an earlier process go, locked directories included.
	left := filepath.Join(fresh, "tether-backup-upload-123", "tree", "codex-home", "locked")
	require.NoError(t, os.MkdirAll(left, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(left, "f"), []byte("x"), 0o600))
	require.NoError(t, os.Chmod(left, 0o000))
	require.NoError(t, os.WriteFile(filepath.Join(fresh, "unrelated"), nil, 0o600))
	require.NoError(t, svc.PrepareStaging(fresh))
	ents, err := os.ReadDir(fresh)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only the verifier's own leftovers are removed")
	require.Equal(t, "unrelated", ents[0].Name())
	require.Zero(t, testutil.ToFloat64(svc.Metrics.StagingCleanupFailures))

	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(fresh, link))
	err = svc.PrepareStaging(link)
	require.EqualValues(t, failure.BackupStagingUnsafe, failure.CodeOf(err))
	require.ErrorContains(t, err, "symlink")

	open := filepath.Join(base, "open")
	require.NoError(t, os.Mkdir(open, 0o700))
	require.NoError(t, os.Chmod(open, 0o777))
	err = svc.PrepareStaging(open)
	require.EqualValues(t, failure.BackupStagingUnsafe, failure.CodeOf(err))
	require.ErrorContains(t, err, "chmod 700 "+open)

	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.EqualValues(t, failure.BackupStagingUnsafe, failure.CodeOf(svc.PrepareStaging(file)))

	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		require.NoError(t, os.Mkdir(other, 0o700))
		require.NoError(t, os.Chown(other, nobodyID, nobodyID))
		err = svc.PrepareStaging(other)
		require.EqualValues(t, failure.BackupStagingUnsafe, failure.CodeOf(err))
		require.ErrorContains(t, err, "owned by uid 65534")
	}
}

func TestS4_TheServiceDropsEveryAuthJSONBelowCodexHome(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := harnessTree(t)
	put(t, filepath.Join(root, "codex-home", "sub", "auth.json"), "nested credential", 0o600)
	put(t, filepath.Join(root, "codex-home", "a", "b", "auth.json"), "deeper credential", 0o600)
	put(t, filepath.Join(root, "codex-home", "a", "b", "keep.json"), "state", 0o600)
	resp, err := upload(ctx, e.client, header("sandbox-auth"), tarOf(t, root))
	require.NoError(t, err)
	_, data, err := download(ctx, t, e.client, resp.GetCheckpoint().GetCheckpointId())
	require.NoError(t, err)
	var names []string
	for _, h := range tarHeaders(t, data) {
		names = append(names, h.Name)
		require.NotEqual(t, "auth.json", filepath.Base(h.Name), "%s was stored", h.Name)
	}
	require.Contains(t, names, "codex-home/a/b/keep.json")
	require.Contains(t, names, "codex-home/sub/")
}
