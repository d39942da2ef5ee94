package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// Retention (SPEC L1). The executor keeps a company's ended runs — with
// their events, activities, interactions and usage — for its
// RunRetention, and the newest CheckpointsKept checkpoints of each of its
// sessions. Two things are kept whatever the policy, while the company
// lives:
//   - the newest run of every session scope: the next run of the session
//     finds its prior run (SPEC E13) and files replayed runner events
//     against the scope's stored ones (dedupe, RestoreOrderOf);
//   - every checkpoint no later run has superseded (the one the session's
//     next run restores from), and the newest of each scope, and the runs
//     they name (a checkpoint names the run whose idle period it ended).
// DeleteRun and PurgeCompany remove those too.

// DefaultCompany is the retention_settings row of every company without
// its own.
const DefaultCompany = "*"

// MinRunRetention is the shortest run retention: a runner replays no
// event older than that (its journal is far shorter), so an event of a
// purged run never comes back as a new one.
const MinRunRetention = time.Hour

// RetentionPolicy is one row of executor.retention_settings.
type RetentionPolicy struct {
	// Company is a company id, or DefaultCompany.
	Company string
	// RunRetention is how long an ended run is kept; 0: for good.
	RunRetention time.Duration
	// CheckpointsKept is how many checkpoints of each session are kept at
	// least; 0: all.
	CheckpointsKept int
	UpdatedAt       time.Time
	UpdatedBy       string
}

// Check refuses a policy the table would refuse, with a readable message.
func (p RetentionPolicy) Check() error {
	if p.Company == "" {
		return fmt.Errorf("a retention policy names a company (or %q for the default)", DefaultCompany)
	}
	if p.RunRetention != 0 && p.RunRetention < MinRunRetention {
		return fmt.Errorf("run retention %s is shorter than %s", p.RunRetention, MinRunRetention)
	}
	if p.CheckpointsKept < 0 {
		return fmt.Errorf("checkpoints kept %d is negative", p.CheckpointsKept)
	}
	return nil
}

// SetRetention stores a company's policy (or the default) and records the
// change in the operator audit.
func (s *Store) SetRetention(ctx context.Context, p RetentionPolicy, by string) error {
	if err := p.Check(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
INSERT INTO executor.retention_settings (company_id, runs_retention_secs, checkpoints_kept, updated_by)
VALUES ($1, nullif($2, 0), nullif($3, 0), $4)
ON CONFLICT (company_id) DO UPDATE SET runs_retention_secs = EXCLUDED.runs_retention_secs,
       checkpoints_kept = EXCLUDED.checkpoints_kept, updated_by = EXCLUDED.updated_by, updated_at = now()`,
			p.Company, int64(p.RunRetention/time.Second), p.CheckpointsKept, by); err != nil {
			return err
		}
		return recordOperatorAction(ctx, tx, OperatorAction{Action: "retention.set", Principal: by, Company: p.Company,
			Details: map[string]any{"runs_retention_secs": int64(p.RunRetention / time.Second), "checkpoints_kept": p.CheckpointsKept}})
	})
}

// ResetRetention removes a company's own policy (the default applies
// again); the default row is set, never removed.
func (s *Store) ResetRetention(ctx context.Context, company, by string) error {
	if company == DefaultCompany {
		return fmt.Errorf("the default policy is changed, not removed")
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM executor.retention_settings WHERE company_id = $1`, company); err != nil {
			return err
		}
		return recordOperatorAction(ctx, tx, OperatorAction{Action: "retention.reset", Principal: by, Company: company})
	})
}

