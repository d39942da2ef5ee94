package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The test binary doubles as backup-verifier when asked, so a test runs the
// real command line (flags, startup order, exit status).
func TestMain(m *testing.M) {
	if os.Getenv("TETHER_TEST_BACKUP_VERIFIER_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func runVerifier(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TETHER_TEST_BACKUP_VERIFIER_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

func TestS3_BackupVerifierRefusesToStartWithAnExposedStampKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := filepath.Join(dir, "stamp.key")
	require.NoError(t, os.WriteFile(key, bytes.Repeat([]byte("k"), 32), 0o600))
	require.NoError(t, os.Chmod(key, 0o644))
	link := filepath.Join(dir, "link.key")
	require.NoError(t, os.Symlink(key, link))
	for path, fix := range map[string]string{key: "chmod 600 " + key, link: "is a symlink"} {
		stderr, err := runVerifier(t, "-stamp-key-file", path, "-grpc-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0")
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "backup-verifier must exit: %v", err)
		require.Equal(t, 1, ee.ExitCode())
		require.Contains(t, stderr, "key_file_unsafe")
		require.Contains(t, stderr, fix)
	}
}
