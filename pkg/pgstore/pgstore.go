// Package pgstore opens PostgreSQL pools and applies a service's embedded
// goose migrations: the one way the executor's and the backup verifier's
// stores connect and migrate.
package pgstore

import (
	"context"
	"database/sql"
	"hash/fnv"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
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

// Open connects a pool to dsn and pings it.
func Open(ctx context.Context, dsn string, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
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
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return MigrateDB(ctx, db, m)
}

// MigrateDB applies m on an open database.
func MigrateDB(ctx context.Context, db *sql.DB, m Migrations) error {
	sub, err := fs.Sub(m.FS, m.Dir)
	if err != nil {
		return err
	}
	// Under a PostgreSQL session advisory lock: replicas starting together
	// on one database apply each migration once, the others wait for it
	// (without it, two executors on a fresh database collided in goose:
	// duplicate key … pg_namespace_nspname_index). Out of order: a
	// migration that lands after a higher-numbered one was applied (two
	// branches merged in either order) is applied, not refused.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(m.Table)))
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithTableName(m.Table),
		goose.WithSessionLocker(locker), goose.WithAllowOutofOrder(true))
	if err != nil {
		return err
	}
	_, err = p.Up(ctx)
	return err
}

// lockID is the advisory lock key of a migrations table: one service's
// replicas serialize, two services sharing a database do not wait on each
// other.
func lockID(table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("tether-migrations\x00" + table))
	return int64(h.Sum64() >> 1)
}
