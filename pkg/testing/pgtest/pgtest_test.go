package pgtest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
)

func TestMain(m *testing.M) {
	if os.Getenv("PGTEST_HELPER_START") == "1" {
		helperStartAndHang()
		return
	}
	Main(m)
}

var testMigrations = fstest.MapFS{
	"migrations/00001_init.sql": {Data: []byte(`-- +goose Up
CREATE TABLE widgets (id bigint PRIMARY KEY, name text NOT NULL);
INSERT INTO widgets VALUES (1, 'seed');
-- +goose Down
DROP TABLE widgets;
`)},
	"migrations/00002_more.sql": {Data: []byte(`-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION widget_count() RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM widgets $$;
-- +goose StatementEnd
-- +goose Down
DROP FUNCTION widget_count();
`)},
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestClusterLifecycle starts the one cluster of its own that this
// package's tests initdb (besides the shared one and the watchdog test's):
// durable, with a setting, so that it checks those options too.
func TestClusterLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := Start(ctx, WithDurable(), WithSetting("max_connections", "20"))
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := c.pid, c.Dir()
	watchdogPID := c.watchdog.Process.Pid
	if !processAlive(pid) {
		t.Fatalf("postmaster %d not running", pid)
	}
	if !strings.HasPrefix(c.DSN("x"), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?", c.Port())) {
		t.Fatalf("DSN = %s", c.DSN("x"))
	}

	for _, db := range []string{"alpha", "beta"} {
		if err := c.CreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	func() {
		a, err := pgx.Connect(ctx, c.DSN("alpha"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		if _, err := a.Exec(ctx, "CREATE TABLE only_in_alpha (x int)"); err != nil {
			t.Fatal(err)
		}
		var fsync, maxConn string
		if err := a.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('max_connections')").Scan(&fsync, &maxConn); err != nil {
			t.Fatal(err)
		}
		if fsync != "on" || maxConn != "20" {
			t.Fatalf("WithDurable, WithSetting: fsync=%s max_connections=%s", fsync, maxConn)
		}
		b, err := pgx.Connect(ctx, c.DSN("beta"))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		var n int
		if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_alpha'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("beta sees alpha's table: n=%d err=%v", n, err)
		}
	}()
	if err := c.DropDatabase(ctx, "beta"); err != nil {
		t.Fatal(err)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Errorf("postmaster %d still running after Close", pid)
	}
	if processAlive(watchdogPID) {
		t.Errorf("watchdog %d still running after Close", watchdogPID)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster dir %s still exists (err=%v)", dir, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestNotDurableByDefault checks the shared cluster, started without
// options.
func TestNotDurableByDefault(t *testing.T) {
	t.Parallel()
	if os.Getenv(EnvTestDatabaseURL) != "" {
		t.Skip("not a cluster of ours")
	}
	conn := connect(t, NewDB(t, nil))
	var fsync string
	if err := conn.QueryRow(context.Background(), "SHOW fsync").Scan(&fsync); err != nil || fsync != "off" {
		t.Fatalf("fsync = %q, %v; want off by default", fsync, err)
	}
}

func TestMissingBinaries(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), WithBinDir(t.TempDir()))
	if !errors.Is(err, ErrNoPostgres) || !strings.Contains(err.Error(), "apt-get install -y postgresql") {
		t.Fatalf("err = %v", err)
	}
}

func TestGooseMigratorHash(t *testing.T) {
	t.Parallel()
	m := GooseMigrator(testMigrations, "migrations")
	h1, err := m.Hash()
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := GooseMigrator(testMigrations, "migrations").Hash()
	if h1 != h2 {
		t.Fatal("hash not stable")
	}
	changed := fstest.MapFS{}
	for k, v := range testMigrations {
		changed[k] = v
	}
	changed["migrations/00003_x.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nSELECT 1;\n")}
	h3, _ := GooseMigrator(changed, "migrations").Hash()
	if h3 == h1 {
		t.Fatal("hash did not change with the migrations")
	}
}

func TestNewDBIsolated(t *testing.T) {
	t.Parallel()
	m := GooseMigrator(testMigrations, "migrations")
	var dsns [2]string
	for i := range dsns {
		dsns[i] = NewDB(t, m)
	}
	if dsns[0] == dsns[1] {
		t.Fatal("same database twice")
	}
	ctx := context.Background()
	a, b := connect(t, dsns[0]), connect(t, dsns[1])
	if _, err := a.Exec(ctx, "INSERT INTO widgets VALUES (2, 'only in a')"); err != nil {
		t.Fatal(err)
	}
	var na, nb int64
	if err := a.QueryRow(ctx, "SELECT widget_count()").Scan(&na); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "SELECT widget_count()").Scan(&nb); err != nil {
		t.Fatal(err)
	}
	if na != 2 || nb != 1 {
		t.Fatalf("counts a=%d b=%d, want 2 and 1", na, nb)
	}
	// The template was migrated once: goose recorded each version once.
	var versions int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM goose_db_version WHERE version_id > 0").Scan(&versions); err != nil || versions != 2 {
		t.Fatalf("goose versions = %d, %v", versions, err)
	}
}

