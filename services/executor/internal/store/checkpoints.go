package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Suspension states of a scope's idle period (executor.session_suspensions).
const (
	SuspensionClaimed   = "claimed"
	SuspensionSuspended = "suspended"
	SuspensionFailed    = "failed"
	// SuspensionSkipped: nothing to suspend (no runner state).
	SuspensionSkipped = "skipped"
	// SuspensionCheckpointed: the idle period has an online checkpoint
	// (SPEC P6): verified and recorded, the runner and its provider still
	// running. Its suspension at the idle timeout is still to come.
	SuspensionCheckpointed = "checkpointed"
)

// Suspension retry policy: a failed suspension of an idle period is tried
// again after SuspensionRetryDelay, at most MaxSuspensionAttempts times.
const (
	MaxSuspensionAttempts = 3
	SuspensionRetryDelay  = 30 * time.Second
	// idleHorizon bounds how far back the idle sweep looks: idle timeouts
	// are at most a day (validated), so a run that ended longer ago than
	// this and was never suspended (no replica ran meanwhile) is left as it
	// is; its runner, if it still runs, stops on its own idle timeout.
	idleHorizon = 48 * time.Hour
)

// IdleSession is a scope whose newest run is a warm run that has ended.
type IdleSession struct {
	Scope     string
	LastRunID string
	Input     *prpv1.ExecutionInput
	// IdleFor is how long ago the run ended (database clock).
	IdleFor time.Duration
	// Checkpointed: the idle period has an online checkpoint; only its
	// suspension at the idle timeout is left.
	Checkpointed bool
}

