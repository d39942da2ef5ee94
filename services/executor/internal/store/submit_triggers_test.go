package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// SPEC P1: a submission's coordinator checks its run in its row trigger
// (migration 00038): no statement trigger with a transition table fires
// for it, and the run the submission itself inserted is not locked FOR KEY
// SHARE (nothing can delete it before the commit). Counted: the statement
// triggers on a coordinator insert (1 before 00038, 0) and the runs left
// with a row lock by their own submission (xmax set: 1 per submission
// before, 0). A coordinator inserted for a run of an earlier transaction
// still locks it, as a foreign key check does; a run that does not exist
// is still refused (TestRunReferencesHoldLikeForeignKeys).
func TestP1_ASubmissionLocksNotItsOwnRunAndFiresNoStatementTrigger(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	db := s.Pool()

	var statementTriggers int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_trigger
 WHERE tgrelid = 'executor.coordinators'::regclass AND NOT tgisinternal
   AND tgtype & 1 = 0 AND tgtype & 4 <> 0`).Scan(&statementTriggers)) // statement level, on INSERT
	require.Zero(t, statementTriggers, "statement triggers on a coordinator insert")

	_, err := s.Submit(ctx, "p1", input("locks", "p1"))
	require.NoError(t, err)
	_, c, _, err := s.SubmitClaim(ctx, "p2", input("locks-2", "p2"), "o", time.Minute, store.Controller{}, &store.AttachReads{PriorRuns: 4})
	require.NoError(t, err)
	require.NotNil(t, c)
	_, c, _, err = s.SubmitClaim(ctx, "p3", input("locks-2", "p3"), "o", time.Minute, store.Controller{}, nil)
	require.NoError(t, err)
	require.Nil(t, c, "queued behind p2")
	var locked int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM executor.runs WHERE run_id IN ('p1', 'p2', 'p3') AND xmax <> '0'`).Scan(&locked))
	require.Zero(t, locked, "runs locked by their own submission")

	// A coordinator of a run an earlier transaction stored locks the run.
	_, err = db.Exec(ctx, `DELETE FROM executor.coordinators WHERE run_id = 'p1'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO executor.coordinators (run_id, session_scope, submit_seq)
 SELECT run_id, session_scope, submit_seq FROM executor.runs WHERE run_id = 'p1'`)
	require.NoError(t, err)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM executor.runs WHERE run_id = 'p1' AND xmax <> '0'`).Scan(&locked))
	require.Equal(t, 1, locked, "the run of an earlier transaction is locked FOR KEY SHARE")
	var company string
	require.NoError(t, db.QueryRow(ctx, `SELECT company_id FROM executor.coordinators WHERE run_id = 'p1'`).Scan(&company))
	require.Equal(t, "acme", company, "an insert without the company gets the run's")
}
