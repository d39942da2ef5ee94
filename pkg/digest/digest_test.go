package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

// refBackup is a plain, path-based transcription of the backup digest used
// as an oracle.
func refBackup(t *testing.T, dir string) Result {
	h := sha256.New()
	var total int64
	var walk func(abs, rel string)
	walk = func(abs, rel string) {
		ents, err := os.ReadDir(abs)
		require.NoError(t, err)
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		if len(names) == 0 {
			h.Write([]byte("directory:" + rel + "\x00"))
		}
		for _, n := range names {
			crel := n
			if rel != "" {
				crel = rel + "/" + n
			}
			fi, err := os.Lstat(filepath.Join(abs, n))
			require.NoError(t, err)
			mode := strconv.Itoa(int(fi.Mode().Perm()))
			if fi.IsDir() {
				h.Write([]byte("directory:" + crel + ":" + mode + "\x00"))
				walk(filepath.Join(abs, n), crel)
				continue
			}
			b, err := os.ReadFile(filepath.Join(abs, n))
			require.NoError(t, err)
			h.Write([]byte("file:" + crel + ":" + mode + ":" + strconv.Itoa(len(b)) + "\x00"))
			h.Write(b)
			total += int64(len(b))
		}
	}
	walk(dir, "")
	return Result{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Bytes: total}
}

func refPack(t *testing.T, dir string) string {
	h := sha256.New()
	var walk func(abs, rel string)
	walk = func(abs, rel string) {
		ents, err := os.ReadDir(abs)
		require.NoError(t, err)
		for _, e := range ents { // os.ReadDir sorts by name (byte order)
			crel := e.Name()
			if rel != "" {
				crel = rel + "/" + e.Name()
			}
			if e.IsDir() {
				h.Write([]byte("directory\x00" + crel + "\n"))
				walk(filepath.Join(abs, e.Name()), crel)
				continue
			}
			b, err := os.ReadFile(filepath.Join(abs, e.Name()))
			require.NoError(t, err)
			h.Write([]byte("file\x00" + crel + "\x00" + Bytes(b) + "\n"))
		}
	}
	walk(dir, "")
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, data, mode))
	require.NoError(t, os.Chmod(path, mode))
}

func randomTree(t *testing.T, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	names := []string{"a", "B", "b.txt", "b", "_x", "a-b", "a.b", "z", "ä", "0"}
	var fill func(d string, depth int)
	fill = func(d string, depth int) {
		n := r.IntN(6)
		for i := 0; i < n; i++ {
			name := names[r.IntN(len(names))]
			p := filepath.Join(d, name)
			if _, err := os.Lstat(p); err == nil {
				continue
			}
			if depth < 4 && r.IntN(3) == 0 {
				require.NoError(t, os.Mkdir(p, 0o755))
				if r.IntN(4) == 0 {
					require.NoError(t, os.Chmod(p, 0o700))
				}
				fill(p, depth+1)
				continue
			}
			size := []int{0, 1, 100, 4096, smallFile - 1, smallFile, smallFile + 1, 3*chunk + 17}[r.IntN(8)]
			b := make([]byte, size)
			for j := range b {
				b[j] = byte(r.Uint32())
			}
			write(t, p, b, []os.FileMode{0o644, 0o600, 0o755, 0o400}[r.IntN(4)])
		}
	}
	fill(dir, 0)
	return dir
}

func TestBackupTreeMatchesOracle(t *testing.T) {
	for seed := uint64(0); seed < 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			dir := randomTree(t, seed)
			want := refBackup(t, dir)
			for _, workers := range []int{1, 3} {
				got, err := BackupTree(dir, Options{Workers: workers})
				require.NoError(t, err)
				require.Equal(t, want, got)
			}
			gotPack, err := PackTree(dir)
			require.NoError(t, err)
			require.Equal(t, refPack(t, dir), gotPack)
		})
	}
}

func TestBackupTreeKnownVector(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "runner", "runner-state.json"), []byte("runner-state"), 0o644)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	stream := "directory:empty:493\x00directory:empty\x00" +
		"directory:runner:493\x00file:runner/runner-state.json:420:12\x00runner-state"
	got, err := BackupTree(dir)
	require.NoError(t, err)
	require.Equal(t, Result{Digest: String(stream), Bytes: 12}, got)

	empty := t.TempDir()
	got, err = BackupTree(empty)
	require.NoError(t, err)
	require.Equal(t, String("directory:\x00"), got.Digest)

	pack, err := PackTree(dir)
	require.NoError(t, err)
	require.Equal(t, String("directory\x00empty\ndirectory\x00runner\nfile\x00runner/runner-state.json\x00"+String("runner-state")+"\n"), pack)
}

func TestBackupTreeDetectsAnyChange(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "sessions", "thread.jsonl"), []byte("thread-state"), 0o600)
	base, err := BackupTree(dir)
	require.NoError(t, err)
	changes := map[string]func(){
		"byte":  func() { write(t, filepath.Join(dir, "sessions", "thread.jsonl"), []byte("thread-statf"), 0o600) },
		"mode":  func() { require.NoError(t, os.Chmod(filepath.Join(dir, "sessions", "thread.jsonl"), 0o644)) },
		"extra": func() { write(t, filepath.Join(dir, "sessions", "other"), nil, 0o600) },
		"empty": func() { require.NoError(t, os.Mkdir(filepath.Join(dir, "x"), 0o700)) },
		"dir":   func() { require.NoError(t, os.Chmod(filepath.Join(dir, "sessions"), 0o700)) },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			change()
			got, err := BackupTree(dir)
			require.NoError(t, err)
			require.NotEqual(t, base.Digest, got.Digest)
			require.NoError(t, os.RemoveAll(dir))
			require.NoError(t, os.Mkdir(dir, 0o755))
			write(t, filepath.Join(dir, "sessions", "thread.jsonl"), []byte("thread-state"), 0o600)
			require.NoError(t, os.Chmod(filepath.Join(dir, "sessions"), 0o755))
			again, err := BackupTree(dir)
			require.NoError(t, err)
			require.Equal(t, base, again)
		})
	}
}

