package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/pgtest"
)

// A TLS private key is a key file (SPEC S3/T6): the executor and the backup
// verifier refuse to start with a 0644 or symlinked -tls-key, naming the fix,
// and start with the same key at 0600.
func TestT6_ExecutorAndBackupVerifierRefuseAnExposedTLSKey(t *testing.T) {
	t.Parallel()
	pki := t.TempDir()
	out, err := exec.Command(filepath.Join(binDir, "tetherctl"), "certs", "init", pki).CombinedOutput()
	require.NoError(t, err, "%s", out)
	dsn := pgtest.NewDB(t, stackSchema)
	dir := t.TempDir()
	stamp := filepath.Join(dir, "stamp.key")
	require.NoError(t, os.WriteFile(stamp, bytes.Repeat([]byte("k"), 32), 0o600))

	args := map[string][]string{
		"executor": {"-database-url", dsn, "-migrate=false", "-grant-key-file", filepath.Join(pki, "grant.key")},
		"backup-verifier": {"-stamp-key-file", stamp, "-staging-dir", filepath.Join(dir, "staging"),
			"-blob-url", "file://" + filepath.Join(dir, "blobs") + "?create_dir=true"},
	}
	for svc, extra := range args {
		key := filepath.Join(pki, svc+".key")
		link := filepath.Join(dir, svc+"-link.key")
		require.NoError(t, os.Symlink(key, link))
		require.NoError(t, os.Chmod(key, 0o644))
		for path, fix := range map[string]string{key: "chmod 600 " + key, link: "symlink"} {
			// Bounded: a service that accepted the key would serve until killed.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, svc), append([]string{"-grpc-addr", "127.0.0.1:0", "-metrics-addr", "",
				"-tls-cert", filepath.Join(pki, svc+".pem"), "-tls-key", path, "-tls-client-ca", filepath.Join(pki, "ca.pem")}, extra...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%s must exit: %v", svc, err)
			require.Equal(t, 1, ee.ExitCode(), "%s: %s", svc, stderr.String())
			require.Contains(t, stderr.String(), "key_file_unsafe", svc)
			require.Contains(t, stderr.String(), fix, svc)
		}
		require.NoError(t, os.Chmod(key, 0o600))
	}
}