func TestNewDBParallel(t *testing.T) {
	t.Parallel()
	m := GooseMigrator(testMigrations, "migrations")
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			conn := connect(t, NewDB(t, m))
			var n int64
			if err := conn.QueryRow(context.Background(), "SELECT widget_count()").Scan(&n); err != nil || n != 1 {
				t.Fatalf("n=%d err=%v", n, err)
			}
		})
	}
}

func TestNewDBEmptyAndDropped(t *testing.T) {
	t.Parallel()
	var dsn string
	t.Run("inner", func(t *testing.T) {
		dsn = NewDB(t, nil)
		conn := connect(t, dsn)
		if _, err := conn.Exec(context.Background(), "CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	// The passing subtest's database was dropped.
	ctx := context.Background()
	_, err := pgx.Connect(ctx, dsn)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("database still reachable after its test: %v", err)
	}
}

func TestNewDBMigrationError(t *testing.T) {
	t.Parallel()
	bad := MigratorFunc("broken-v1", func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "CREATE TABLE nope (")
		return err
	})
	// NewDB fails the test; run it against a recorder.
	rec := &recordingTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		NewDB(rec, bad)
	}()
	if !rec.fatal || !strings.Contains(rec.msg, "syntax error") {
		t.Fatalf("fatal=%v msg=%q", rec.fatal, rec.msg)
	}
}

// recordingTB turns Fatalf into a recorded panic.
type recordingTB struct {
	testing.TB
	fatal bool
	msg   string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal, r.msg = true, fmt.Sprintf(format, args...)
	panic("fatal")
}

// TestWatchdogCleansUpAfterKill starts a cluster in a child process, kills the
// child with SIGKILL and expects the watchdog to stop the server and remove
// its directory.
func TestWatchdogCleansUpAfterKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a second cluster")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PGTEST_HELPER_START=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var pid int
	var dir string
	if _, err := fmt.Sscanf(line, "%d %s", &pid, &dir); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	if !processAlive(pid) {
		t.Fatalf("postmaster %d not running", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		gone := errors.Is(statErr, os.ErrNotExist)
		if !processAlive(pid) && gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after owner death: postmaster alive=%v, dir exists=%v", processAlive(pid), !gone)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExternalServerURL runs NewDB tests in a child process pointed at this
// process's shared server through TETHER_TEST_DATABASE_URL. It is not
// parallel: it counts the test databases left on that server, and runs
// while this process's parallel tests (which create some) still wait.
func TestExternalServerURL(t *testing.T) {
	if os.Getenv(EnvTestDatabaseURL) != "" {
		t.Skip("already the child")
	}
	base, err := server()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^(TestNewDBIsolated|TestNewDBParallel|TestExternalURLUsed)$", "-test.count=1")
	cmd.Env = append(os.Environ(), EnvTestDatabaseURL+"="+base)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	conn := connect(t, base)
	var leftovers int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname LIKE 'tether_test_%'").Scan(&leftovers); err != nil {
		t.Fatal(err)
	}
	if leftovers != 0 {
		t.Fatalf("%d test databases left behind", leftovers)
	}
}

func TestExternalURLUsed(t *testing.T) {
	want := os.Getenv(EnvTestDatabaseURL)
	if want == "" {
		t.Skip("only in the child of TestExternalServerURL")
	}
	dsn := NewDB(t, nil)
	if shared.cluster != nil {
		t.Fatal("a cluster was started despite " + EnvTestDatabaseURL)
	}
	if !strings.HasPrefix(dsn, strings.TrimSuffix(want, "/postgres?sslmode=disable")) {
		t.Fatalf("dsn %s not on %s", dsn, want)
	}
}

func helperStartAndHang() {
	c, err := Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%d %s\n", c.pid, c.Dir())
	time.Sleep(time.Hour)
}

// Two schemas in one template, each with its own goose version table, as
// the end-to-end stack's services share one database.
func TestNewDBMigratorsApplyEachSchemaInOrder(t *testing.T) {
	t.Parallel()
	other := fstest.MapFS{"m/00001_gadgets.sql": {Data: []byte("-- +goose Up\nCREATE TABLE gadgets (widget bigint REFERENCES widgets);\n")}}
	both := Migrators(GooseMigrator(testMigrations, "migrations"), GooseMigrator(other, "m", goose.WithTableName("other_goose_version")))
	h1, err := both.Hash()
	if err != nil {
		t.Fatal(err)
	}
	if h2, _ := Migrators(GooseMigrator(other, "m"), GooseMigrator(testMigrations, "migrations")).Hash(); h2 == h1 {
		t.Fatal("the hash ignores the order")
	}
	conn := connect(t, NewDB(t, both))
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM goose_db_version WHERE version_id > 0) + (SELECT count(*) FROM other_goose_version WHERE version_id > 0)").Scan(&n); err != nil || n != 3 {
		t.Fatalf("versions = %d, %v", n, err)
	}
	if _, err := conn.Exec(context.Background(), "INSERT INTO gadgets VALUES (1)"); err != nil {
		t.Fatal(err)
	}
}
