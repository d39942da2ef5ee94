package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"go.uber.org/goleak"
)

// EnvTestDatabaseURL names the environment variable that points tests at an
// existing server instead of a throwaway cluster, e.g.
// postgres://user:pass@db:5432/postgres?sslmode=disable. The user needs
// CREATEDB. Template databases (tether_tpl_*) are left on that server for
// later runs; test databases are dropped when their test passes.
const EnvTestDatabaseURL = "TETHER_TEST_DATABASE_URL"

// Migrator prepares the template database that NewDB clones.
type Migrator interface {
	// Hash identifies the resulting schema (e.g. a digest of the migration
	// files). Templates are reused across calls, and across processes sharing
	// a server, when the hash matches.
	Hash() (string, error)
	// Migrate applies the schema to an empty database.
	Migrate(ctx context.Context, db *sql.DB) error
}

// MigratorFunc adapts a function to Migrator. key must change whenever fn's
// effect does.
func MigratorFunc(key string, fn func(ctx context.Context, db *sql.DB) error) Migrator {
	return funcMigrator{key, fn}
}

type funcMigrator struct {
	key string
	fn  func(context.Context, *sql.DB) error
}

func (m funcMigrator) Hash() (string, error)                         { return m.key, nil }
func (m funcMigrator) Migrate(ctx context.Context, db *sql.DB) error { return m.fn(ctx, db) }

// GooseMigrator runs the goose SQL migrations in dir of fsys (typically an
// embed.FS holding migrations/*.sql). The hash covers the names and contents
// of the files directly in dir. Goose's global Go-migration registry is not
// used; pass goose.WithGoMigrations in opts if you need Go migrations (and
// remember they are not part of the hash).
func GooseMigrator(fsys fs.FS, dir string, opts ...goose.ProviderOption) Migrator {
	return gooseMigrator{fsys: fsys, dir: dir, opts: opts}
}

type gooseMigrator struct {
	fsys fs.FS
	dir  string
	opts []goose.ProviderOption
}

