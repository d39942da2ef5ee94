package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/synctrace"
)

// AttachFacts is what a driver reads before it attaches a claimed run to its
// runner: everything the Open carries and the warm-session decisions need,
// read in one round trip.
type AttachFacts struct {
	// Checkpoint is the scope's current checkpoint (CurrentCheckpoint), or
	// nil.
	Checkpoint *executorv1.SessionCheckpoint
	// CheckpointOrder is RestoreOrderOf(scope, the current checkpoint's
	// runner), read with the facts (SPEC P6: the Open of a turn after an
	// online checkpoint carries it without a round trip of its own); nil
	// without a current checkpoint.
	CheckpointOrder *CheckpointOrder
	// PriorRuns are the run's prior-run records (PriorRuns).
	PriorRuns []PriorRunRecord
	// PreviousRunID and PreviousInput are the run submitted just before it
	// in its session scope (PreviousInScope); empty and nil when none.
	PreviousRunID string
	PreviousInput *prpv1.ExecutionInput
	// Cancellation is the run's cancellation record (Cancellation), or nil.
	Cancellation *executorv1.Cancellation
	// Replacement is the ReplaceSession decision this run applies (pending,
	// or applied by an earlier attempt of this run), or nil.
	Replacement *executorv1.SessionReplacement
	// ContinuityRequired: a runner served an earlier warm run of the scope
	// (SPEC F3), so its state must be there or be restored.
	ContinuityRequired bool
	// Restorable is the scope's newest checkpoint that no run settled
	// since, superseded or not: a run attached a runner after it but none
	// of those runs succeeded, so the provider thread has no kept turn the
	// checkpoint lacks (a failed or cancelled run's turn is not kept,
	// SPEC F9). It is what a run in flight on a gateway that was
	// lost restores on its new one (SPEC F3, retried as E11 says); nil when
	// none.
	Restorable *executorv1.SessionCheckpoint
}

// AttachFacts reads, in one round trip (a pipelined batch), the scope's
// current checkpoint, the run's prior-run records (at most limit), the run
// submitted just before it in its scope and the run's cancellation record. in is the run's stored input
// (the claim's): its company, agent and session select the prior runs, as
// the run row's columns (written from it) do for PriorRuns.
func (s *Store) AttachFacts(ctx context.Context, runID, scope string, in *prpv1.ExecutionInput, limit int) (*AttachFacts, error) {
	b := &pgx.Batch{}
	f, decodeErr := queueAttachFacts(b, runID, scope, in, limit, false)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	if *decodeErr != nil {
		return nil, *decodeErr
	}
	return f, nil
}

