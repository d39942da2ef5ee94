package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// emptySchema is a database no service migrated yet.
var emptySchema = pgtest.MigratorFunc("empty", func(context.Context, *sql.DB) error { return nil })

// startsServing runs bin with args until it logs "serving" (true) or exits
// (false, with its stderr).
func startsServing(t *testing.T, bin string, args ...string) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return false, stderr.String()
		case <-tick.C:
			if strings.Contains(stderr.String(), `"msg":"serving"`) {
				_ = cmd.Process.Kill()
				<-done
				return true, stderr.String()
			}
		}
	}
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestL3_ExecutorMigrateAppliesEachMigrationOnceAndAnUnmigratedExecutorRefusesToStart:
// the deployment order of an upgrade. An executor started with
// -migrate=false on a database that lacks its migrations refuses to start
// (schema_outdated, naming `executor migrate`), as does `executor migrate
// -check` (what an init container waits with); two `executor migrate`
// jobs racing on the fresh database apply every migration exactly once
// between them (the lock) and both succeed; the executor then starts.
func TestL3_ExecutorMigrateAppliesEachMigrationOnceAndAnUnmigratedExecutorRefusesToStart(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, emptySchema)
	pki := t.TempDir()
	out, err := exec.Command(filepath.Join(binDir, "tetherctl"), "certs", "init", pki).CombinedOutput()
	require.NoError(t, err, "%s", out)
	dir := t.TempDir()
	serve := []string{"-grpc-addr", "127.0.0.1:0", "-metrics-addr", "", "-database-url", dsn, "-migrate=false",
		"-grant-key-file", filepath.Join(pki, "grant.key"), "-gateway-addr", "127.0.0.1:1",
		"-registration-secret-file", filepath.Join(dir, "registration.secret"), "-secrets-key-file", filepath.Join(dir, "secrets.key")}

	ok, stderr := startsServing(t, "executor", serve...)
	require.False(t, ok, "an executor on an unmigrated database must not serve: %s", stderr)
	require.Contains(t, stderr, "schema_outdated")
	require.Contains(t, stderr, "executor migrate")

	// The check an init container waits with: schema_outdated, exit 1.
	out, err = exec.Command(filepath.Join(binDir, "executor"), "migrate", "-check", "-database-url", dsn).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "schema_outdated")

	names, err := fs.Glob(store.Migrations, "migrations/*.sql")
	require.NoError(t, err)
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b bytes.Buffer
			cmd := exec.Command(filepath.Join(binDir, "executor"), "migrate", "-database-url", dsn)
			cmd.Stdout, cmd.Stderr = &b, &b
			errs[i] = cmd.Run()
			outs[i] = b.String()
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...), "%s\n%s", outs[0], outs[1])
	both := outs[0] + outs[1]
	require.Equal(t, len(names), strings.Count(both, "applied migration"), "each migration applied once between the two jobs:\n%s", both)
	require.Contains(t, both, "applied migration 00001")

	out, err = exec.Command(filepath.Join(binDir, "executor"), "migrate", "-database-url", dsn).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "schema is current")
	out, err = exec.Command(filepath.Join(binDir, "executor"), "migrate", "-check", "-database-url", dsn).CombinedOutput()
	require.NoError(t, err, "%s", out)

	ok, stderr = startsServing(t, "executor", serve...)
	require.True(t, ok, "the migrated executor serves: %s", stderr)
}

// TestL3_BackupVerifierMigrateThenStartWithoutMigrating: the verifier has
// the same command and the same refusal.
func TestL3_BackupVerifierMigrateThenStartWithoutMigrating(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, emptySchema)
	dir := t.TempDir()
	stamp := filepath.Join(dir, "stamp.key")
	require.NoError(t, writeKeyFile(stamp))
	serve := []string{"-grpc-addr", "127.0.0.1:0", "-metrics-addr", "", "-database-url", dsn, "-migrate=false",
		"-stamp-key-file", stamp, "-staging-dir", filepath.Join(dir, "staging"),
		"-blob-url", "file://" + filepath.Join(dir, "blobs") + "?create_dir=true"}
	ok, stderr := startsServing(t, "backup-verifier", serve...)
	require.False(t, ok, "%s", stderr)
	require.Contains(t, stderr, "schema_outdated")
	require.Contains(t, stderr, "backup-verifier migrate")

	out, err := exec.Command(filepath.Join(binDir, "backup-verifier"), "migrate", "-database-url", dsn).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "applied migration 00001")
	ok, stderr = startsServing(t, "backup-verifier", serve...)
	require.True(t, ok, "%s", stderr)
}

// writeKeyFile writes a 32-byte key file (mode 0600) at path.
func writeKeyFile(path string) error {
	return os.WriteFile(path, bytes.Repeat([]byte("k"), 32), 0o600)
}
