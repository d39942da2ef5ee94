package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// ReplacementRequest is an operator's ReplaceSession decision for one scope
// (SPEC F3).
type ReplacementRequest struct {
	Scope, CompanyID, SessionID string
	RequestedBy, Caller, Reason string
}

const replacementColumns = `replacement_id, session_scope, requested_by, caller, reason, requested_at,
       coalesce((SELECT x.client_run_id FROM executor.runs x WHERE x.run_id = applied_run_id), applied_run_id, ''), applied_at`

func scanReplacement(row pgx.Row) (*executorv1.SessionReplacement, error) {
	var (
		r       executorv1.SessionReplacement
		at      time.Time
		applied *time.Time
	)
	if err := row.Scan(&r.ReplacementId, &r.SessionScope, &r.RequestedBy, &r.Caller, &r.Reason, &at,
		&r.AppliedRunId, &applied); err != nil {
		return nil, err
	}
	r.RequestedAt = timestamppb.New(at)
	if applied != nil {
		r.AppliedAt = timestamppb.New(*applied)
	}
	return &r, nil
}

// RecordReplacement records req durably and returns it; while a decision
// for the scope is pending (no run applied it yet) it is returned as it is.
// A scope with a run in flight refuses (native_session_supervisor_busy):
// its runner serves that run now.
func (s *Store) RecordReplacement(ctx context.Context, req ReplacementRequest) (*executorv1.SessionReplacement, error) {
	var out *executorv1.SessionReplacement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The scope lock orders this against a run of the scope starting.
		if _, err := tx.Exec(ctx, `SELECT executor.lock_scope($1)`, req.Scope); err != nil {
			return err
		}
		var busy bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM executor.coordinators
 WHERE session_scope = $1 AND phase = 'observed')`, req.Scope).Scan(&busy); err != nil {
			return err
		}
		if busy {
			return failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
				"session %q has a run in flight; replace it after the run ends", req.SessionID)
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO executor.session_replacements (replacement_id, session_scope, company_id, normalized_session_id,
       requested_by, caller, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (session_scope) WHERE applied_run_id IS NULL DO NOTHING`,
			newID("repl-"), req.Scope, req.CompanyID, req.SessionID, req.RequestedBy, req.Caller, req.Reason); err != nil {
			return err
		}
		var err error
		out, err = scanReplacement(tx.QueryRow(ctx, `SELECT `+replacementColumns+` FROM executor.session_replacements
 WHERE session_scope = $1 AND applied_run_id IS NULL`, req.Scope))
		return err
	})
	return out, err
}

// Replacements lists the scope's ReplaceSession decisions, newest first.
func (s *Store) Replacements(ctx context.Context, scope string) ([]*executorv1.SessionReplacement, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+replacementColumns+` FROM executor.session_replacements
 WHERE session_scope = $1 ORDER BY requested_at DESC LIMIT 100`, scope)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*executorv1.SessionReplacement
	for rows.Next() {
		r, err := scanReplacement(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// replacementForRunSQL reads the decision run $2 of scope $1 applies: the
// pending one, or the one it already applied (a later attempt of the run).
const replacementForRunSQL = `SELECT ` + replacementColumns + ` FROM executor.session_replacements
 WHERE session_scope = $1 AND (applied_run_id IS NULL OR applied_run_id = $2)
 ORDER BY applied_run_id NULLS FIRST LIMIT 1`

// continuityRequiredSQL: a runner served an earlier warm run of run $1's
// scope, so the scope has durable state that a fresh provider session
// would silently abandon (SPEC F3).
const continuityRequiredSQL = `SELECT EXISTS (SELECT 1 FROM executor.runs r
  JOIN executor.runs p ON p.session_scope = r.session_scope AND p.submit_seq < r.submit_seq
 WHERE r.run_id = $1 AND p.runner_instance_id IS NOT NULL AND p.lifecycle = 'LIFECYCLE_MODE_WARM')`

func scanOptionalReplacement(row pgx.Row) (*executorv1.SessionReplacement, error) {
	r, err := scanReplacement(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return r, err
}

// applyReplacement marks decision id applied by run runID; false when it
// was applied already (by this run's earlier attempt).
func applyReplacement(ctx context.Context, tx pgx.Tx, id, runID string) (bool, error) {
	tag, err := tx.Exec(ctx, applyReplacementSQL, id, runID)
	return tag.RowsAffected() == 1, err
}

// applyReplacementSQL marks decision $1 applied by run $2 (one row: it was
// not applied before).
const applyReplacementSQL = `UPDATE executor.session_replacements SET applied_run_id = $2, applied_at = now()
 WHERE replacement_id = $1 AND applied_run_id IS NULL`

// RunServed reports whether a runner served run runID (its runner instance
// was recorded): an attempt of it attached, so its turn may have started.
func (s *Store) RunServed(ctx context.Context, runID string) (bool, error) {
	var served bool
	err := s.pool.QueryRow(ctx, `SELECT runner_instance_id IS NOT NULL FROM executor.runs WHERE run_id = $1`, runID).Scan(&served)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrRunNotFound(runID)
	}
	return served, err
}

// RenewServedTurnGeneration bumps the turn generation of the run fenced by
// f when a runner served it (an earlier attempt attached): its next turn
// command ids are new. It returns the generation and whether it was
// renewed; a lost lease renews nothing.
func (s *Store) RenewServedTurnGeneration(ctx context.Context, f Fence) (gen uint64, renewed bool, err error) {
	var g int64
	err = s.pool.QueryRow(ctx, `
UPDATE executor.coordinators c SET turn_generation = c.turn_generation + 1
  FROM executor.runs r
 WHERE c.run_id = $1 AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'
   AND r.run_id = c.run_id AND r.runner_instance_id IS NOT NULL
RETURNING c.turn_generation`, f.RunID, f.Owner, int64(f.Attempt)).Scan(&g)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return uint64(g), err == nil, err
}

// CanFailOver reports whether session scope scope can follow run runID off
// its lost gateway (SPEC F3): it has a verified checkpoint to restore (the
// current one, or the one a run in flight there started from), a pending
// ReplaceSession decision (a fresh provider session), or no state worth
// keeping (no runner served an earlier warm run of it). Otherwise its
// thread is only on the lost gateway's disk: moving the scope would fail
// it closed elsewhere and leave the old root to be resumed, stale, should
// the scope ever be placed back there.
func (s *Store) CanFailOver(ctx context.Context, scope, runID string) (bool, error) {
	b := &pgx.Batch{}
	b.Queue(restorableCheckpointSQL, scope)
	b.Queue(replacementForRunSQL, scope, runID)
	b.Queue(continuityRequiredSQL, runID)
	res := s.pool.SendBatch(ctx, b)
	defer func() { _ = res.Close() }() // on the early returns; the others close it themselves
	_, _, err := scanCheckpoint(res.QueryRow())
	switch {
	case err == nil:
		return true, res.Close()
	case !errors.Is(err, pgx.ErrNoRows):
		return false, err
	}
	rp, err := scanOptionalReplacement(res.QueryRow())
	if err != nil {
		return false, err
	}
	var required bool
	if err := res.QueryRow().Scan(&required); err != nil {
		return false, err
	}
	return rp != nil || !required, res.Close()
}
