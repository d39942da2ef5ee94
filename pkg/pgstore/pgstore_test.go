package pgstore_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func migration(sql string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte("-- +goose Up\n" + sql + "\n")}
}

// TestL3_AMigrationThatLandsAfterAHigherOneIsAppliedNotRefused: two
// branches each add a migration and land in the other order, so a database
// already holds 00003 when 00002 arrives. The next start applies 00002
// instead of refusing to run (goose's default), and the version table
// records each once.
func TestL3_AMigrationThatLandsAfterAHigherOneIsAppliedNotRefused(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, pgtest.MigratorFunc("empty", func(context.Context, *sql.DB) error { return nil }))
	ctx := context.Background()
	first := fstest.MapFS{
		"m/00001_a.sql": migration("CREATE TABLE l3_a (id int);"),
		"m/00003_c.sql": migration("CREATE TABLE l3_c (id int);"),
	}
	require.NoError(t, pgstore.Migrate(ctx, dsn, pgstore.Migrations{FS: first, Dir: "m", Table: "l3_version"}))
	later := fstest.MapFS{
		"m/00001_a.sql": first["m/00001_a.sql"],
		"m/00002_b.sql": migration("CREATE TABLE l3_b (id int);"),
		"m/00003_c.sql": first["m/00003_c.sql"],
	}
	require.NoError(t, pgstore.Migrate(ctx, dsn, pgstore.Migrations{FS: later, Dir: "m", Table: "l3_version"}))

	pool, err := pgstore.Open(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	var versions []int64
	rows, err := pool.Query(ctx, `SELECT version_id FROM l3_version WHERE version_id > 0 ORDER BY version_id`)
	require.NoError(t, err)
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		versions = append(versions, v)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{1, 2, 3}, versions)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('l3_b') IS NOT NULL`).Scan(&exists))
	require.True(t, exists, "00002 was applied")
}

// TestL3_ABinaryOnAnOlderSchemaIsToldWhichMigrationsAndWhichCommand: a
// service started without migrating checks the schema first: a database
// never migrated, or one release behind, is schema_outdated naming each
// missing version and the command that applies it; once migrated it
// passes. Checking writes nothing (no version table appears).
func TestL3_ABinaryOnAnOlderSchemaIsToldWhichMigrationsAndWhichCommand(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, pgtest.MigratorFunc("empty", func(context.Context, *sql.DB) error { return nil }))
	ctx := context.Background()
	older := fstest.MapFS{"m/00001_a.sql": migration("CREATE TABLE l3o_a (id int);")}
	newer := fstest.MapFS{
		"m/00001_a.sql": older["m/00001_a.sql"],
		"m/00002_b.sql": migration("CREATE TABLE l3o_b (id int);"),
	}
	m := pgstore.Migrations{FS: newer, Dir: "m", Table: "l3o_version"}

	err := pgstore.CheckCurrent(ctx, dsn, m, "svc migrate")
	require.Error(t, err)
	require.EqualValues(t, failure.SchemaOutdated, failure.CodeOf(err))
	require.Contains(t, err.Error(), "00001, 00002")
	require.Contains(t, err.Error(), "`svc migrate`")
	pool, err := pgstore.Open(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('l3o_version') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "checking the schema writes nothing")

	applied, err := pgstore.Apply(ctx, dsn, pgstore.Migrations{FS: older, Dir: "m", Table: "l3o_version"})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, applied)
	err = pgstore.CheckCurrent(ctx, dsn, m, "svc migrate")
	require.EqualValues(t, failure.SchemaOutdated, failure.CodeOf(err))
	require.Contains(t, err.Error(), "migration(s) 00002 ")

	applied, err = pgstore.Apply(ctx, dsn, m)
	require.NoError(t, err)
	require.Equal(t, []int64{2}, applied)
	require.NoError(t, pgstore.CheckCurrent(ctx, dsn, m, "svc migrate"))
	applied, err = pgstore.Apply(ctx, dsn, m)
	require.NoError(t, err)
	require.Empty(t, applied, "a current schema applies nothing")
}

// TestL3_ABinaryOneReleaseOlderKeepsWorkingOnANewerSchema: during a rolling
// upgrade the new release migrates first; a replica of the previous
// release then finds versions it does not know. Those are additive: its
// check passes and its start-up migrate applies nothing and does not fail.
func TestL3_ABinaryOneReleaseOlderKeepsWorkingOnANewerSchema(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, pgtest.MigratorFunc("empty", func(context.Context, *sql.DB) error { return nil }))
	ctx := context.Background()
	older := pgstore.Migrations{FS: fstest.MapFS{"m/00001_a.sql": migration("CREATE TABLE l3n_a (id int);")}, Dir: "m", Table: "l3n_version"}
	newer := pgstore.Migrations{FS: fstest.MapFS{
		"m/00001_a.sql": migration("CREATE TABLE l3n_a (id int);"),
		"m/00002_b.sql": migration("ALTER TABLE l3n_a ADD COLUMN note text;"),
	}, Dir: "m", Table: "l3n_version"}
	_, err := pgstore.Apply(ctx, dsn, newer)
	require.NoError(t, err)
	require.NoError(t, pgstore.CheckCurrent(ctx, dsn, older, "svc migrate"))
	applied, err := pgstore.Apply(ctx, dsn, older)
	require.NoError(t, err)
	require.Empty(t, applied)
}
