package keyfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadOrCreate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "k.key")
	k1, err := LoadOrCreate(p)
	require.NoError(t, err)
	require.Len(t, k1, Size)
	st, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	k2, err := LoadOrCreate(p)
	require.NoError(t, err)
	require.Equal(t, k1, k2)
	require.NoError(t, os.WriteFile(p, []byte("short"), 0o600))
	_, err = LoadOrCreate(p)
	require.Error(t, err)
}
