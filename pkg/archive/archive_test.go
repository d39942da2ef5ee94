package archive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

var codexExclusions = []string{"tmp", ".tmp", "auth.json", "config.toml"}

func putFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, []byte(data), mode))
	require.NoError(t, os.Chmod(path, mode))
}

// codexHome builds a provider home with durable state, scratch trees and
// launch-time credentials.
func codexHome(t *testing.T, dir string) {
	putFile(t, filepath.Join(dir, "sessions", "2026", "thread.jsonl"), "durable session\n", 0o600)
	putFile(t, filepath.Join(dir, "history.jsonl"), "history\n", 0o644)
	putFile(t, filepath.Join(dir, ".tmp", "scratch.bin"), "disposable scratch", 0o600)
	putFile(t, filepath.Join(dir, "tmp", "x", "y"), "scratch", 0o600)
	putFile(t, filepath.Join(dir, "auth.json"), "credential", 0o600)
	putFile(t, filepath.Join(dir, "config.toml"), "bearer token", 0o600)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "empty"), 0o750))
}

func treeDigest(t *testing.T, dir string) digest.Result {
	t.Helper()
	r, err := digest.BackupTree(dir)
	require.NoError(t, err)
	return r
}

func headers(t *testing.T, archive []byte) []*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out []*tar.Header
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, h)
	}
}

func names(t *testing.T, archive []byte) []string {
	t.Helper()
	var out []string
	for _, h := range headers(t, archive) {
		out = append(out, h.Name)
	}
	return out
}

func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tether-checkpoint-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestB4_SnapshotExcludesScratchAndCredentialsWithoutMutatingLiveHome(t *testing.T) {
	parent := t.TempDir()
	live := filepath.Join(parent, "codex-home")
	codexHome(t, live)
	before := treeDigest(t, live)

	var buf bytes.Buffer
	st, err := Snapshot(live, &buf, SnapshotOptions{Exclude: codexExclusions})
	require.NoError(t, err)
	got := names(t, buf.Bytes())
	require.Equal(t, []string{"empty/", "history.jsonl", "sessions/", "sessions/2026/", "sessions/2026/thread.jsonl"}, got)
	require.Equal(t, 4, st.Skipped)
	require.Equal(t, int64(len("durable session\n")+len("history\n")), st.Bytes)

	require.Equal(t, before, treeDigest(t, live), "the live provider home was mutated")
	require.FileExists(t, filepath.Join(live, "auth.json"))
	require.Empty(t, leftovers(t, parent), "temporary snapshot sibling left behind")

	// The archive is canonical: its stream digest equals the tree digest of
	// the live home without the excluded entries.
	require.NoError(t, os.RemoveAll(filepath.Join(live, "tmp")))
	require.NoError(t, os.RemoveAll(filepath.Join(live, ".tmp")))
	require.NoError(t, os.Remove(filepath.Join(live, "auth.json")))
	require.NoError(t, os.Remove(filepath.Join(live, "config.toml")))
	var prefixed bytes.Buffer
	tw := tar.NewWriter(&prefixed)
	_, err = WriteTar(tw, live, WriteOptions{Prefix: "codex-home"})
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	digests, _, err := DigestTar(&prefixed, Limits{})
	require.NoError(t, err)
	require.Equal(t, treeDigest(t, live), digests["codex-home"])

	_, err = Snapshot(filepath.Join(parent, "absent"), io.Discard, SnapshotOptions{})
	require.EqualValues(t, failure.RunnerRemoteCheckpointSourceMissing, failure.CodeOf(err))
}

func TestB4_RejectsNonTopLevelExclusions(t *testing.T) {
	parent := t.TempDir()
	live := filepath.Join(parent, "codex-home")
	codexHome(t, live)
	for _, bad := range []string{"../outside", "sessions/2026", "/etc", "", ".", "..", "a b", "$(rm -rf ~)", "x'y", "a\x00b"} {
		_, err := Snapshot(live, io.Discard, SnapshotOptions{Exclude: []string{bad}})
		require.EqualValues(t, failure.RunnerRemoteCheckpointExclusionInvalid, failure.CodeOf(err), "%q: %v", bad, err)
		require.ErrorContains(t, err, "runner_remote_checkpoint_exclusion_invalid")
	}
	require.Empty(t, leftovers(t, parent))
	require.NoError(t, ValidateExclusions(codexExclusions))
	_, err := Restore(bytes.NewReader(nil), filepath.Join(parent, "t"), RestoreOptions{ExtractOptions: ExtractOptions{Exclude: []string{"../x"}}})
	require.EqualValues(t, failure.RunnerRemoteCheckpointExclusionInvalid, failure.CodeOf(err))
}

