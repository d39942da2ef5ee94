package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The backup verifier's real command line refuses a stamp key others can
// read, or one reached through a symlink, before it serves anything. It
// runs the binary the end-to-end stacks run (bin/backup-verifier): a test
// package of its own for this one check linked the verifier's whole
// dependency tree (blob drivers included) with -race a second time.
func TestS3_BackupVerifierRefusesToStartWithAnExposedStampKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := filepath.Join(dir, "stamp.key")
	require.NoError(t, os.WriteFile(key, bytes.Repeat([]byte("k"), 32), 0o600))
	require.NoError(t, os.Chmod(key, 0o644))
	link := filepath.Join(dir, "link.key")
	require.NoError(t, os.Symlink(key, link))
	for path, fix := range map[string]string{key: "chmod 600 " + key, link: "is a symlink"} {
		cmd := exec.Command(filepath.Join(binDir, "backup-verifier"),
			"-stamp-key-file", path, "-grpc-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "backup-verifier must exit: %v", err)
		require.Equal(t, 1, ee.ExitCode())
		require.Contains(t, stderr.String(), "key_file_unsafe")
		require.Contains(t, stderr.String(), fix)
	}
}