// IdleWarmSessions lists up to limit scopes whose newest run is a warm run
// that ended (in the last two days) and whose idle period is not suspended,
// being suspended, or given up on; the oldest first (an idle period with an
// online checkpoint is listed, Checkpointed). The caller applies each run's
// idle timeout.
func (s *Store) IdleWarmSessions(ctx context.Context, limit int) ([]IdleSession, error) {
	rows, err := s.pool.Query(ctx, `
SELECT r.run_id, r.session_scope, r.input, EXTRACT(EPOCH FROM (now() - r.ended_at))::float8,
       EXISTS (SELECT 1 FROM executor.session_suspensions s
                WHERE s.session_scope = r.session_scope AND s.last_run_id = r.run_id AND s.state = 'checkpointed')
  FROM executor.runs r
  JOIN executor.coordinators c ON c.run_id = r.run_id
 WHERE r.lifecycle = 'LIFECYCLE_MODE_WARM' AND r.ended_at > now() - make_interval(secs => $1)
   AND c.phase IN ('completed', 'terminal_failure')
   AND NOT EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = r.session_scope AND n.submit_seq > r.submit_seq)
   AND NOT EXISTS (SELECT 1 FROM executor.session_suspensions s
                    WHERE s.session_scope = r.session_scope AND s.last_run_id = r.run_id
                      AND (s.state IN ('suspended', 'skipped')
                           OR (s.state = 'claimed' AND s.claimed_until > now())
                           OR (s.state = 'failed' AND (s.attempts >= $3 OR s.updated_at > now() - make_interval(secs => $4)))))
 ORDER BY r.ended_at LIMIT $2`, idleHorizon.Seconds(), limit, MaxSuspensionAttempts, SuspensionRetryDelay.Seconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []IdleSession
	for rows.Next() {
		var (
			is   IdleSession
			raw  []byte
			secs float64
		)
		if err := rows.Scan(&is.LastRunID, &is.Scope, &raw, &secs, &is.Checkpointed); err != nil {
			return nil, err
		}
		is.Input = &prpv1.ExecutionInput{}
		if err := proto.Unmarshal(raw, is.Input); err != nil {
			return nil, err
		}
		is.IdleFor = time.Duration(secs * float64(time.Second))
		out = append(out, is)
	}
	return out, rows.Err()
}

// ClaimSuspension claims the suspension of scope's idle period that began
// when lastRunID ended, for owner until ttl from now (database clock). It
// claims only while lastRunID is the scope's newest run and has ended, and
// never while another claim is live; otherwise an idle period already
// suspended, skipped or failed too often is not claimed again unless force
// (an explicit CloseSession). ok is false when nothing was claimed.
func (s *Store) ClaimSuspension(ctx context.Context, scope, lastRunID, owner string, ttl time.Duration, force bool) (ok bool, err error) {
	return s.ClaimIdlePeriod(ctx, scope, lastRunID, owner, ttl, force, false)
}

// ClaimIdlePeriod is ClaimSuspension; afterCheckpoint also claims an idle
// period that has an online checkpoint (for its suspension at the idle
// timeout, attempts counted afresh).
func (s *Store) ClaimIdlePeriod(ctx context.Context, scope, lastRunID, owner string, ttl time.Duration, force, afterCheckpoint bool) (ok bool, err error) {
	var attempts int
	err = s.pool.QueryRow(ctx, `
INSERT INTO executor.session_suspensions AS s (session_scope, last_run_id, state, owner, claimed_until)
SELECT $1, $2, 'claimed', $3, now() + make_interval(secs => $4)
 WHERE EXISTS (SELECT 1 FROM executor.runs l JOIN executor.coordinators c ON c.run_id = l.run_id
                WHERE l.run_id = $2 AND l.session_scope = $1 AND c.phase IN ('completed', 'terminal_failure')
                  AND NOT EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = $1 AND n.submit_seq > l.submit_seq))
ON CONFLICT (session_scope) DO UPDATE
   SET last_run_id = EXCLUDED.last_run_id, state = 'claimed', owner = EXCLUDED.owner,
       claimed_until = EXCLUDED.claimed_until, last_error = NULL, checkpoint_id = NULL, updated_at = now(),
       attempts = CASE WHEN s.last_run_id = EXCLUDED.last_run_id AND s.state <> 'checkpointed' THEN s.attempts + 1 ELSE 1 END
 WHERE CASE
         WHEN s.state = 'claimed' THEN s.claimed_until <= now()
         WHEN s.last_run_id <> EXCLUDED.last_run_id THEN true
         WHEN $5 THEN true
         WHEN s.state = 'checkpointed' THEN $8
         WHEN s.state = 'failed' THEN s.attempts < $6 AND s.updated_at <= now() - make_interval(secs => $7)
         ELSE false
       END
RETURNING s.attempts`, scope, lastRunID, owner, ttl.Seconds(), force, MaxSuspensionAttempts, SuspensionRetryDelay.Seconds(), afterCheckpoint).Scan(&attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// FinishSuspension records the outcome of owner's claim (state suspended,
// failed or skipped); a claim taken over meanwhile is left alone.
func (s *Store) FinishSuspension(ctx context.Context, scope, lastRunID, owner, state, lastError, checkpointID string) error {
	_, err := s.pool.Exec(ctx, `
UPDATE executor.session_suspensions
   SET state = $4, last_error = nullif($5, ''), checkpoint_id = nullif($6, ''), updated_at = now()
 WHERE session_scope = $1 AND last_run_id = $2 AND owner = $3 AND state = 'claimed'`,
		scope, lastRunID, owner, state, lastError, checkpointID)
	return err
}

// RecordSessionClosed records that the warm session of scope was closed
// (CloseSession without suspension: its runner and provider stopped) in
// the idle period that began when lastRunID ended, while lastRunID is
// still the scope's newest run and has ended: the session no longer
// counts against its company's max_warm_sessions (SPEC Q1) until a next
// run of the scope opens it again.
func (s *Store) RecordSessionClosed(ctx context.Context, scope, lastRunID string) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO executor.session_closes AS k (session_scope, last_run_id)
SELECT $1, $2
 WHERE EXISTS (SELECT 1 FROM executor.runs l
                WHERE l.run_id = $2 AND l.session_scope = $1 AND l.ended_at IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = $1 AND n.submit_seq > l.submit_seq))
ON CONFLICT (session_scope) DO UPDATE SET last_run_id = EXCLUDED.last_run_id, closed_at = now()`, scope, lastRunID)
	return err
}

// CheckpointRecord is a verified suspension to record.
type CheckpointRecord struct {
	Scope, CompanyID, SessionID, LastRunID string
	// GatewayScope is the scope the gateway checkpointed (the stamp's).
	GatewayScope     string
	Stamp            *backupv1.Stamp
	CheckpointID     string
	ManifestDigest   string
	LeaseID          string
	RunnerInstanceID string
	ProviderThreadID string
	Reason           string
}

// RecordCheckpoint stores a verified suspension's stamped checkpoint. When a
// run of the scope newer than LastRunID has already started, the runner has
// moved on from the checkpoint: it is recorded as superseded at once.
func (s *Store) RecordCheckpoint(ctx context.Context, c CheckpointRecord) (*executorv1.SessionCheckpoint, error) {
	raw, err := marshalDet.Marshal(c.Stamp)
	if err != nil {
		return nil, err
	}
	row := s.pool.QueryRow(ctx, `
INSERT INTO executor.session_checkpoints (checkpoint_id, session_scope, company_id, normalized_session_id, last_run_id,
       gateway_scope, manifest_digest, stamp, lease_id, runner_instance_id, provider_thread_id, reason, superseded_at)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
       CASE WHEN EXISTS (SELECT 1 FROM executor.runs n JOIN executor.coordinators c ON c.run_id = n.run_id
                          WHERE n.session_scope = $2 AND c.started_at IS NOT NULL
                            AND n.submit_seq > (SELECT submit_seq FROM executor.runs WHERE run_id = $5))
            THEN now() END
ON CONFLICT (checkpoint_id) DO UPDATE SET reason = executor.session_checkpoints.reason
RETURNING `+checkpointColumns,
		c.CheckpointID, c.Scope, c.CompanyID, c.SessionID, c.LastRunID, c.GatewayScope, c.ManifestDigest, raw,
		c.LeaseID, c.RunnerInstanceID, c.ProviderThreadID, c.Reason)
	cp, _, err := scanCheckpoint(row)
	return cp, err
}

const checkpointColumns = `session_scope, checkpoint_id, manifest_digest, runner_instance_id, lease_id, stamp, reason, created_at, superseded_at IS NOT NULL`

func scanCheckpoint(row pgx.Row) (*executorv1.SessionCheckpoint, bool, error) {
	var (
		cp         executorv1.SessionCheckpoint
		raw        []byte
		at         time.Time
		superseded bool
	)
	if err := row.Scan(&cp.SessionScope, &cp.CheckpointId, &cp.ManifestDigest, &cp.RunnerInstanceId, &cp.LeaseId,
		&raw, &cp.Reason, &at, &superseded); err != nil {
		return nil, false, err
	}
	cp.Stamp = &backupv1.Stamp{}
	if err := proto.Unmarshal(raw, cp.Stamp); err != nil {
		return nil, false, err
	}
	cp.CreatedAt = timestamppb.New(at)
	return &cp, superseded, nil
}

// CurrentCheckpoint returns the scope's newest checkpoint that no later run
// has superseded, or nil.
func (s *Store) CurrentCheckpoint(ctx context.Context, scope string) (*executorv1.SessionCheckpoint, error) {
	cp, _, err := scanCheckpoint(s.pool.QueryRow(ctx, `SELECT `+checkpointColumns+` FROM executor.session_checkpoints
 WHERE session_scope = $1 AND superseded_at IS NULL ORDER BY created_at DESC LIMIT 1`, scope))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return cp, err
}

// LatestCheckpoint returns the scope's newest checkpoint (superseded or
// not), or nil.
func (s *Store) LatestCheckpoint(ctx context.Context, scope string) (*executorv1.SessionCheckpoint, error) {
	cp, _, err := scanCheckpoint(s.pool.QueryRow(ctx, `SELECT `+checkpointColumns+` FROM executor.session_checkpoints
 WHERE session_scope = $1 ORDER BY created_at DESC LIMIT 1`, scope))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return cp, err
}

// SupersedeCheckpoints marks the scope's checkpoints superseded: a run has
// attached a runner, whose state now moves on from them.
func (s *Store) SupersedeCheckpoints(ctx context.Context, scope string) error {
	_, err := s.pool.Exec(ctx, `UPDATE executor.session_checkpoints SET superseded_at = now()
 WHERE session_scope = $1 AND superseded_at IS NULL`, scope)
	return err
}

// RestoreOrder is what an Open that restores a checkpoint of scope tells
// the gateway to order a local root against it (SPEC F3, F9), read in one
// round trip: MinSourceSeq, the highest source seq stored from the
// checkpoint's runner inst in the runs of scope (0 when none: a runner
// restored from a checkpoint older than its last events continues above
// it), and ServedRunnerIDs, the runner instances that ever attached for
// scope (scope_runners, attempts cut off included), newest first (at most
// MaxServedRunners): a root of one of them that is not inst's was left
// behind by a move.
type RestoreOrder struct {
	MinSourceSeq    uint64
	ServedRunnerIDs []string
}

// MaxServedRunners bounds RestoreOrder.ServedRunnerIDs (the Open's
// RestoreSpec.served_runner_ids allows as many).
const MaxServedRunners = 64

// RestoreOrderOf reads scope's RestoreOrder for checkpoint runner inst.
func (s *Store) RestoreOrderOf(ctx context.Context, scope, inst string) (RestoreOrder, error) {
	var o RestoreOrder
	b := &pgx.Batch{}
	b.Queue(`SELECT coalesce(max(e.source_seq), 0) FROM executor.events e
  JOIN executor.runs r ON r.run_id = e.run_id
 WHERE r.session_scope = $1 AND e.source_instance_id = $2`, scope, inst).QueryRow(func(row pgx.Row) error {
		var n int64
		err := row.Scan(&n)
		o.MinSourceSeq = uint64(n)
		return err
	})
	b.Queue(`SELECT runner_instance_id FROM executor.scope_runners
 WHERE session_scope = $1 ORDER BY last_submit_seq DESC LIMIT $2`, scope, MaxServedRunners).Query(func(rows pgx.Rows) error {
		var err error
		o.ServedRunnerIDs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return o, s.pool.SendBatch(ctx, b).Close()
}