// queueAttachFacts queues AttachFacts' statements on b; the facts are
// filled in as b's results are read. A result that cannot be decoded (or
// a run that does not exist) is recorded in *decodeErr, not returned to the
// batch: a batch that also writes has committed by then, and its other
// results are still read.
//
// With gated, each statement reads only when the transaction claimed the
// run (claimedHereSQL): SubmitClaim queues the reads behind its claim, and
// a submission that queues behind its scope (most of them under load)
// then costs one primary-key probe per statement instead of the reads
// (SPEC P1). The facts are then meaningful only when the run was claimed.
func queueAttachFacts(b *pgx.Batch, runID, scope string, in *prpv1.ExecutionInput, limit int, gated bool) (f *AttachFacts, decodeErr *error) {
	f, decodeErr = &AttachFacts{}, new(error)
	queue := b.Queue
	if gated {
		queue = func(sql string, args ...any) *pgx.QueuedQuery {
			return b.Queue(claimedHere(sql, len(args)), append(args, runID)...)
		}
	}
	keep := func(err error) error {
		if *decodeErr == nil {
			*decodeErr = err
		}
		return nil
	}
	checkpoint := func(dst **executorv1.SessionCheckpoint) func(pgx.Row) error {
		return func(row pgx.Row) error {
			cp, _, err := scanCheckpoint(row)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return keep(err)
			default:
				*dst = cp
			}
			return nil
		}
	}
	queue(`SELECT `+checkpointColumns+` FROM executor.session_checkpoints
 WHERE session_scope = $1 AND superseded_at IS NULL ORDER BY created_at DESC LIMIT 1`, scope).QueryRow(checkpoint(&f.Checkpoint))
	queue(checkpointOrderSQL, scope, MaxServedRunners).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				o CheckpointOrder
				n int64
			)
			if err := rows.Scan(&o.RunnerInstanceID, &n, &o.ServedRunnerIDs); err != nil {
				return keep(err)
			}
			o.MinSourceSeq = uint64(n)
			f.CheckpointOrder = &o
		}
		if err := rows.Err(); err != nil {
			return keep(err)
		}
		return nil
	})
	queue(priorRunsSQL, priorRunsArgs(runID, in.GetBinding().GetCompanyId(), in.GetBinding().GetAgentId(),
		in.GetSession().GetNormalizedSessionId(), scope, limit)...).Query(func(rows pgx.Rows) error {
		var err error
		if f.PriorRuns, err = scanPriorRuns(rows); err != nil {
			return keep(err)
		}
		return nil
	})
	queue(previousInScopeSQL, runID).QueryRow(func(row pgx.Row) error {
		var raw []byte
		err := row.Scan(&f.PreviousRunID, &raw)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return keep(err)
		default:
			f.PreviousInput = &prpv1.ExecutionInput{}
			if err := proto.Unmarshal(raw, f.PreviousInput); err != nil {
				return keep(err)
			}
		}
		return nil
	})
	queue(`SELECT result_metadata -> 'nativeCancellation' FROM executor.runs WHERE run_id = $1`, runID).QueryRow(func(row pgx.Row) error {
		var raw []byte
		err := row.Scan(&raw)
		if errors.Is(err, pgx.ErrNoRows) {
			return keep(ErrRunNotFound(runID))
		}
		if err != nil {
			return keep(err)
		}
		if f.Cancellation, err = decodeCancellation(raw); err != nil {
			return keep(err)
		}
		return nil
	})
	queue(replacementForRunSQL, scope, runID).QueryRow(func(row pgx.Row) error {
		var err error
		if f.Replacement, err = scanOptionalReplacement(row); err != nil {
			return keep(err)
		}
		return nil
	})
	queue(continuityRequiredSQL, runID).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&f.ContinuityRequired); err != nil {
			return keep(err)
		}
		return nil
	})
	queue(restorableCheckpointSQL, scope).QueryRow(checkpoint(&f.Restorable))
	return f, decodeErr
}

// claimedHere wraps a read of n parameters so that it reads only when the
// transaction running it claimed run $n+1 (its coordinator, inserted by
// this transaction, is in flight): otherwise a one-time filter skips the
// read, rows and all. The read's rows keep their order (a subquery scan
// under a filter).
//
// The statements are built once per (sql, n) (claimedHereSQL): formatting
// them on every submission was ≈ 4 % of the executor's CPU per SubmitRun
// (SPEC P1).
func claimedHere(sql string, n int) string {
	k := claimedHereKey{sql, n}
	claimedHereSQL.RLock()
	s, ok := claimedHereSQL.m[k]
	claimedHereSQL.RUnlock()
	if ok {
		return s
	}
	s = fmt.Sprintf(`SELECT * FROM (%s) claimed_here
 WHERE EXISTS (SELECT FROM executor.coordinators g WHERE g.run_id = $%d AND g.phase = 'observed' AND g.xmin = pg_current_xact_id()::xid)`, sql, n+1)
	claimedHereSQL.Lock()
	claimedHereSQL.m[k] = s
	claimedHereSQL.Unlock()
	return s
}

type claimedHereKey struct {
	sql string
	n   int
}

// claimedHereSQL are claimedHere's statements by claimedHereKey (a few
// constant statements).
var claimedHereSQL = struct {
	sync.RWMutex
	m map[claimedHereKey]string
}{m: make(map[claimedHereKey]string)}

// CheckpointOrder is the RestoreOrder of the scope's current checkpoint,
// whose runner is RunnerInstanceID.
type CheckpointOrder struct {
	RunnerInstanceID string
	RestoreOrder
}