func TestTreeRefusesSymlinksAndSpecials(t *testing.T) {
	mk := map[string]func(dir string){
		"symlink": func(dir string) {
			require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(dir, "sub", "host-secret")))
		},
		"fifo":    func(dir string) { require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "sub", "pipe"), 0o600)) },
		"dirlink": func(dir string) { require.NoError(t, os.Symlink("/etc", filepath.Join(dir, "sub", "etc"))) },
	}
	for name, f := range mk {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "sub", "a"), []byte("a"), 0o600)
			f(dir)
			_, err := BackupTree(dir)
			require.EqualValues(t, failure.RunnerHarnessBackupUnsupportedEntry, failure.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), "sub/")
			_, err = PackTree(dir)
			require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), "unsupported dist entry sub/")
		})
	}
	t.Run("root symlink", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "real"), 0o700))
		require.NoError(t, os.Symlink("real", filepath.Join(dir, "link")))
		_, err := BackupTree(filepath.Join(dir, "link"))
		require.EqualValues(t, failure.RunnerHarnessBackupUnsafeDirectory, failure.CodeOf(err))
		_, err = BackupTree(filepath.Join(dir, "missing"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("too deep", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, strings.Repeat("d/", MaxDepth+1))
		require.NoError(t, os.MkdirAll(p, 0o700))
		_, err := BackupTree(dir)
		require.EqualValues(t, failure.RunnerHarnessBackupPathTooDeep, failure.CodeOf(err))
		okDir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(okDir, strings.Repeat("d/", MaxDepth)), 0o700))
		_, err = BackupTree(okDir)
		require.NoError(t, err)
	})
}

func TestBackupStreamMatchesTree(t *testing.T) {
	for seed := uint64(20); seed < 26; seed++ {
		dir := randomTree(t, seed)
		want, err := BackupTree(dir)
		require.NoError(t, err)
		s := NewBackupStream()
		var feed func(abs, rel string)
		feed = func(abs, rel string) {
			ents, err := os.ReadDir(abs)
			require.NoError(t, err)
			for _, e := range ents {
				crel := joinRel(rel, e.Name())
				fi, err := e.Info()
				require.NoError(t, err)
				if e.IsDir() {
					require.NoError(t, s.Dir(crel, uint32(fi.Mode().Perm())))
					feed(filepath.Join(abs, e.Name()), crel)
					continue
				}
				f, err := os.Open(filepath.Join(abs, e.Name()))
				require.NoError(t, err)
				require.NoError(t, s.File(crel, uint32(fi.Mode().Perm()), fi.Size(), f))
				f.Close()
			}
		}
		feed(dir, "")
		got, err := s.Sum()
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
}

func TestBackupStreamRefusesNonCanonicalOrder(t *testing.T) {
	cases := map[string]func(s *BackupStream) error{
		"sibling order": func(s *BackupStream) error {
			require.NoError(t, s.File("b", 0o600, 0, strings.NewReader("")))
			return s.File("a", 0o600, 0, strings.NewReader(""))
		},
		"duplicate": func(s *BackupStream) error {
			require.NoError(t, s.File("a", 0o600, 0, strings.NewReader("")))
			return s.File("a", 0o600, 0, strings.NewReader(""))
		},
		"missing parent": func(s *BackupStream) error { return s.File("a/b", 0o600, 0, strings.NewReader("")) },
		"file as parent": func(s *BackupStream) error {
			require.NoError(t, s.File("a", 0o600, 0, strings.NewReader("")))
			return s.File("a/b", 0o600, 0, strings.NewReader(""))
		},
		"reentered dir": func(s *BackupStream) error {
			require.NoError(t, s.Dir("a", 0o700))
			require.NoError(t, s.Dir("b", 0o700))
			return s.File("a/x", 0o600, 0, strings.NewReader(""))
		},
		"dotdot":    func(s *BackupStream) error { return s.Dir("..", 0o700) },
		"short":     func(s *BackupStream) error { return s.File("a", 0o600, 5, strings.NewReader("abc")) },
		"leading /": func(s *BackupStream) error { return s.Dir("/a", 0o700) },
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := NewBackupStream()
			require.Error(t, c(s))
			_, err := s.Sum()
			require.Error(t, err)
		})
	}
	// Walk order is per directory, not whole-path byte order: "b/x" comes
	// before "b.txt" although "b.txt" < "b/x".
	s := NewBackupStream()
	require.NoError(t, s.Dir("b", 0o700))
	require.NoError(t, s.File("b/x", 0o600, 0, strings.NewReader("")))
	require.NoError(t, s.File("b.txt", 0o600, 0, strings.NewReader("")))
	_, err := s.Sum()
	require.NoError(t, err)
}

func TestFileDigest(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "f"), []byte("provider-node\n"), 0o755)
	got, err := File(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, String("provider-node\n"), got)
	require.True(t, Valid(got))
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "l")))
	_, err = File(filepath.Join(dir, "l"))
	require.Error(t, err)
	require.False(t, Valid("sha256:ABC"))
}