// TestB4_UnsafeArchiveLeavesDurableTargetUntouched runs the committed
// malicious corpus (go run ./pkg/archive/internal/gencorpus) against a
// durable target.
func TestB4_UnsafeArchiveLeavesDurableTargetUntouched(t *testing.T) {
	want := map[string]string{
		"symlink.tar":        failure.RunnerRemoteCheckpointArchiveUnsafeEntry,
		"hardlink.tar":       failure.RunnerRemoteCheckpointArchiveUnsafeEntry,
		"device.tar":         failure.RunnerRemoteCheckpointArchiveUnsafeEntry,
		"blockdev.tar":       failure.RunnerRemoteCheckpointArchiveUnsafeEntry,
		"fifo.tar":           failure.RunnerRemoteCheckpointArchiveUnsafeEntry,
		"absolute.tar":       failure.RunnerRemoteCheckpointArchiveUnsafePath,
		"dotdot.tar":         failure.RunnerRemoteCheckpointArchiveUnsafePath,
		"dotdot_nested.tar":  failure.RunnerRemoteCheckpointArchiveUnsafePath,
		"setuid.tar":         failure.RunnerRemoteCheckpointArchiveUnsafeMode,
		"setgid_dir.tar":     failure.RunnerRemoteCheckpointArchiveUnsafeMode,
		"duplicate.tar":      failure.RunnerRemoteCheckpointArchiveDuplicateEntry,
		"size_bomb.tar":      failure.RunnerRemoteCheckpointArchiveTooLarge,
		"expansion_bomb.tgz": failure.RunnerRemoteCheckpointArchiveExpandedTooLarge,
	}
	files, err := os.ReadDir("testdata/malicious")
	require.NoError(t, err)
	require.Len(t, files, len(want), "corpus and expectations differ")
	for _, f := range files {
		t.Run(f.Name(), func(t *testing.T) {
			code, ok := want[f.Name()]
			require.True(t, ok, "no expectation for %s", f.Name())
			data, err := os.ReadFile(filepath.Join("testdata/malicious", f.Name()))
			require.NoError(t, err)

			parent := t.TempDir()
			target := filepath.Join(parent, "durable-target")
			putFile(t, filepath.Join(target, "preserved.txt"), "preserved", 0o600)
			before := treeDigest(t, target)

			_, err = Restore(bytes.NewReader(data), target, RestoreOptions{})
			require.EqualValues(t, code, failure.CodeOf(err), "%v", err)
			require.ErrorContains(t, err, code+": ")

			require.Equal(t, before, treeDigest(t, target), "durable target changed")
			require.Empty(t, leftovers(t, parent), "staging directory left behind")
			ents, err := os.ReadDir(parent)
			require.NoError(t, err)
			require.Len(t, ents, 1, "something escaped into the parent")
			require.NoFileExists(t, "/tmp/tether-absolute-escape")

			_, err = Check(bytes.NewReader(data), Limits{})
			require.EqualValues(t, code, failure.CodeOf(err))
			// DigestTar also refuses it (possibly earlier, for a top-level file).
			_, _, err = DigestTar(bytes.NewReader(data), Limits{})
			require.Contains(t, []string{code, failure.RunnerRemoteCheckpointArchiveInvalid}, string(failure.CodeOf(err)), "%v", err)
		})
	}
}