// checkpointOrderSQL reads scope $1's CheckpointOrder (no row without a
// current checkpoint) as RestoreOrderOf reads a RestoreOrder, at most $2
// served runners.
const checkpointOrderSQL = `SELECT k.runner_instance_id,
       coalesce((SELECT max(e.source_seq) FROM executor.events e JOIN executor.runs r ON r.run_id = e.run_id
                  WHERE r.session_scope = $1 AND e.source_instance_id = k.runner_instance_id), 0),
       ARRAY(SELECT s.runner_instance_id FROM executor.scope_runners s
              WHERE s.session_scope = $1 ORDER BY s.last_submit_seq DESC LIMIT $2)
  FROM (SELECT runner_instance_id FROM executor.session_checkpoints
         WHERE session_scope = $1 AND superseded_at IS NULL ORDER BY created_at DESC LIMIT 1) k`

// restorableCheckpointSQL reads scope $1's newest checkpoint after which
// no run of the scope that a runner served has succeeded
// (AttachFacts.Restorable). Only a succeeded run settles a turn the
// session's thread must keep: a failed or cancelled run after the
// checkpoint never makes it unrestorable (SPEC F9) — restoring it leaves
// that run's turn, which its caller saw fail or stop, out of the
// provider's history (its events stay on record), where refusing would
// wedge the session once its root is gone.
const restorableCheckpointSQL = `SELECT ` + checkpointColumns + ` FROM executor.session_checkpoints k
 WHERE k.session_scope = $1
   AND NOT EXISTS (SELECT 1 FROM executor.runs l JOIN executor.runs n ON n.session_scope = l.session_scope AND n.submit_seq > l.submit_seq
                    WHERE l.run_id = k.last_run_id AND n.runner_instance_id IS NOT NULL
                      AND n.state = 'succeeded')
 ORDER BY k.created_at DESC LIMIT 1`

// previousInScopeSQL reads the run submitted just before $1 in its session
// scope (see PreviousInScope): one backward probe of runs_session_idx from
// the run's place in its scope. Written as a lateral subquery: as a join
// ordered by submit_seq, the generic plan walked runs by submit_seq
// backward from the newest run of any scope, filtering by scope — the
// whole table for the first run of a scope (85 ms at 70,000 runs), in the
// claiming transaction of a session's first turn (SPEC P1, P4).
const previousInScopeSQL = `
SELECT p.run_id, p.input FROM executor.runs r
 CROSS JOIN LATERAL (SELECT p.run_id, p.input FROM executor.runs p
                      WHERE p.session_scope = r.session_scope AND p.submit_seq < r.submit_seq
                      ORDER BY p.submit_seq DESC LIMIT 1) p
 WHERE r.run_id = $1`

// ControlEvent is one executor-originated event (see AppendControlEvent).
type ControlEvent struct {
	Type string
	// Payload is the event's typed payload (tether/prp/v1/payloads.proto),
	// written with every field present.
	Payload proto.Message
	// Replacement, when set, is the ReplaceSession decision the event
	// records as applied by the run: the event is appended only when this
	// marks it applied (not when an earlier attempt of the run did).
	Replacement string
}

// RecordControl is the control-plane bookkeeping of an attach, in one
// transaction under the fence: it supersedes the checkpoints of
// supersedeScope when set (as SupersedeCheckpoints: a runner serves the run
// now, its state moves on from them) and appends the control events in
// order (as AppendControlEvent; listeners are notified on commit). It also
// files the session events parked for the run's scope (a verified
// suspension's, or what a runner emitted after the previous run's
// run.terminal; SPEC R9: they go to the scope's next run, under its fence)
// before the control events. A fence that no longer holds is
// native_session_lease_lost and nothing is written.
func (s *Store) RecordControl(ctx context.Context, f Fence, supersedeScope string, events []ControlEvent) error {
	if supersedeScope == "" && len(events) == 0 {
		return nil
	}
	defer synctrace.BeginNote("executor.control", f.RunID, func() string {
		return synctrace.Types(len(events), func(i int) string { return events[i].Type })
	})()
	var appended bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		appended, err = recordControl(ctx, tx, s.rules, s.Month(), f, supersedeScope, events)
		return err
	})
	if err == nil && appended {
		s.eventsCommitted(f.RunID, nil)
		s.notifyAfter(EventsChannel, f.RunID)
	}
	return err
}

