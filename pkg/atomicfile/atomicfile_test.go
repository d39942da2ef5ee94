package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteReplacesAtomicallyAndPrivately(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Write(dir, "state.json", []byte("one"), 0o600))
	require.NoError(t, Write(dir, "state.json", []byte("two"), 0o600))
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	require.NoError(t, err)
	require.Equal(t, "two", string(b))
	st, err := os.Stat(filepath.Join(dir, "state.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")
	require.Error(t, Write(filepath.Join(dir, "missing"), "x", nil, 0o600))
}
