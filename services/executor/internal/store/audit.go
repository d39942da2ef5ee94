package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// AuditFilter selects the runs an audit reads: one run, the runs submitted
// since a time, or (zero) all runs.
type AuditFilter struct {
	RunID string
	Since time.Time
}

// AuditRows reads, in one consistent snapshot, what the exactly-once audit
// (package audit, SPEC X1) checks for the selected runs: each run's state,
// final attempt and event count; its event rows (seq, type, writer
// attempt, source and source seq; command.executed with the command it
// reports; a turn end event with its provider turn); and its
// cancellation audit entries; and the checkpoints of the selected runs'
// session scopes (the wedged-session rule).
func (s *Store) AuditRows(ctx context.Context, f AuditFilter) (AuditHistory, error) {
	var h AuditHistory
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		h = AuditHistory{}
		since := sinceArg(f.Since)
		var err error
		if h.Runs, err = auditRuns(ctx, tx, f.RunID, since); err != nil {
			return err
		}
		if h.Checkpoints, err = auditCheckpoints(ctx, tx, f.RunID, since); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT e.run_id, e.seq, e.event_type, e.writer_attempt, CASE WHEN e.event_type IN ($3, $4) OR e.event_type = ANY($5) THEN e.event END,
       e.source_instance_id, e.source_seq
  FROM executor.events e JOIN audit_runs a ON a.run_id = e.run_id`, f.RunID, since, prp.EventCommandExecuted, prp.EventSessionContinuityBreak,
			append([]string{prp.EventTurnStarted}, prp.TurnEndTypes()...))
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				e           AuditEvent
				seq, writer int64
				raw         []byte
				sourceSeq   int64
			)
			if err := rows.Scan(&e.RunID, &seq, &e.Type, &writer, &raw, &e.Source, &sourceSeq); err != nil {
				rows.Close()
				return err
			}
			e.Seq, e.Writer, e.SourceSeq = uint64(seq), uint64(writer), uint64(sourceSeq)
			if raw != nil {
				ev := &prpv1.Event{}
				if err := proto.Unmarshal(raw, ev); err != nil {
					rows.Close()
					return err
				}
				p := ev.GetPayload().GetFields()
				if prp.IsTurnEnd(e.Type) || e.Type == prp.EventTurnStarted {
					e.TurnID = ev.GetTurnId()
					if e.TurnID == "" {
						e.TurnID = p["providerTurnId"].GetStringValue()
					}
				}
				e.CommandID, e.CommandType = p["commandId"].GetStringValue(), p["commandType"].GetStringValue()
				if e.Type == prp.EventTurnStarted || e.Type == prp.EventCommandExecuted {
					e.EventRunID = ev.GetRunId()
				}
				if e.Type == prp.EventSessionContinuityBreak {
					e.Detail = fmt.Sprintf("session replaced by %s (%s) at %s: %s", p["requestedBy"].GetStringValue(),
						p["caller"].GetStringValue(), p["requestedAt"].GetStringValue(), p["why"].GetStringValue())
				}
			}
			h.Events = append(h.Events, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT t.run_id, t.action FROM executor.activities t JOIN audit_runs a ON a.run_id = t.run_id
 WHERE t.action IN ($3, $4)`, f.RunID, since, ActionCancellationIntent, ActionCancellationAck)
		if err != nil {
			return err
		}
		for rows.Next() {
			var a AuditActivity
			if err := rows.Scan(&a.RunID, &a.Action); err != nil {
				rows.Close()
				return err
			}
			h.Activities = append(h.Activities, a)
		}
		rows.Close()
		return rows.Err()
	})
	return h, err
}

// auditRuns reads the selected runs: state, final attempt, event count,
// session scope, submission order and failure.
func auditRuns(ctx context.Context, tx pgx.Tx, runID string, since *time.Time) ([]AuditRun, error) {
	rows, err := tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT run_id, state, attempt, event_count, session_scope, submit_seq, failure_code, failure_message, runner_instance_id
  FROM audit_runs ORDER BY run_id`, runID, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var runs []AuditRun
	for rows.Next() {
		var (
			r             AuditRun
			att, cnt, seq int64
			code, msg, rn *string
		)
		if err := rows.Scan(&r.ID, &r.State, &att, &cnt, &r.Scope, &seq, &code, &msg, &rn); err != nil {
			return nil, err
		}
		r.Attempt, r.EventCount, r.Seq = uint64(att), uint64(cnt), uint64(seq)
		if code != nil {
			r.FailureCode = *code
		}
		if msg != nil {
			r.FailureMessage = *msg
		}
		if rn != nil {
			r.RunnerInstanceID = *rn
		}
		runs = append(runs, r)
	}
	return runs, rows.Err()
}

// auditCheckpoints reads the checkpoints recorded for the selected runs'
// session scopes.
func auditCheckpoints(ctx context.Context, tx pgx.Tx, runID string, since *time.Time) ([]AuditCheckpoint, error) {
	rows, err := tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT k.checkpoint_id, k.session_scope, k.last_run_id FROM executor.session_checkpoints k
 WHERE k.session_scope IN (SELECT session_scope FROM audit_runs) ORDER BY k.created_at`, runID, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AuditCheckpoint
	for rows.Next() {
		var c AuditCheckpoint
		if err := rows.Scan(&c.ID, &c.Scope, &c.LastRunID); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// auditRunsSQL selects the audited runs ($1 run id or ”, $2 since or
// NULL) with their final attempt.
const auditRunsSQL = `audit_runs AS (
SELECT r.run_id, r.state, c.attempt, r.event_count, r.session_scope, r.submit_seq, r.failure_code, r.failure_message,
       r.runner_instance_id
  FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
 WHERE ($1 = '' OR r.run_id = $1) AND ($2::timestamptz IS NULL OR r.created_at >= $2))`

func sinceArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
