// Package pgstore opens PostgreSQL pools and applies a service's embedded
// goose migrations: the one way the executor's and the backup verifier's
// stores connect and migrate.
package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/tether-run/tether/pkg/failure"
)

var _ = stdlib.GetDefaultDriver // registers the "pgx" database/sql driver

// Option adjusts the pool Open connects.
type Option func(*pgxpool.Config)

// MaxConns caps the pool at n connections; n ≤ 0 keeps pgx's default (the
// larger of 4 and the core count).
func MaxConns(n int) Option {
	return func(c *pgxpool.Config) {
		if n > 0 {
			c.MaxConns = int32(n)
		}
	}
}

// PingAfterIdle is the idle time after which a pooled connection is pinged
// before it is handed out. pgx's default (1 s) put a round trip before
// every statement of a turn a person types (SPEC P6: a turn after idle
// costs what a warm turn costs); the pool's health check (every minute)
// still closes connections that died while idle.
const PingAfterIdle = 30 * time.Second

// Open connects a pool to dsn and pings it.
func Open(ctx context.Context, dsn string, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > PingAfterIdle }
	// Statements get spans as children of the caller's span (the hot path:
	// a driven run's appends and claims under its `executor drive` span);
	// a background loop without a recording span records nothing, and no
	// query parameter is ever put in a span (SPEC D6).
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithDisableAcquireTracer(), otelpgx.WithDisableConnectionDetailsInAttributes())
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Migrations are a service's embedded numbered migrations: the files of
// Dir in FS, with their applied versions kept in Table.
type Migrations struct {
	FS    fs.FS
	Dir   string
	Table string
}

// Migrate applies m to the database at dsn.
func Migrate(ctx context.Context, dsn string, m Migrations) error {
	_, err := Apply(ctx, dsn, m)
	return err
}

// Apply applies m to the database at dsn and returns the versions it
// applied (none when the schema was current).
func Apply(ctx context.Context, dsn string, m Migrations) ([]int64, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return apply(ctx, db, m)
}

// MigrateDB applies m on an open database.
func MigrateDB(ctx context.Context, db *sql.DB, m Migrations) error {
	_, err := apply(ctx, db, m)
	return err
}

func apply(ctx context.Context, db *sql.DB, m Migrations) ([]int64, error) {
	p, err := provider(db, m)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	var applied []int64
	for _, r := range res {
		if r.Error == nil {
			applied = append(applied, r.Source.Version)
		}
	}
	return applied, err
}

// provider is m's goose provider on db: under a PostgreSQL session
// advisory lock, so that replicas starting together on one database (or a
// migrate job beside them) apply each migration once while the others wait
// for it (without it, two executors on a fresh database collided in goose:
// duplicate key … pg_namespace_nspname_index); out of order, so that a
// migration landing after a higher-numbered one was applied (two branches
// merged in either order) is applied, not refused.
func provider(db *sql.DB, m Migrations) (*goose.Provider, error) {
	sub, err := fs.Sub(m.FS, m.Dir)
	if err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(m.Table)))
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithTableName(m.Table),
		goose.WithSessionLocker(locker), goose.WithAllowOutofOrder(true))
}

// Pending returns the versions of m the database at dsn has not applied,
// in order, without writing anything (a database no migration ever ran
// on lacks them all). Versions the database holds beyond m (a newer
// release migrated it) are not pending: they are additive, and a binary
// one release older keeps working on them (SPEC L3).
func Pending(ctx context.Context, dsn string, m Migrations) ([]int64, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	p, err := provider(db, m)
	if err != nil {
		return nil, err
	}
	applied := map[int64]bool{}
	rows, err := db.QueryContext(ctx, "SELECT version_id FROM "+m.Table+" WHERE is_applied")
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"):
		// undefined_table / invalid_schema_name: never migrated.
	case err != nil:
		return nil, err
	default:
		defer rows.Close()
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				return nil, err
			}
			applied[v] = true
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	var pending []int64
	for _, src := range p.ListSources() {
		if !applied[src.Version] {
			pending = append(pending, src.Version)
		}
	}
	return pending, nil
}

// CheckCurrent fails with schema_outdated, naming the missing versions
// and the command that applies them, when the database at dsn lacks any
// migration of m.
func CheckCurrent(ctx context.Context, dsn string, m Migrations, migrateCommand string) error {
	pending, err := Pending(ctx, dsn, m)
	if err != nil {
		return fmt.Errorf("reading the schema version: %w", err)
	}
	if len(pending) == 0 {
		return nil
	}
	names := make([]string, len(pending))
	for i, v := range pending {
		names[i] = fmt.Sprintf("%05d", v)
	}
	return failure.Newf(failure.SchemaOutdated, "the database lacks migration(s) %s that this binary needs: run `%s` (or start with -migrate)",
		strings.Join(names, ", "), migrateCommand)
}

// lockID is the advisory lock key of a migrations table: one service's
// replicas serialize, two services sharing a database do not wait on each
// other.
func lockID(table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("tether-migrations\x00" + table))
	return int64(h.Sum64() >> 1)
}

// RunMigrate is the body of a service's `migrate` command: it applies m to
// the database at dsn (waiting for the migration lock while another
// replica or job holds it) and reports what it applied on w.
func RunMigrate(ctx context.Context, w io.Writer, service, dsn string, m Migrations) error {
	if dsn == "" {
		return fmt.Errorf("-database-url (or TETHER_DATABASE_URL) is required")
	}
	applied, err := Apply(ctx, dsn, m)
	for _, v := range applied {
		fmt.Fprintf(w, "%s: applied migration %05d\n", service, v)
	}
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	if len(applied) == 0 {
		fmt.Fprintf(w, "%s: schema is current (%d migrations)\n", service, len(sourcesOf(m)))
	}
	return nil
}

// sourcesOf lists m's migration files (numbered .sql files of Dir).
func sourcesOf(m Migrations) []string {
	names, _ := fs.Glob(m.FS, m.Dir+"/*.sql")
	return names
}