func TestB4_RestoreStagesWithoutExcludedEntries(t *testing.T) {
	src := filepath.Join(t.TempDir(), "codex-home")
	codexHome(t, src)
	var buf bytes.Buffer
	_, err := WriteTree(&buf, src, WriteOptions{}) // everything travels...
	require.NoError(t, err)

	parent := t.TempDir()
	target := filepath.Join(parent, "codex-home")
	st, err := Restore(bytes.NewReader(buf.Bytes()), target, RestoreOptions{ExtractOptions: ExtractOptions{Exclude: codexExclusions}})
	require.NoError(t, err) // ...but the excluded entries are never staged
	require.Equal(t, 7, st.Skipped)
	require.FileExists(t, filepath.Join(target, "sessions", "2026", "thread.jsonl"))
	for _, gone := range codexExclusions {
		require.NoFileExists(t, filepath.Join(target, gone))
		require.NoDirExists(t, filepath.Join(target, gone))
	}
	for _, gone := range codexExclusions {
		require.NoError(t, os.RemoveAll(filepath.Join(src, gone)))
	}
	require.Equal(t, treeDigest(t, src), treeDigest(t, target))
	fi, err := os.Stat(target)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o700), fi.Mode().Perm())
	require.Empty(t, leftovers(t, parent))
}

func TestB4_RestoreSwapsAtomicallyAndRoundTrips(t *testing.T) {
	src := filepath.Join(t.TempDir(), "runner")
	putFile(t, filepath.Join(src, "runner-state.json"), `{"lifecycle":"suspended"}`, 0o600)
	putFile(t, filepath.Join(src, "outbox", "0001.json"), "event", 0o640)
	putFile(t, filepath.Join(src, "ro", "frozen"), "ro", 0o400)
	require.NoError(t, os.Chmod(filepath.Join(src, "ro"), 0o500))
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "ro"), 0o700) })
	var buf bytes.Buffer
	_, err := Snapshot(src, &buf, SnapshotOptions{})
	require.NoError(t, err)

	parent := t.TempDir()
	target := filepath.Join(parent, "runner")
	putFile(t, filepath.Join(target, "stale.json"), "old", 0o600)
	st, err := Restore(bytes.NewReader(buf.Bytes()), target, RestoreOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, st.Files)
	// The 0500 directory travels with its safe mode (SPEC S4): the restored
	// tree equals the source once that directory has owner rwx.
	require.NoError(t, os.Chmod(filepath.Join(src, "ro"), 0o700))
	want := treeDigest(t, src)
	require.Equal(t, want, treeDigest(t, target))
	require.NoFileExists(t, filepath.Join(target, "stale.json"))
	require.Empty(t, leftovers(t, parent))

	// Into an absent target too.
	fresh := filepath.Join(parent, "fresh")
	_, err = Restore(bytes.NewReader(buf.Bytes()), fresh, RestoreOptions{})
	require.NoError(t, err)
	require.Equal(t, want, treeDigest(t, fresh))

	// A symlink target is refused, never followed.
	link := filepath.Join(parent, "link")
	require.NoError(t, os.Symlink(target, link))
	_, err = Restore(bytes.NewReader(buf.Bytes()), link, RestoreOptions{})
	require.EqualValues(t, failure.RunnerRemoteCheckpointTargetUnsafe, failure.CodeOf(err))

	// The fallback swap (rename aside) gives the same result.
	other := filepath.Join(parent, "other")
	putFile(t, filepath.Join(other, "x"), "x", 0o600)
	stage := t.TempDir()
	staged := filepath.Join(stage, "payload")
	require.NoError(t, os.Mkdir(staged, 0o700))
	putFile(t, filepath.Join(staged, "y"), "y", 0o600)
	require.NoError(t, swapByRename(staged, other, filepath.Join(stage, "previous")))
	require.FileExists(t, filepath.Join(other, "y"))
	require.FileExists(t, filepath.Join(stage, "previous", "x"))
}

