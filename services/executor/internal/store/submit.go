package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/pkg/telemetry"
)

// submitSQL inserts the run and its coordinator in one statement (one round
// trip, one commit). An existing run id inserts nothing and returns its
// stored input digest. Dispatchers are notified after the commit
// (notifyCommitted), not inside it.
const submitSQL = `
WITH ins AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, issue_id, agent_id, trace_parent)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, nullif($11, ''))
  ON CONFLICT (run_id) DO NOTHING
  RETURNING run_id, session_scope, submit_seq),
co AS (
  INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq)
  SELECT run_id, $10, session_scope, submit_seq FROM ins
  RETURNING run_id)
SELECT (SELECT count(*) FROM co) > 0,
       coalesce((SELECT input_digest FROM executor.runs WHERE run_id = $1 AND NOT EXISTS (SELECT 1 FROM ins)), '')`

// Submit stores a queued run and its coordinator, atomically, and notifies
// dispatchers on commit (SPEC: SubmitRun). It is idempotent by run id: the
// same input again is created false; another input under the same id is
// run_id_conflict. The trace context of ctx is kept with the run, so
// whoever drives it continues the caller's trace. The caller reads the run
// (GetRun) afterwards, so a dispatcher of this process can be woken before
// that read.
func (s *Store) Submit(ctx context.Context, runID string, in *prpv1.ExecutionInput) (created bool, err error) {
	end := synctrace.Begin("executor.submit", runID)
	created, err = submit(ctx, s.pool, runID, in)
	end()
	if created {
		s.notifyCommitted(ctx, RunsChannel, runID)
	}
	return created, err
}

// rowQuerier is a pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func submit(ctx context.Context, q rowQuerier, runID string, in *prpv1.ExecutionInput) (created bool, err error) {
	digest, raw, err := InputDigest(in)
	if err != nil {
		return false, err
	}
	var existing string
	err = q.QueryRow(ctx, submitSQL,
		runID, in.GetBinding().GetCompanyId(), in.GetSession().GetNormalizedSessionId(), scope.OfRun(runID, in),
		in.GetSession().GetLifecycle().GetMode().String(), raw, digest,
		in.GetBinding().GetIssueId(), in.GetBinding().GetAgentId(), BindingDigest(in),
		telemetry.TraceParent(ctx)).Scan(&created, &existing)
	if err != nil {
		return false, err
	}
	if !created && existing == "" {
		// Inserted concurrently, after this statement's snapshot: read it
		// now that it committed.
		if err := q.QueryRow(ctx, `SELECT input_digest FROM executor.runs WHERE run_id = $1`, runID).Scan(&existing); err != nil {
			return false, err
		}
	}
	if !created && existing != digest {
		return false, failure.New(codes.AlreadyExists, failure.RunIDConflict, "run %q already exists with a different input", runID)
	}
	return created, nil
}
