package store_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// emptyDB is a fresh database with nothing applied.
func emptyDB(t *testing.T) string {
	t.Helper()
	return pgtest.NewDB(t, pgtest.MigratorFunc("empty", func(context.Context, *sql.DB) error { return nil }))
}

// TestL3_ExecutorsStartingTogetherOnAFreshDatabaseMigrateItOnce: replicas
// of the executor started at once on an empty database each run the
// embedded migrations (as the executor does at start). Before, they raced
// inside goose (duplicate key … pg_namespace_nspname_index, the loser
// exited); under the migrations' advisory lock every one succeeds, each
// migration applied once, and the schema works.
func TestL3_ExecutorsStartingTogetherOnAFreshDatabaseMigrateItOnce(t *testing.T) {
	t.Parallel()
	dsn := emptyDB(t)
	ctx := context.Background()
	const replicas = 6
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	start := make(chan struct{})
	for i := range replicas {
		wg.Go(func() {
			<-start
			errs[i] = store.Migrate(ctx, dsn)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "replica %d", i)
	}
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	defer s.Close()
	var applied, distinct int
	require.NoError(t, s.Pool().QueryRow(ctx,
		`SELECT count(*), count(DISTINCT version_id) FROM executor_goose_version WHERE version_id > 0`).Scan(&applied, &distinct))
	require.Equal(t, distinct, applied, "each migration applied once")
	_, _, err = s.SubmitRun(ctx, "l3-1", input("l3", "after a concurrent migration"))
	require.NoError(t, err)
}