// RetentionPolicies lists the stored policies, the default first.
func (s *Store) RetentionPolicies(ctx context.Context) ([]RetentionPolicy, error) {
	rows, err := s.pool.Query(ctx, `SELECT company_id, coalesce(runs_retention_secs, 0), coalesce(checkpoints_kept, 0), updated_at, updated_by
  FROM executor.retention_settings ORDER BY company_id <> '*', company_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RetentionPolicy, error) {
		var (
			p    RetentionPolicy
			secs int64
		)
		err := r.Scan(&p.Company, &secs, &p.CheckpointsKept, &p.UpdatedAt, &p.UpdatedBy)
		p.RunRetention = time.Duration(secs) * time.Second
		return p, err
	})
}

// OperatorAction is one record of executor.operator_actions.
type OperatorAction struct {
	ID        int64
	Action    string
	Principal string
	Company   string
	RunID     string
	Reason    string
	Details   map[string]any
	At        time.Time
}

func recordOperatorAction(ctx context.Context, tx pgx.Tx, a OperatorAction) error {
	details, err := json.Marshal(a.Details)
	if err != nil {
		return err
	}
	if a.Details == nil {
		details = []byte("{}")
	}
	_, err = tx.Exec(ctx, `INSERT INTO executor.operator_actions (action, principal, company_id, run_id, reason, details)
VALUES ($1, $2, $3, nullif($4, ''), $5, $6)`, a.Action, a.Principal, a.Company, a.RunID, a.Reason, details)
	return err
}

// RecordOperatorAction records an operator's action in its own
// transaction.
func (s *Store) RecordOperatorAction(ctx context.Context, a OperatorAction) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return recordOperatorAction(ctx, tx, a) })
}

// OperatorActions lists the operator audit of a company (all companies
// when company is empty), oldest first.
func (s *Store) OperatorActions(ctx context.Context, company string) ([]OperatorAction, error) {
	rows, err := s.pool.Query(ctx, `SELECT action_id, action, principal, company_id, coalesce(run_id, ''), reason, details, created_at
  FROM executor.operator_actions WHERE $1 = '' OR company_id = $1 ORDER BY action_id`, company)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OperatorAction, error) {
		var (
			a   OperatorAction
			raw []byte
		)
		if err := r.Scan(&a.ID, &a.Action, &a.Principal, &a.Company, &a.RunID, &a.Reason, &raw, &a.At); err != nil {
			return a, err
		}
		return a, json.Unmarshal(raw, &a.Details)
	})
}

// TakeJobLease takes or renews the lease of a fleet-wide job for owner
// until ttl from now (database clock): true while owner holds it.
func (s *Store) TakeJobLease(ctx context.Context, job, owner string, ttl time.Duration) (bool, error) {
	var got string
	err := s.pool.QueryRow(ctx, `
INSERT INTO executor.job_leases AS l (job, owner, expires_at) VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (job) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
 WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now()
RETURNING owner`, job, owner, ttl.Seconds()).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// ReleaseJobLease gives a job's lease back (another replica takes it at
// once instead of at its expiry).
func (s *Store) ReleaseJobLease(ctx context.Context, job, owner string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM executor.job_leases WHERE job = $1 AND owner = $2`, job, owner)
	return err
}

// ExpiredRuns lists ended runs past their company's retention that the
// purge may delete, oldest first: at most limit runs holding at most
// maxEvents events together (a run with more alone). Kept whatever their
// age: a scope's newest run and the runs a stored checkpoint names. On a
// partitioned events table (SPEC L2) the runs of a weekly partition are
// left to DropExpiredEventPartitions until the partition is a day past
// the longest run retention; after that the partition is pinned by a run
// the purge keeps and its expired runs go row by row. The legacy partition
// is always purged row by row.
func (s *Store) ExpiredRuns(ctx context.Context, limit int, maxEvents int64) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
WITH horizon AS (SELECT min(runs_retention_secs) AS secs FROM executor.retention_settings),
rowwise AS (
  SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM executor.event_partitions) THEN 'infinity'::timestamptz
         ELSE coalesce((SELECT max(p.to_at) FROM executor.event_partitions p
                         WHERE p.from_at IS NULL
                            OR p.to_at <= now() - interval '1 day'
                               - make_interval(secs => coalesce((SELECT max(runs_retention_secs) FROM executor.retention_settings), 0))),
                       '-infinity') END AS before),
candidates AS (
  SELECT r.run_id, r.event_count, r.ended_at
    FROM executor.runs r
    JOIN executor.coordinators co ON co.run_id = r.run_id
    CROSS JOIN horizon h
    JOIN executor.retention_settings d ON d.company_id = '*'
    LEFT JOIN executor.retention_settings own ON own.company_id = r.company_id
   WHERE r.ended_at < now() - make_interval(secs => h.secs)
     AND r.created_at < (SELECT before FROM rowwise)
     AND r.ended_at < now() - make_interval(secs => CASE WHEN own.company_id IS NULL THEN d.runs_retention_secs ELSE own.runs_retention_secs END)
     AND co.phase IN ('completed', 'terminal_failure')
     AND EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = r.session_scope AND n.submit_seq > r.submit_seq)
     AND NOT EXISTS (SELECT 1 FROM executor.session_checkpoints k WHERE k.last_run_id = r.run_id)
   ORDER BY r.ended_at
   LIMIT $1),
