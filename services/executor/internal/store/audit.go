package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/audit"
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
// cancellation audit entries.
func (s *Store) AuditRows(ctx context.Context, f AuditFilter) ([]audit.Run, []audit.Event, []audit.Activity, error) {
	var (
		runs   []audit.Run
		events []audit.Event
		acts   []audit.Activity
	)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		runs, events, acts = nil, nil, nil
		since := sinceArg(f.Since)
		rows, err := tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT run_id, state, attempt, event_count FROM audit_runs ORDER BY run_id`, f.RunID, since)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				r        audit.Run
				att, cnt int64
			)
			if err := rows.Scan(&r.ID, &r.State, &att, &cnt); err != nil {
				rows.Close()
				return err
			}
			r.Attempt, r.EventCount = uint64(att), uint64(cnt)
			runs = append(runs, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT e.run_id, e.seq, e.event_type, e.writer_attempt, CASE WHEN e.event_type IN ($3, $4) OR e.event_type = ANY($5) THEN e.event END,
       e.source_instance_id, e.source_seq
  FROM executor.events e JOIN audit_runs a ON a.run_id = e.run_id`, f.RunID, since, audit.EventCommandExecuted, audit.EventContinuityBreak,
			audit.TurnEventTypes)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				e           audit.Event
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
				if audit.IsTurnEnd(e.Type) || e.Type == audit.EventTurnStarted {
					e.TurnID = ev.GetTurnId()
					if e.TurnID == "" {
						e.TurnID = p["providerTurnId"].GetStringValue()
					}
				}
				e.CommandID, e.CommandType = p["commandId"].GetStringValue(), p["commandType"].GetStringValue()
				if e.Type == audit.EventContinuityBreak {
					e.Detail = fmt.Sprintf("session replaced by %s (%s) at %s: %s", p["requestedBy"].GetStringValue(),
						p["caller"].GetStringValue(), p["requestedAt"].GetStringValue(), p["why"].GetStringValue())
				}
			}
			events = append(events, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `WITH `+auditRunsSQL+`
SELECT t.run_id, t.action FROM executor.activities t JOIN audit_runs a ON a.run_id = t.run_id
 WHERE t.action IN ($3, $4)`, f.RunID, since, audit.ActionCancellationIntent, audit.ActionCancellationAck)
		if err != nil {
			return err
		}
		for rows.Next() {
			var a audit.Activity
			if err := rows.Scan(&a.RunID, &a.Action); err != nil {
				rows.Close()
				return err
			}
			acts = append(acts, a)
		}
		rows.Close()
		return rows.Err()
	})
	return runs, events, acts, err
}

// auditRunsSQL selects the audited runs ($1 run id or ”, $2 since or
// NULL) with their final attempt.
const auditRunsSQL = `audit_runs AS (
SELECT r.run_id, r.state, c.attempt, r.event_count FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
 WHERE ($1 = '' OR r.run_id = $1) AND ($2::timestamptz IS NULL OR r.created_at >= $2))`

func sinceArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