func (m gooseMigrator) Hash() (string, error) {
	entries, err := fs.ReadDir(m.fsys, m.dir)
	if err != nil {
		return "", fmt.Errorf("pgtest: reading migrations: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	h := sha256.New()
	h.Write([]byte("goose\x00"))
	for _, n := range names {
		b, err := fs.ReadFile(m.fsys, path.Join(m.dir, n))
		if err != nil {
			return "", fmt.Errorf("pgtest: reading migrations: %w", err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (m gooseMigrator) Migrate(ctx context.Context, db *sql.DB) error {
	sub, err := fs.Sub(m.fsys, m.dir)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	opts := append([]goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}, m.opts...)
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, opts...)
	if err != nil {
		return fmt.Errorf("pgtest: goose: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgtest: goose up: %w", err)
	}
	return nil
}

// Migrators applies ms in order: one template for a database several
// services share (each with its own schema and migrations), so that their
// processes find every migration applied and start at once.
func Migrators(ms ...Migrator) Migrator { return chain(ms) }

type chain []Migrator

func (c chain) Hash() (string, error) {
	h := sha256.New()
	h.Write([]byte("chain\x00"))
	for _, m := range c {
		mh, err := m.Hash()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%d\x00%s", len(mh), mh)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (c chain) Migrate(ctx context.Context, db *sql.DB) error {
	for _, m := range c {
		if err := m.Migrate(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// shared is the per-process server NewDB uses.
var shared struct {
	mu      sync.Mutex
	started bool
	cluster *Cluster
	baseURL string // maintenance database URL
	err     error
	// strategy ends NewDB's CREATE DATABASE: " STRATEGY FILE_COPY" on our
	// own cluster when it is PostgreSQL 15 or later (see createStrategy).
	strategy string

	tplMu     sync.Mutex
	templates map[string]*template
}

type template struct {
	once sync.Once
	name string
	err  error
}

// server returns the URL of the shared server's maintenance database,
// starting the shared cluster on first use.
func server() (string, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.started {
		return shared.baseURL, shared.err
	}
	shared.started = true
	if raw := os.Getenv(EnvTestDatabaseURL); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			shared.err = fmt.Errorf("pgtest: %s must be a postgres:// URL", EnvTestDatabaseURL)
			return "", shared.err
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/postgres"
		}
		shared.baseURL = u.String()
		return shared.baseURL, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx)
	if err != nil {
		shared.err = err
		return "", err
	}
	shared.cluster = c
	shared.baseURL = c.DSN("postgres")
	if shared.strategy, err = createStrategy(ctx, shared.baseURL); err != nil {
		shared.err = err
		return "", err
	}
	return shared.baseURL, nil
}

// createStrategy is how NewDB copies a template on the shared cluster.
// PostgreSQL 15 made WAL_LOG the default: every block of the template is
// written to the WAL and then to the new database. FILE_COPY copies the
// files and takes a checkpoint before and after, which costs little with
// fsync off: it took about a third less server CPU per test database (the
// executor schema's). A server named by TETHER_TEST_DATABASE_URL keeps its
// default: its checkpoints may be durable ones.
func createStrategy(ctx context.Context, base string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return "", fmt.Errorf("pgtest: server version: %w", err)
	}
	if version < 150000 {
		return "", nil // FILE_COPY was the only strategy
	}
	return " STRATEGY FILE_COPY", nil
}

// closeShared stops the shared cluster, if one was started.
func closeShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		return nil
	}
	err := shared.cluster.Close()
	shared.cluster = nil
	shared.err = errors.New("pgtest: shared cluster already closed (pgtest.Main has returned)")
	return err
}

// Main runs the package's tests and then stops the shared cluster:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without it, the cluster is still stopped and removed when the test binary
// exits, by its watchdog, just less promptly.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main returning the exit code instead of exiting, for a TestMain
// with cleanup of its own to do afterwards.
func Run(m *testing.M) int { return run(m, false) }

// MainCheckingLeaks is Main that also fails the package when goroutines
// outlive its tests (goleak, after the shared cluster is stopped). Tests
// running in parallel cannot check for leaks one by one; this checks them
// all at once:
//
//	func TestMain(m *testing.M) { pgtest.MainCheckingLeaks(m) }
func MainCheckingLeaks(m *testing.M, opts ...goleak.Option) { os.Exit(run(m, true, opts...)) }

func run(m *testing.M, leaks bool, opts ...goleak.Option) int {
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if leaks && code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	return code
}

// NewDB returns the URL of a fresh database cloned from a template that m
// migrated once per process (per server, when templates already exist). A nil
// m gives an empty database. The database is dropped when the test passes;
// when it fails on a server named by TETHER_TEST_DATABASE_URL it is kept for
// inspection. Safe for parallel tests.
func NewDB(t testing.TB, m Migrator) string {
	t.Helper()
	base, err := server()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	shared.mu.Lock()
	strategy := shared.strategy
	shared.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tplClause := ""
	if m != nil {
		tpl, err := ensureTemplate(ctx, base, m)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		tplClause = " TEMPLATE " + pgx.Identifier{tpl}.Sanitize()
	}
	name := "tether_test_" + randomHex(8)
	if err := execAdmin(ctx, base, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+tplClause+strategy); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dsn := withDatabase(base, name)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: test database: %s", dsn)
			if os.Getenv(EnvTestDatabaseURL) != "" {
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := execAdmin(ctx, base, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

func ensureTemplate(ctx context.Context, base string, m Migrator) (string, error) {
	h, err := m.Hash()
	if err != nil {
		return "", fmt.Errorf("migrator hash: %w", err)
	}
	sum := sha256.Sum256([]byte(h))
	key := hex.EncodeToString(sum[:12])

	shared.tplMu.Lock()
	if shared.templates == nil {
		shared.templates = map[string]*template{}
	}
	tp := shared.templates[key]
	if tp == nil {
		tp = &template{name: "tether_tpl_" + key}
		shared.templates[key] = tp
	}
	shared.tplMu.Unlock()

	tp.once.Do(func() {
		tp.err = createTemplate(ctx, base, tp.name, int64(binary.BigEndian.Uint64(sum[:8])), m)
	})
	return tp.name, tp.err
}

// createTemplate creates and migrates the template database unless a
// complete one (datistemplate) exists. A session advisory lock serialises
// processes sharing one server.
func createTemplate(ctx context.Context, base, name string, lockKey int64, m Migrator) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("locking template %s: %w", name, err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck

	var isTemplate bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		return nil
	case err == nil:
		// Left over from an interrupted migration.
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("dropping incomplete template %s: %w", name, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("creating template %s: %w", name, err)
	}
	cfg, err := pgx.ParseConfig(withDatabase(base, name))
	if err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg)
	merr := m.Migrate(ctx, db)
	cerr := db.Close()
	if merr != nil {
		return fmt.Errorf("migrating template %s: %w", name, merr)
	}
	if cerr != nil {
		return cerr
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" IS_TEMPLATE true"); err != nil {
		return fmt.Errorf("marking template %s: %w", name, err)
	}
	return nil
}

func withDatabase(base, name string) string {
	u, err := url.Parse(base)
	if err != nil {
		panic(err) // base was produced or validated by server()
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