sized AS (
  SELECT run_id, sum(event_count) OVER (ORDER BY ended_at, run_id) AS upto, row_number() OVER (ORDER BY ended_at, run_id) AS n
    FROM candidates)
SELECT run_id FROM sized WHERE upto <= $2 OR n = 1 ORDER BY n`, limit, maxEvents)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// PrunableCheckpoint is a checkpoint past its company's CheckpointsKept.
type PrunableCheckpoint struct {
	ID, Scope, Company string
}

// PrunableCheckpoints lists up to limit checkpoints past their company's
// CheckpointsKept in their session scope (newest first), never one no
// later run superseded: that is the one the session restores from.
func (s *Store) PrunableCheckpoints(ctx context.Context, limit int) ([]PrunableCheckpoint, error) {
	rows, err := s.pool.Query(ctx, `
SELECT checkpoint_id, session_scope, company_id FROM (
  SELECT k.checkpoint_id, k.session_scope, k.company_id, k.superseded_at,
         row_number() OVER (PARTITION BY k.session_scope ORDER BY k.created_at DESC, k.checkpoint_id DESC) AS rn,
         CASE WHEN c.company_id IS NOT NULL THEN c.checkpoints_kept ELSE d.checkpoints_kept END AS kept
    FROM executor.session_checkpoints k
    LEFT JOIN executor.retention_settings c ON c.company_id = k.company_id
    LEFT JOIN executor.retention_settings d ON d.company_id = '*') x
 WHERE kept IS NOT NULL AND rn > kept AND superseded_at IS NOT NULL
 ORDER BY session_scope, rn
 LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PrunableCheckpoint, error) {
		var p PrunableCheckpoint
		return p, r.Scan(&p.ID, &p.Scope, &p.Company)
	})
}

// ForgetCheckpoints deletes the executor's records of checkpoints whose
// archives the backup verifier deleted.
func (s *Store) ForgetCheckpoints(ctx context.Context, ids []string) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM executor.session_checkpoints WHERE checkpoint_id = ANY($1)`, ids)
	return tag.RowsAffected(), err
}

// PurgeCounts counts what a deletion removed.
type PurgeCounts struct {
	Runs, Events, Activities, Interactions, Checkpoints, Secrets int64
	// Partitions counts the events partitions dropped whole (their events
	// are not in Events).
	Partitions int64
}

// Add adds o to c.
func (c *PurgeCounts) Add(o PurgeCounts) {
	c.Runs += o.Runs
	c.Events += o.Events
	c.Activities += o.Activities
	c.Interactions += o.Interactions
	c.Checkpoints += o.Checkpoints
	c.Secrets += o.Secrets
	c.Partitions += o.Partitions
}

// Proto is the API's form.
func (c PurgeCounts) Proto() *executorv1.PurgeCounts {
	return &executorv1.PurgeCounts{Runs: c.Runs, Events: c.Events, Activities: c.Activities,
		Interactions: c.Interactions, Checkpoints: c.Checkpoints, Secrets: c.Secrets}
}

func (c PurgeCounts) details() map[string]any {
	return map[string]any{"runs": c.Runs, "events": c.Events, "activities": c.Activities,
		"interactions": c.Interactions, "checkpoints": c.Checkpoints, "secrets": c.Secrets}
}

// PurgeRuns deletes ended runs (ids are run keys) with what hangs off
// them, in one transaction: a run that is not ended (completed or
// terminal_failure) is skipped, as is one a checkpoint still names.
func (s *Store) PurgeRuns(ctx context.Context, ids []string) (PurgeCounts, error) {
	var c PurgeCounts
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		c, err = purgeRuns(ctx, tx, ids, false)
		return err
	})
	return c, err
}

// purgeRuns deletes runs ids that ended; withCheckpoints also deletes the
// checkpoint records naming them (their archives are the caller's).
func purgeRuns(ctx context.Context, tx pgx.Tx, ids []string, withCheckpoints bool) (PurgeCounts, error) {
	var c PurgeCounts
	// Lock the runs' coordinators: a run ended does not start again, but
	// the lock orders this delete after any statement still writing it.
	rows, err := tx.Query(ctx, `
