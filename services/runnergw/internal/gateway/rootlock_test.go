package gateway

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF1_OneGatewayPerStateRoot(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	release, err := LockStateRoot(root)
	require.NoError(t, err)
	holder, err := os.ReadFile(filepath.Join(root, RootLockFile))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(holder))

	_, err = LockStateRoot(root)
	require.ErrorContains(t, err, "is in use by another runnergw (pid "+strconv.Itoa(os.Getpid())+")")

	release()
	again, err := LockStateRoot(root)
	require.NoError(t, err, "a released root (or one whose holder died) is free at once")
	again()

	// A symlinked lock file is refused, never followed.
	other := t.TempDir()
	require.NoError(t, os.Remove(filepath.Join(root, RootLockFile)))
	require.NoError(t, os.Symlink(filepath.Join(other, "elsewhere"), filepath.Join(root, RootLockFile)))
	_, err = LockStateRoot(root)
	require.Error(t, err)
	_, statErr := os.Stat(filepath.Join(other, "elsewhere"))
	require.True(t, os.IsNotExist(statErr))
}