// RecordAttach is the whole bookkeeping of an attach in one transaction
// (one commit instead of two): RecordControl's, then RecordRunner's.
//
// Its statements are pipelined (SPEC P4: the runner's first events wait
// for this commit): BEGIN, the fenced lock, the checkpoints' supersede, the
// parked events taken, the replacement applied and the count of the run's
// control events in one round trip; the control events' insert, the run's
// event count, the runner record and the COMMIT in a second — two round
// trips where the statements one by one took about nine (three before the
// COMMIT went with the writes: a fence lost since the lock now fails the
// runner record's statement, and the COMMIT with it). Parked events found
// are filed in between as before, the control events after them.
func (s *Store) RecordAttach(ctx context.Context, f Fence, supersedeScope string, events []ControlEvent, runner RunnerRecord) error {
	defer synctrace.BeginNote("executor.attach", f.RunID, func() string {
		return synctrace.Types(len(events), func(i int) string { return events[i].Type })
	})()
	if supersedeScope == "" && len(events) == 0 {
		// The runner record alone: one fenced statement, committed by
		// itself.
		return recordRunner(ctx, s.pool, f, runner)
	}
	appended, err := s.recordAttach(ctx, f, supersedeScope, events, runner)
	if err == nil && len(appended) > 0 {
		// The run's watchers here are handed the control events with their
		// seqs (SPEC P4: no read for them); parked events filed before
		// them leave a gap the feed reads.
		s.eventsCommitted(f.RunID, appended)
		s.notifyAfter(EventsChannel, f.RunID)
	}
	return err
}

// recordAttach is RecordAttach's pipelined transaction; appended are the
// control events it appended, as stored.
func (s *Store) recordAttach(ctx context.Context, f Fence, supersedeScope string, events []ControlEvent, runner RunnerRecord) (appended []StoredEvent, err error) {
	var (
		count, controls int64
		lost            bool // the lock found no row: the fence does not hold
		parked          []encodedEvent
		parkedErr       error
		first           = make([]bool, len(events)) // the event is to be appended
	)
	// The callbacks report what they find rather than fail the batch (as
	// AppendEvents': pgx drops a failed batch's statements from the
	// connection's cache).
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(lockFencedSQL, f.RunID, f.Owner, int64(f.Attempt)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&count)
		if errors.Is(err, pgx.ErrNoRows) {
			lost = true
			return nil
		}
		return err
	})
	if supersedeScope != "" {
		b.Queue(supersedeCheckpointsSQL, supersedeScope)
	}
	b.Queue(adoptParkedSQL, f.RunID).Query(func(rows pgx.Rows) error {
		parked, parkedErr = scanParked(rows)
		return nil
	})
	queueReplacements(b, f.RunID, events, first)
	if len(events) > 0 {
		b.Queue(controlCountSQL, f.RunID, ControlInstance).QueryRow(func(row pgx.Row) error {
			return row.Scan(&controls)
		})
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// Released once the transaction ended (committed with the writes, or
	// rolled back below).
	defer conn.Release()
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(ctx)
		}
	}()
	if err = br.Close(); lost {
		return nil, ErrLeaseLost(f)
	}
	if err != nil {
		return nil, err
	}
	if parkedErr != nil {
		return nil, parkedErr
	}
	// SPEC R9: what was parked for the scope goes first, then the control
	// events.
	if count, err = fileParked(ctx, tx, s.rules, s.Month(), f, count, parked); err != nil {
		return nil, err
	}
	control, err := encodeFirstControls(f.RunID, controls, events, first)
	if err != nil {
		return nil, err
	}
	w := &pgx.Batch{}
	if len(control) > 0 {
		if err := insertEvents(ctx, queued{w}, f.RunID, count, f.Attempt, control); err != nil {
			return nil, err
		}
		w.Queue(`UPDATE executor.runs SET event_count = event_count + $2 WHERE run_id = $1`, f.RunID, int64(len(control)))
	}
	// The COMMIT goes with the writes (one round trip fewer, SPEC P4): a
	// fence lost since the lock fails the runner record's statement
	// (recordRunnerGuardedSQL), which skips the COMMIT, and the
	// transaction is rolled back.
	if err := queueRecordRunnerGuarded(w, f, runner); err != nil {
		return nil, err
	}
	w.Queue(`COMMIT`).Exec(func(tag pgconn.CommandTag) error {
		committed = tag.String() == "COMMIT"
		return nil
	})
	if err := tx.SendBatch(ctx, w).Close(); isFenceGuard(err) {
		return nil, ErrLeaseLost(f)
	} else if err != nil {
		return nil, err
	}
	if !committed {
		return nil, errors.New("store: the attach's bookkeeping did not commit")
	}
	for i, e := range control {
		appended = append(appended, StoredEvent{Seq: uint64(count) + uint64(i) + 1, Event: e.ev})
	}
	return appended, nil
}