SELECT co.run_id FROM executor.coordinators co
 WHERE co.run_id = ANY($1) AND co.phase IN ('completed', 'terminal_failure')
   AND ($2 OR NOT EXISTS (SELECT 1 FROM executor.session_checkpoints k WHERE k.last_run_id = co.run_id))
 ORDER BY co.run_id FOR UPDATE`, ids, withCheckpoints)
	if err != nil {
		return c, err
	}
	ended, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ended) == 0 {
		return c, err
	}
	b := &pgx.Batch{}
	count := func(n *int64) func(pgx.Row) error {
		return func(row pgx.Row) error { return row.Scan(n) }
	}
	b.Queue(`WITH d AS (DELETE FROM executor.events WHERE run_id = ANY($1) RETURNING 1) SELECT count(*) FROM d`, ended).QueryRow(count(&c.Events))
	b.Queue(`WITH d AS (DELETE FROM executor.activities WHERE run_id = ANY($1) RETURNING 1) SELECT count(*) FROM d`, ended).QueryRow(count(&c.Activities))
	b.Queue(`WITH d AS (DELETE FROM executor.interactions WHERE source_run_id = ANY($1) RETURNING 1) SELECT count(*) FROM d`, ended).QueryRow(count(&c.Interactions))
	b.Queue(`DELETE FROM executor.session_replacements WHERE applied_run_id = ANY($1)`, ended)
	if withCheckpoints {
		b.Queue(`WITH d AS (DELETE FROM executor.session_checkpoints WHERE last_run_id = ANY($1) RETURNING 1) SELECT count(*) FROM d`, ended).QueryRow(count(&c.Checkpoints))
	}
	b.Queue(`DELETE FROM executor.coordinators WHERE run_id = ANY($1)`, ended)
	b.Queue(`WITH d AS (DELETE FROM executor.runs WHERE run_id = ANY($1) RETURNING 1) SELECT count(*) FROM d`, ended).QueryRow(count(&c.Runs))
	return c, tx.SendBatch(ctx, b).Close()
}

// ErrRunNotEnded refuses to delete a run that is queued or running.
func ErrRunNotEnded(id, phase string) error {
	return failure.New(codes.FailedPrecondition, failure.RunNotEnded, "run %q has not ended (%s): cancel it and wait for its end first", id, phase)
}

// DeleteRunPlan is what DeleteRun has to do besides the rows: the
// superseded checkpoints naming the run, whose archives go first.
type DeleteRunPlan struct {
	Company     string
	Checkpoints []string
}

// PlanDeleteRun checks that run key may be deleted and lists the
// checkpoints whose archives must go with it.
func (s *Store) PlanDeleteRun(ctx context.Context, key, clientID string) (DeleteRunPlan, error) {
	var (
		p       DeleteRunPlan
		phase   string
		current bool
	)
	err := s.pool.QueryRow(ctx, `
