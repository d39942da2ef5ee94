package safefs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A link anywhere below the base — a directory on the way, the file
// written, a hard link appended to — makes the write fail without touching
// what the link points at (SPEC T7).
func TestT7_WritesBelowABaseFollowNoLink(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep"), 0o600))

	require.NoError(t, WriteFileAt(base, "scope/control-plane", "state.json", []byte("one"), 0o600))
	b, err := os.ReadFile(filepath.Join(base, "scope", "control-plane", "state.json"))
	require.NoError(t, err)
	require.Equal(t, "one", string(b))

	// A directory on the way swapped for a link to another directory.
	require.NoError(t, os.Rename(filepath.Join(base, "scope", "control-plane"), filepath.Join(base, "scope", "old")))
	require.NoError(t, os.Symlink(outside, filepath.Join(base, "scope", "control-plane")))
	err = WriteFileAt(base, "scope/control-plane", "state.json", []byte("two"), 0o600)
	require.True(t, IsLink(err), "%v", err)
	_, err = os.Stat(filepath.Join(outside, "state.json"))
	require.True(t, os.IsNotExist(err))

	// The file itself is a link: replaced, its target untouched.
	d, err := OpenDir(base, "scope", false, 0)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, os.Symlink(victim, filepath.Join(base, "scope", "launch.json")))
	require.NoError(t, WriteFile(d, "launch.json", []byte("{}"), 0o600))
	fi, err := os.Lstat(filepath.Join(base, "scope", "launch.json"))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular())

	// Appending to a link or a hard link is refused.
	require.NoError(t, os.Symlink(victim, filepath.Join(base, "scope", "runnerd.log")))
	_, err = OpenAppend(d, "runnerd.log", 0o600)
	require.True(t, IsLink(err), "%v", err)
	require.NoError(t, os.Link(victim, filepath.Join(base, "scope", "hard.log")))
	_, err = OpenAppend(d, "hard.log", 0o600)
	require.True(t, IsLink(err), "%v", err)
	_, err = ReadFile(d, "runnerd.log", 10)
	require.True(t, IsLink(err), "%v", err)

	b, err = os.ReadFile(victim)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))
	_, err = OpenDir(base, "../x", false, 0)
	require.Error(t, err)
}