func buildTar(t *testing.T, n int, size int) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for i := range n {
		require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%05d", i), Mode: 0o600, Size: int64(size)}))
		_, err := tw.Write(bytes.Repeat([]byte{'x'}, size))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

func TestB4_LimitsRefuseOversizedArchives(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		lim  Limits
		code string
	}{
		{"entries", buildTar(t, 11, 1), Limits{MaxEntries: 10}, failure.RunnerRemoteCheckpointArchiveTooManyEntries},
		{"expanded", buildTar(t, 3, 1000), Limits{MaxExpandedBytes: 2500}, failure.RunnerRemoteCheckpointArchiveExpandedTooLarge},
		{"stream", buildTar(t, 3, 1000), Limits{MaxArchiveBytes: 4000}, failure.RunnerRemoteCheckpointArchiveTooLarge},
		{"gzip stream", gzipped(t, buildTar(t, 50, 2000)), Limits{MaxArchiveBytes: 100}, failure.RunnerRemoteCheckpointArchiveTooLarge},
		{"gzip expansion", gzipped(t, buildTar(t, 50, 2000)), Limits{MaxExpandedBytes: 50000}, failure.RunnerRemoteCheckpointArchiveExpandedTooLarge},
		{"empty", nil, Limits{}, failure.RunnerRemoteCheckpointArchiveInvalid},
		{"no entries", buildTar(t, 0, 0), Limits{}, failure.RunnerRemoteCheckpointArchiveInvalid},
		{"truncated", buildTar(t, 2, 5000)[:3000], Limits{}, failure.RunnerRemoteCheckpointArchiveInvalid},
		{"garbage", bytes.Repeat([]byte("not a tar"), 100), Limits{}, failure.RunnerRemoteCheckpointArchiveInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			target := filepath.Join(parent, "t")
			putFile(t, filepath.Join(target, "keep"), "keep", 0o600)
			_, err := Restore(bytes.NewReader(c.data), target, RestoreOptions{ExtractOptions: ExtractOptions{Limits: c.lim}})
			require.EqualValues(t, c.code, failure.CodeOf(err), "%v", err)
			require.FileExists(t, filepath.Join(target, "keep"))
			require.Empty(t, leftovers(t, parent))
		})
	}
	// Exactly at the limits is fine.
	data := buildTar(t, 10, 100)
	_, err := Check(bytes.NewReader(data), Limits{MaxEntries: 10, MaxExpandedBytes: 1000, MaxArchiveBytes: int64(len(data))})
	require.NoError(t, err)
	_, err = Check(bytes.NewReader(gzipped(t, data)), Limits{MaxEntries: 10, MaxExpandedBytes: 1000})
	require.NoError(t, err)
}

func gzipped(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return out.Bytes()
}

func TestExtractTopLevelLayout(t *testing.T) {
	root := t.TempDir()
	putFile(t, filepath.Join(root, "runner", "runner-state.json"), "s", 0o600)
	putFile(t, filepath.Join(root, "codex-home", "auth.json"), "secret", 0o600)
	putFile(t, filepath.Join(root, "codex-home", "sessions", "a"), "a", 0o600)
	var buf bytes.Buffer
	_, err := WriteTree(&buf, root, WriteOptions{})
	require.NoError(t, err)

	dst := t.TempDir()
	st, err := Extract(bytes.NewReader(buf.Bytes()), dst, ExtractOptions{Top: []string{"runner", "codex-home"}, Exclude: []string{"codex-home/auth.json"}})
	require.NoError(t, err)
	require.Equal(t, 1, st.Skipped)
	require.NoFileExists(t, filepath.Join(dst, "codex-home", "auth.json"))

	_, err = Extract(bytes.NewReader(buf.Bytes()), t.TempDir(), ExtractOptions{Top: []string{"runner"}})
	require.EqualValues(t, failure.RunnerRemoteCheckpointArchiveInvalid, failure.CodeOf(err))

	// DigestTar of a canonical multi-directory archive equals the tree
	// digests; a reordered archive is refused.
	digests, _, err := DigestTar(bytes.NewReader(buf.Bytes()), Limits{})
	require.NoError(t, err)
	require.Equal(t, treeDigest(t, filepath.Join(root, "runner")), digests["runner"])
	require.Equal(t, treeDigest(t, filepath.Join(root, "codex-home")), digests["codex-home"])

	var reordered bytes.Buffer
	tw := tar.NewWriter(&reordered)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "runner/", Mode: 0o700},
		{Typeflag: tar.TypeReg, Name: "runner/b", Mode: 0o600},
		{Typeflag: tar.TypeReg, Name: "runner/a", Mode: 0o600},
	} {
		require.NoError(t, tw.WriteHeader(h))
	}
	require.NoError(t, tw.Close())
	_, _, err = DigestTar(&reordered, Limits{})
	require.EqualValues(t, failure.RunnerHarnessBackupNotCanonical, failure.CodeOf(err))
}