SELECT r.company_id, coalesce(co.phase, ''),
       EXISTS (SELECT 1 FROM executor.session_checkpoints k WHERE k.last_run_id = r.run_id AND k.superseded_at IS NULL),
       coalesce((SELECT array_agg(k.checkpoint_id ORDER BY k.checkpoint_id) FROM executor.session_checkpoints k WHERE k.last_run_id = r.run_id), '{}')
  FROM executor.runs r LEFT JOIN executor.coordinators co ON co.run_id = r.run_id
 WHERE r.run_id = $1`, key).Scan(&p.Company, &phase, &current, &p.Checkpoints)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, ErrRunNotFound(clientID)
	}
	if err != nil {
		return p, err
	}
	if phase != "completed" && phase != "terminal_failure" {
		return p, ErrRunNotEnded(clientID, phase)
	}
	if current {
		return p, failure.New(codes.FailedPrecondition, failure.RunHoldsCurrentCheckpoint,
			"run %q is the run its session's current checkpoint was taken after: the session's next run restores from it (PurgeCompany removes it)", clientID)
	}
	return p, nil
}

// DeleteRun deletes an ended run (key) with everything that hangs off it,
// and records who did it (SPEC L1). The caller deleted the archives of the
// checkpoints PlanDeleteRun listed.
func (s *Store) DeleteRun(ctx context.Context, key, clientID, by, reason string) (PurgeCounts, error) {
	var c PurgeCounts
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var company, phase string
		err := tx.QueryRow(ctx, `SELECT r.company_id, coalesce(co.phase, '') FROM executor.runs r
  LEFT JOIN executor.coordinators co ON co.run_id = r.run_id WHERE r.run_id = $1`, key).Scan(&company, &phase)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrRunNotFound(clientID)
		}
		if err != nil {
			return err
		}
		if c, err = purgeRuns(ctx, tx, []string{key}, true); err != nil {
			return err
		}
		if c.Runs == 0 {
			return ErrRunNotEnded(clientID, phase)
		}
		d := c.details()
		d["run_key"] = key
		return recordOperatorAction(ctx, tx, OperatorAction{Action: "run.delete", Principal: by, Company: company,
			RunID: clientID, Reason: reason, Details: d})
	})
	return c, err
}

// CompanyScopes lists every session scope a company has runs or
// checkpoints in.
func (s *Store) CompanyScopes(ctx context.Context, company string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT session_scope FROM executor.runs WHERE company_id = $1
UNION SELECT session_scope FROM executor.session_checkpoints WHERE company_id = $1 ORDER BY 1`, company)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// CheckCompanyIdle refuses a company purge while a run of the company is
// queued or running.
func (s *Store) CheckCompanyIdle(ctx context.Context, company string) error {
	var id, phase string
	err := s.pool.QueryRow(ctx, `SELECT r.client_run_id, co.phase FROM executor.runs r
  JOIN executor.coordinators co ON co.run_id = r.run_id
 WHERE r.company_id = $1 AND co.phase NOT IN ('completed', 'terminal_failure') LIMIT 1`, company).Scan(&id, &phase)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return ErrRunNotEnded(id, phase)
}

// PurgeCompanyBatch deletes up to limit of company's ended runs (every
// ended run, whatever the retention) with what hangs off them; it returns
// what it deleted (Runs 0: none left).
func (s *Store) PurgeCompanyBatch(ctx context.Context, company string, limit int) (PurgeCounts, error) {
	var c PurgeCounts
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT run_id FROM executor.runs WHERE company_id = $1 AND ended_at IS NOT NULL ORDER BY submit_seq LIMIT $2`, company, limit)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		c, err = purgeRuns(ctx, tx, ids, true)
		return err
	})
	return c, err
}

// FinishCompanyPurge deletes what is left of a company once its runs are
// gone — secrets, checkpoints, placements, suspensions, parked events,
// runner records and replacement decisions of its scopes, its retention
// policy — and records the purge with its totals. A run still there (one
// that started meanwhile) refuses it: run_not_ended.
func (s *Store) FinishCompanyPurge(ctx context.Context, company string, scopes []string, total PurgeCounts, by, reason string) (PurgeCounts, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT client_run_id FROM executor.runs WHERE company_id = $1 LIMIT 1`, company).Scan(&id)
		if err == nil {
			return ErrRunNotEnded(id, "submitted during the purge")
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`WITH d AS (DELETE FROM executor.secrets WHERE company_id = $1 RETURNING 1) SELECT count(*) FROM d`, company).QueryRow(func(row pgx.Row) error {
			return row.Scan(&total.Secrets)
		})
		b.Queue(`WITH d AS (DELETE FROM executor.session_checkpoints WHERE company_id = $1 RETURNING 1) SELECT count(*) FROM d`, company).QueryRow(func(row pgx.Row) error {
			var n int64
			err := row.Scan(&n)
			total.Checkpoints += n
			return err
		})
		b.Queue(`WITH d AS (DELETE FROM executor.interactions WHERE company_id = $1 RETURNING 1) SELECT count(*) FROM d`, company).QueryRow(func(row pgx.Row) error {
			var n int64
			err := row.Scan(&n)
			total.Interactions += n
			return err
		})
		b.Queue(`DELETE FROM executor.session_replacements WHERE company_id = $1`, company)
		for _, t := range []string{"placements", "session_suspensions", "session_closes", "parked_events", "scope_runners"} {
			b.Queue(`DELETE FROM executor.`+t+` WHERE session_scope = ANY($1)`, scopes)
		}
		b.Queue(`DELETE FROM executor.retention_settings WHERE company_id = $1`, company)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		d := total.details()
		d["session_scopes"] = len(scopes)
		return recordOperatorAction(ctx, tx, OperatorAction{Action: "company.purge", Principal: by, Company: company, Reason: reason, Details: d})
	})
	return total, err
}