// queueReplacements queues on b the replacement each of events applies
// (its Replacement); first[i] is set when events[i] is to be appended: it
// has no replacement, or its replacement was applied now, not by an
// earlier attempt.
func queueReplacements(b *pgx.Batch, runID string, events []ControlEvent, first []bool) {
	for i, ev := range events {
		if ev.Replacement == "" {
			first[i] = true
			continue
		}
		b.Queue(applyReplacementSQL, ev.Replacement, runID).Exec(func(tag pgconn.CommandTag) error {
			first[i] = tag.RowsAffected() == 1
			return nil
		})
	}
}

// encodeFirstControls encodes the events to be appended (first) as run
// runID's control events after the controls it holds.
func encodeFirstControls(runID string, controls int64, events []ControlEvent, first []bool) ([]encodedEvent, error) {
	var control []encodedEvent
	for i, ev := range events {
		if !first[i] {
			continue // its replacement was applied by an earlier attempt
		}
		e, err := encodeControlEvent(runID, controls+int64(len(control))+1, ev.Type, ev.Payload)
		if err != nil {
			return nil, err
		}
		control = append(control, e)
	}
	return control, nil
}

// supersedeCheckpointsSQL supersedes scope $1's current checkpoints.
const supersedeCheckpointsSQL = `UPDATE executor.session_checkpoints SET superseded_at = now()
 WHERE session_scope = $1 AND superseded_at IS NULL`

// recordControl writes RecordControl's bookkeeping in tx; appended says it
// appended events, which the caller announces once tx committed
// (notifyAfter: a NOTIFY inside the transaction would hold the
// notification queue's lock through its WAL flush, so every notifying
// commit meanwhile, e.g. the first events of this and other runs, waited
// for it).
func recordControl(ctx context.Context, tx pgx.Tx, rules Rules, month time.Time, f Fence, supersedeScope string, events []ControlEvent) (appended bool, err error) {
	if supersedeScope == "" && len(events) == 0 {
		return false, nil
	}
	count, err := lockFenced(ctx, tx, f)
	if err != nil {
		return false, err
	}
	if supersedeScope != "" {
		if _, err := tx.Exec(ctx, supersedeCheckpointsSQL, supersedeScope); err != nil {
			return false, err
		}
	}
	if count, err = adoptParked(ctx, tx, rules, month, f, count); err != nil {
		return false, err
	}
	n := 0
	for _, ev := range events {
		if ev.Replacement != "" {
			if first, err := applyReplacement(ctx, tx, ev.Replacement, f.RunID); err != nil || !first {
				if err != nil {
					return false, err
				}
				continue
			}
		}
		if err := appendControlEvent(ctx, tx, f.RunID, count+int64(n), f.Attempt, ev.Type, ev.Payload); err != nil {
			return false, err
		}
		n++
	}
	return n > 0, nil
}