func TestSnapshotRefusesSymlinksInLiveTree(t *testing.T) {
	parent := t.TempDir()
	live := filepath.Join(parent, "home")
	putFile(t, filepath.Join(live, "a"), "a", 0o600)
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(live, "link")))
	_, err := Snapshot(live, io.Discard, SnapshotOptions{})
	require.EqualValues(t, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, failure.CodeOf(err))
	require.Empty(t, leftovers(t, parent))
	require.NoError(t, os.Symlink(live, filepath.Join(parent, "rootlink")))
	_, err = Snapshot(filepath.Join(parent, "rootlink"), io.Discard, SnapshotOptions{})
	require.EqualValues(t, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, failure.CodeOf(err))
	// With limits, a tree too big to be accepted is refused early.
	_, err = Snapshot(live, io.Discard, SnapshotOptions{Limits: &Limits{MaxEntries: 1}})
	require.True(t, errors.Is(err, err))
	require.Contains(t, []string{failure.RunnerRemoteCheckpointArchiveTooManyEntries, failure.RunnerRemoteCheckpointArchiveUnsafeEntry}, string(failure.CodeOf(err)))
}

func TestNormalise(t *testing.T) {
	ok := map[string]string{"./": "", ".": "", "a": "a", "./a/b": "a/b", "a/b/": "a/b", "./.hidden": ".hidden", "a..b": "a..b"}
	for in, want := range ok {
		got, err := normalise(in, strings.HasSuffix(in, "/"))
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"/a", "../a", "a/../../b", "a//b", "a/./b", "a\\b", "a\x00b", "./../x", "././a"} {
		_, err := normalise(bad, false)
		require.EqualValues(t, failure.RunnerRemoteCheckpointArchiveUnsafePath, failure.CodeOf(err), bad)
	}
	require.True(t, slices.Equal([]string{"a"}, []string{"a"}))
}

func dirModes(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[filepath.ToSlash(rel)] = info.Mode().Perm()
		return nil
	}))
	return out
}

func TestS4_ExtractedDirectoriesAlwaysHaveOwnerRWXAndNoOtherWrite(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"0000", "0500", "0555", "0777", "1777"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzExtract", "seed_dir_mode_"+name+".tar"))
			require.NoError(t, err)
			// The seed is a fuzz corpus file: one quoted []byte.
			lines := strings.SplitN(string(raw), "\n", 2)
			quoted := strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(lines[1], "[]byte(")), ")")
			data, err := strconv.Unquote(quoted)
			require.NoError(t, err)
			dir := t.TempDir()
			_, err = Extract(strings.NewReader(data), dir, ExtractOptions{})
			require.NoError(t, err)
			m, _ := strconv.ParseUint(name, 8, 32)
			want := SafeDirMode(fs.FileMode(m))
			require.Equal(t, map[string]fs.FileMode{"locked": want, "locked/inner": want}, dirModes(t, dir))
			require.Equal(t, fs.FileMode(0o700), want&0o700)
			require.Zero(t, want&0o022)
			// The staging tree goes away without any chmod.
			require.NoError(t, os.RemoveAll(dir))
		})
	}
	require.Equal(t, fs.FileMode(0o700), SafeDirMode(0))
	require.Equal(t, fs.FileMode(0o700), SafeDirMode(0o500))
	require.Equal(t, fs.FileMode(0o755), SafeDirMode(0o777))
	require.Equal(t, fs.FileMode(0o750), SafeDirMode(0o750))
}

