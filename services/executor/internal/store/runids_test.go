package store_test

import (
	"context"
	"database/sql"
	"io/fs"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func companyInput(company, session, prompt string) *prpv1.ExecutionInput {
	in := input(session, prompt)
	in.Binding.CompanyId = company
	return in
}

// TestT2_AnUpgradedDatabaseKeepsItsRunsAddressableByTheirIDs: a database
// with runs from before run ids were per company (migration 00025) is
// migrated: its runs keep their ids as both key and id, are found by
// their company's callers and by an operator under the id they had, and
// are resubmitted idempotently; another company then submitting the same
// id gets a run of its own (under a fresh key), and an operator naming the
// id without a company is refused as ambiguous.
func TestT2_AnUpgradedDatabaseKeepsItsRunsAddressableByTheirIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, Migrator)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	migrations, err := fs.Sub(store.Migrations, "migrations")
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations, goose.WithTableName(store.GooseTable))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 24)
	require.NoError(t, err)
	// Before: a run as an executor of then stored it.
	old := companyInput("acme", "s-old", "from before")
	digest, raw, err := store.InputDigest(old)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `
INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
VALUES ('old-1', 'acme', 's-old', $1, 'LIFECYCLE_MODE_WARM', $2, $3)`, scope.OfRun("old-1", old), raw, digest)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `
INSERT INTO executor.coordinators (run_id, session_scope, submit_seq, binding_digest)
SELECT run_id, session_scope, submit_seq, $1 FROM executor.runs WHERE run_id = 'old-1'`, store.BindingDigest(old))
	require.NoError(t, err)
	require.NoError(t, store.MigrateDB(ctx, db))

	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	defer s.Close()
	for _, ref := range []store.RunRef{{ID: "old-1", Companies: []string{"acme"}}, {ID: "old-1"}, {ID: "old-1", Company: "acme"}} {
		r, err := s.ResolveRun(ctx, ref)
		require.NoError(t, err, "%+v", ref)
		require.Equal(t, store.ResolvedRun{Key: "old-1", Company: "acme"}, r)
	}
	_, err = s.ResolveRun(ctx, store.RunRef{ID: "old-1", Companies: []string{"globex"}})
	require.EqualValues(t, failure.RunNotFound, failure.CodeOf(err))
	run, err := s.GetRun(ctx, "old-1")
	require.NoError(t, err)
	require.Equal(t, "old-1", run.GetRunId())
	created, err := s.Submit(store.WithClientRunID(ctx, "old-1"), "old-1", old)
	require.NoError(t, err)
	require.False(t, created, "an idempotent resubmission of the old run")

	// globex submits the same id: the key is taken, a fresh one is not.
	globex := companyInput("globex", "s-old", "globex's own")
	gctx := store.WithClientRunID(ctx, "old-1")
	_, err = s.Submit(gctx, "old-1", globex)
	require.ErrorIs(t, err, store.ErrRunKeyTaken)
	key := store.NewRunKey()
	created, err = s.Submit(gctx, key, globex)
	require.NoError(t, err)
	require.True(t, created)
	created, err = s.Submit(gctx, "old-1", globex)
	require.NoError(t, err, "globex's resubmission finds its run under its key")
	require.False(t, created)
	r, err := s.ResolveRun(ctx, store.RunRef{ID: "old-1", Companies: []string{"globex"}})
	require.NoError(t, err)
	require.Equal(t, store.ResolvedRun{Key: key, Company: "globex"}, r)
	run, found, err := s.FindRun(ctx, store.RunRef{ID: "old-1", Company: "globex"})
	require.NoError(t, err)
	require.Equal(t, "old-1", run.GetRunId(), "the run shows the id its company chose")
	require.Equal(t, key, found.Key)
	_, err = s.ResolveRun(ctx, store.RunRef{ID: "old-1"})
	require.EqualValues(t, failure.RunIDAmbiguous, failure.CodeOf(err))
	_, _, err = s.FindRun(ctx, store.RunRef{ID: "old-1"})
	require.EqualValues(t, failure.RunIDAmbiguous, failure.CodeOf(err))
}
