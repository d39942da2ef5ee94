package keyfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

func writeKey(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, make([]byte, Size), 0o600))
	require.NoError(t, os.Chmod(path, mode))
}

func requireUnsafe(t *testing.T, err error, fix string) {
	t.Helper()
	require.Error(t, err)
	require.EqualValues(t, failure.KeyFileUnsafe, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), fix, "the message says how to fix it")
}

func TestS3_CreatesAPrivateKeyOnceAndReadsItBack(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "sub")
	p := filepath.Join(dir, "k.key")
	k1, err := LoadOrCreate(p)
	require.NoError(t, err)
	require.Len(t, k1, Size)
	st, err := os.Lstat(p)
	require.NoError(t, err)
	require.True(t, st.Mode().IsRegular())
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dst, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dst.Mode().Perm())
	k2, err := LoadOrCreate(p)
	require.NoError(t, err)
	require.Equal(t, k1, k2)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary file is left behind")

	require.NoError(t, os.WriteFile(p, []byte("short"), 0o600))
	_, err = LoadOrCreate(p)
	require.EqualValues(t, failure.KeyFileInvalid, failure.CodeOf(err))
}

func TestS3_ConcurrentCreatorsAgreeOnOneKey(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "k.key")
	keys := make([][]byte, 16)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadOrCreate(p)
			if err == nil {
				keys[i] = k
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		require.Equal(t, keys[0], k)
	}
	require.Len(t, keys[0], Size)
}

func TestS3_RefusesASymlinkedKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "real.key")
	writeKey(t, target, 0o600)
	link := filepath.Join(dir, "stamp.key")
	require.NoError(t, os.Symlink(target, link))
	_, err := LoadOrCreate(link)
	requireUnsafe(t, err, "is a symlink")
	requireUnsafe(t, Check(link), "chmod 600 "+link)

	// A dangling link is refused too, never created through.
	dangling := filepath.Join(dir, "gateway.key")
	elsewhere := filepath.Join(dir, "elsewhere.key")
	require.NoError(t, os.Symlink(elsewhere, dangling))
	_, err = LoadOrCreate(dangling)
	requireUnsafe(t, err, "is a symlink")
	_, err = os.Lstat(elsewhere)
	require.ErrorIs(t, err, fs.ErrNotExist, "nothing was written through the link")
	require.ErrorIs(t, Create(dangling, []byte("k")), fs.ErrExist)
	_, err = os.Lstat(elsewhere)
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestS3_RefusesAKeyMoreOpenThan0600(t *testing.T) {
	t.Parallel()
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o700, 0o660, 0o666} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "stamp.key")
			writeKey(t, p, mode)
			_, err := LoadOrCreate(p)
			requireUnsafe(t, err, "chmod 600 "+p)
			_, err = Read(p)
			requireUnsafe(t, err, "more open than 0600")
		})
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		p := filepath.Join(t.TempDir(), "stamp.key")
		writeKey(t, p, mode)
		_, err := LoadOrCreate(p)
		require.NoError(t, err, "mode %v is private", mode)
	}
}

func TestS3_RefusesAKeyThatIsNotARegularFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := filepath.Join(dir, "dir.key")
	require.NoError(t, os.Mkdir(d, 0o700))
	_, err := LoadOrCreate(d)
	requireUnsafe(t, err, "not a regular file")
	fifo := filepath.Join(dir, "fifo.key")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	_, err = LoadOrCreate(fifo)
	requireUnsafe(t, err, "not a regular file")
}

func TestS3_RefusesAKeyOwnedByAnotherUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	p := filepath.Join(t.TempDir(), "gateway.key")
	writeKey(t, p, 0o600)
	require.NoError(t, os.Chown(p, 65534, 65534))
	_, err := LoadOrCreate(p)
	requireUnsafe(t, err, "chown 0 "+p)
	require.Contains(t, err.Error(), "owned by uid 65534")
}

func TestS3_ReadIsTheLoaderForOtherKeyFiles(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "grant.key")
	require.NoError(t, Create(p, []byte("-----BEGIN PRIVATE KEY-----\n")))
	b, err := Read(p)
	require.NoError(t, err)
	require.Equal(t, "-----BEGIN PRIVATE KEY-----\n", string(b))
	err = Create(p, []byte("other"))
	require.True(t, errors.Is(err, fs.ErrExist), "Create never replaces a key: %v", err)
	_, err = Read(filepath.Join(t.TempDir(), "missing.key"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}