func TestS4_ArchivesStoreOnlySafeDirectoryModesAndDigestAsExtracted(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "codex-home")
	putFile(t, filepath.Join(src, "locked", "state.json"), "state", 0o600)
	putFile(t, filepath.Join(src, "open", "x"), "x", 0o644)
	putFile(t, filepath.Join(src, "none", "y"), "y", 0o600)
	require.NoError(t, os.Chmod(filepath.Join(src, "locked"), 0o500))
	require.NoError(t, os.Chmod(filepath.Join(src, "open"), 0o777))
	require.NoError(t, os.Chmod(filepath.Join(src, "none"), 0o000))
	t.Cleanup(func() {
		for _, d := range []string{"locked", "open", "none"} {
			_ = os.Chmod(filepath.Join(src, d), 0o700)
		}
	})
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_, err := WriteTar(tw, src, WriteOptions{Prefix: "codex-home"})
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	stored := map[string]int64{}
	for _, h := range headers(t, b.Bytes()) {
		if h.Typeflag == tar.TypeDir {
			stored[h.Name] = h.Mode
		}
	}
	require.Equal(t, map[string]int64{"codex-home/": 0o700, "codex-home/locked/": 0o700, "codex-home/none/": 0o700, "codex-home/open/": 0o755}, stored)

	// The archive's digest is the digest of what extraction produces.
	dir := t.TempDir()
	_, err = Extract(bytes.NewReader(b.Bytes()), dir, ExtractOptions{Top: []string{"codex-home"}})
	require.NoError(t, err)
	digests, _, err := DigestTar(bytes.NewReader(b.Bytes()), Limits{})
	require.NoError(t, err)
	require.Equal(t, treeDigest(t, filepath.Join(dir, "codex-home")), digests["codex-home"])
}

func TestS4_AuthJSONIsExcludedAtAnyDepthBelowCodexHome(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	putFile(t, filepath.Join(root, "runner", "runner-state.json"), "{}", 0o600)
	putFile(t, filepath.Join(root, "runner", "notes", "auth.json"), "not a credential", 0o600)
	home := filepath.Join(root, "codex-home")
	putFile(t, filepath.Join(home, "auth.json"), "credential", 0o600)
	putFile(t, filepath.Join(home, "sub", "auth.json"), "credential", 0o600)
	putFile(t, filepath.Join(home, "a", "b", "auth.json", "inside"), "credential", 0o600)
	putFile(t, filepath.Join(home, "sessions", "thread.jsonl"), "thread", 0o600)

	// Written without them (the gateway's snapshot).
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_, err := WriteTar(tw, filepath.Join(root, "runner"), WriteOptions{Prefix: "runner"})
	require.NoError(t, err)
	st, err := WriteTar(tw, home, WriteOptions{Prefix: "codex-home", ExcludeAnywhere: []string{"auth.json"}})
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.Equal(t, 3, st.Skipped)
	for _, n := range names(t, b.Bytes()) {
		require.False(t, strings.HasPrefix(n, "codex-home/") && strings.Contains(n, "auth.json"), "%s travelled", n)
	}
	require.Contains(t, names(t, b.Bytes()), "runner/notes/auth.json", "only codex-home's are credentials")

	// Extracted without them (the verifier's and the restore's staging),
	// even from an archive that carries them.
	var all bytes.Buffer
	tw = tar.NewWriter(&all)
	for _, d := range []string{"runner", "codex-home"} {
		_, err := WriteTar(tw, filepath.Join(root, d), WriteOptions{Prefix: d})
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	dir := t.TempDir()
	st, err = Extract(bytes.NewReader(all.Bytes()), dir, ExtractOptions{Top: []string{"runner", "codex-home"}, ExcludeAnywhere: []string{"codex-home/auth.json"}})
	require.NoError(t, err)
	require.Equal(t, 4, st.Skipped, "three auth.json entries and the file below the directory one")
	require.NoFileExists(t, filepath.Join(dir, "codex-home", "auth.json"))
	require.NoFileExists(t, filepath.Join(dir, "codex-home", "sub", "auth.json"))
	require.NoDirExists(t, filepath.Join(dir, "codex-home", "a", "b", "auth.json"))
	require.FileExists(t, filepath.Join(dir, "codex-home", "sessions", "thread.jsonl"))
	require.FileExists(t, filepath.Join(dir, "runner", "notes", "auth.json"))

	_, err = Extract(bytes.NewReader(all.Bytes()), t.TempDir(), ExtractOptions{ExcludeAnywhere: []string{"codex-home/../x"}})
	require.EqualValues(t, failure.RunnerRemoteCheckpointExclusionInvalid, failure.CodeOf(err))
}
