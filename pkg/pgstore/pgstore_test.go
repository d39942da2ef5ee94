package pgstore_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/pgtest"
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
