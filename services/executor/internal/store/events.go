package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"
)

// EventHarnessReady reports the provider process (pid, pgid, start ticks).
const EventHarnessReady = prp.EventHarnessReady

// recordProviderProcess persists the provider process identity a runner
// reported when it spawned the provider (E12).
func recordProviderProcess(ctx context.Context, tx execer, runID string, ev *prpv1.Event) error {
	var p prpv1.HarnessReady
	if prp.DecodePayload(ev, &p) != nil {
		p.Reset() // a payload of another shape records no process
	}
	info := &prpv1.ProcessInfo{
		Pid:        p.GetPid(),
		Pgid:       p.GetPgid(),
		StartTicks: uint64(p.GetStartTicks()),
		StartedAt:  ev.GetEmittedAt(),
	}
	raw, err := marshalDet.Marshal(info)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE executor.runs SET provider_process = $2 WHERE run_id = $1`, runID, raw)
	return err
}

// ReplayConflict builds the terminal error for a conflicting replay.
func ReplayConflict(seq uint64) error {
	return failure.New(codes.FailedPrecondition, failure.NativeEventReplayConflict,
		"source sequence %d contained different bytes", seq)
}

// AppendResult says what happened to a batch.
type AppendResult struct {
	// Inserted counts new rows; duplicates were identical replays.
	Inserted, Duplicates int
	// Parked counts session events of an unfenced append held for the
	// next run of their scope (see AppendEvents).
	Parked int
	// Dropped counts events that can be filed under no run: another
	// run's run.terminal (that run has its outcome), or, unfenced, an
	// event of a run the database does not know.
	Dropped int
	// Terminal is true when the fenced run's run.terminal was persisted by
	// this call (its state and result are now final).
	Terminal bool
	// RuntimeInputs are the lifecycle metrics of the fresh runtime input
	// request events (SPEC E5), each counted once.
	RuntimeInputs []RuntimeInputMetric
	// Acknowledged are the cancellation intents AppendEventsAcking
	// acknowledged with the run's terminal.
	Acknowledged []string
	// AcknowledgedRecord is the run's cancellation record as this call's
	// commit left it when it acknowledged the record's intent (or found
	// it acknowledged), else nil: CancelRun answers from it without
	// reading the record back (SPEC P2).
	AcknowledgedRecord *executorv1.Cancellation
	// TurnStarted is true when this call filed a turn.started of the
	// fenced run for the first time (a replayed one is a duplicate): the
	// end of the run's submit → turn.started latency (SPEC D6).
	TurnStarted bool
	// Outcome is the run.terminal this call filed (Terminal true): its
	// state and failure code.
	Outcome Terminal
}

type encodedEvent struct {
	ev   *prpv1.Event
	raw  []byte
	hash []byte
}

// AppendEvents persists a batch of runner events idempotently, every row
// under a fence (SPEC R9). Events of the fenced run are written only while
// the fence holds. Events naming another run (session events a runner
// emitted after that run ended, e.g. harness.exited, or a tail it had not
// had acknowledged) are filed under the fenced run, written by its attempt:
// a run ended with its run.terminal and takes no row after it; another
// run's run.terminal is dropped (that run has its outcome). An event
// already stored under a run of the scope with the same bytes is a
// duplicate and dropped; with other bytes the whole batch is refused with
// native_event_replay_conflict. A run.terminal of the fenced run records
// the run's result and final state in the same transaction. Listeners on
// EventsChannel are notified on commit.
//
// Without a fence (f.RunID empty: a verified idle suspension, when no run
// of the scope holds a lease), the events are parked for their scope and
// filed under its next run when it attaches (RecordControl).
func (s *Store) AppendEvents(ctx context.Context, f Fence, events []*prpv1.Event) (AppendResult, error) {
	return s.AppendEventsAcking(ctx, f, events, nil)
}

// AppendEventsAcking is AppendEvents that, when it persists the fenced
// run's run.terminal, also acknowledges the cancellation intents
// dispatched to the run's runner (AcknowledgeCancellation) in the same
// transaction (SPEC P2: one commit instead of two, without waiting for the
// runner's answer): the turn ended, so the provider has nothing left to do
// for the run — the rule the driver applies to the runner's answer
// (completed, or no active turn). An acknowledgement that fails is rolled
// back alone (a savepoint); the events are persisted and the driver
// acknowledges on the runner's answer as before.
func (s *Store) AppendEventsAcking(ctx context.Context, f Fence, events []*prpv1.Event, intents []string) (AppendResult, error) {
	defer synctrace.BeginNote("executor.events", f.RunID, func() string {
		return synctrace.Types(len(events), func(i int) string { return events[i].GetEventType() })
	})()
	rules, err := s.decider()
	if err != nil {
		return AppendResult{}, err
	}
	// Plan updates are stored rendered, oversized plans refused (SPEC E3).
	events = rules.Stored(events)
	// Each event is encoded (deterministically) and hashed once, for
	// whichever path writes it.
	encoded, err := encodeEvents(events)
	if err != nil {
		return AppendResult{}, err
	}
	if fastEligible(f, encoded, rules) {
		res, conflictFree, err := s.appendFast(ctx, f, encoded)
		if err != nil || conflictFree {
			return res, fenceViolation(f, err)
		}
		// A replay (duplicates, or a conflict to report): take the careful path.
	}
	if f.RunID == "" {
		var res AppendResult
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			res = AppendResult{}
			return parkEvents(ctx, tx, encoded, &res)
		})
		return res, fenceViolation(f, err)
	}
	res, locked, err := s.appendCareful(ctx, rules, f, encoded, intents)
	if err == nil && res.Inserted > 0 {
		s.eventsCommitted(f.RunID, nil)
	}
	if locked {
		if c := refusedAfterTerminal(err); c != "" {
			// Not a lost lease (the fence held, its run's row locked):
			// the batch itself puts a row after the run's terminal (two
			// run.terminal events of the run from two sources). Retrying
			// the same replay cannot succeed; reported as what it is, the
			// attempt fails visibly (and the run's attempts bound it)
			// instead of its driver stopping silently and the run being
			// re-claimed each lease TTL.
			return res, failure.Wrap(err, codes.Internal, failure.RunnerProtocolError,
				"run %s attempt %d: the runner's events put a row after the run's run.terminal (%s); the batch is refused", f.RunID, f.Attempt, c)
		}
	}
	return res, fenceViolation(f, err)
}

// refusedAfterTerminal names the database's rule err broke when it is one
// of those that keep a run's run.terminal its last row, else "".
func refusedAfterTerminal(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.ConstraintName == ConstraintAfterTerminal || IsOneTerminal(pgErr.ConstraintName)) {
		return pgErr.ConstraintName
	}
	return ""
}

// appendCareful is the careful path of a fenced append (AppendEvents), its
// transaction pipelined (SPEC P4): its statements are sent in as few
// round trips as their data dependencies allow, two for a run's
// run.terminal (ten one by one; three with a cost to settle):
//
//  1. BEGIN; the fenced lock (the run's row, its event count); the park of
//     what follows the run's terminal; the dedupe reads; with the run's
//     run.terminal, the governed wait read (when the batch opens no
//     interaction, which that read would have to see) and the run's
//     cancellation record (when acknowledging intents). Every statement
//     after the lock runs after it, under the row it locked.
//  2. what the fresh events write (fileFenced): the insert, the
//     interactions, process and plan they record, the count, the run's
//     finish (its coordinator fenced again), the notification, the
//     acknowledgements, and the COMMIT: a statement that fails, the
//     finish's fence among them (finishGuardedSQL), skips what follows it
//     in the batch, the COMMIT too, and the transaction is rolled back
//     (or the acknowledgement alone, then committed). The order of the
//     writes is what it was; only the COMMIT no longer waits for their
//     results to be read first.
//  3. COMMIT, only when the run's terminal carries a cost: the thresholds
//     the month's spend crosses are recorded after the settlement's
//     result is read (crossBudget).
//
// A replay with nothing fresh commits after the first. locked reports
// that the fence held (the lock's row was read).
func (s *Store) appendCareful(ctx context.Context, rules Rules, f Fence, encoded []encodedEvent, intents []string) (res AppendResult, locked bool, err error) {
	own, foreign, dropped := partitionByRun(encoded, f.RunID)
	res.Dropped += dropped
	// What the runner emitted after the run's own run.terminal (e.g.
	// harness.exited, runner.reconciled of a runner restarted as the
	// turn ended) takes no row of this run: it waits for the scope's
	// next run, like a suspension's events — whichever run it names
	// (a replayed turn's events may name an earlier run of the scope;
	// filed after the terminal they were refused by the database's
	// events_after_terminal rule on every attempt, a run re-claimed
	// forever).
	term := ownTerminal(own)
	own, after := splitAfter(term, own)
	foreign, fafter := splitAfter(term, foreign)

	var (
		count            int64
		lost             bool // the lock found no row: the fence does not hold
		ownOf, foreignOf func([]encodedEvent) ([]encodedEvent, int, error)
		gov              governedRead
		ack              *acking
	)
	// The callbacks report what they find rather than fail the batch: pgx
	// drops a failed batch's statements from the connection's cache (each
	// prepared again, a round trip more, on its next use).
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(lockFencedSQL, f.RunID, f.Owner, int64(f.Attempt)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&count)
		if errors.Is(err, pgx.ErrNoRows) {
			lost = true
			return nil
		}
		locked = err == nil
		return err
	})
	queuePark(b, append(after, fafter...), &res)
	queueDedupe(b, f.RunID, own, foreign, &ownOf, &foreignOf)
	if term != nil && !opensInteractions(rules, encoded) {
		b.Queue(governedWaitSQL, f.RunID).QueryRow(func(row pgx.Row) error { return noRowsOK(gov.scan(row)) })
	}
	if term != nil && len(intents) > 0 {
		ack = &acking{intents: intents, hook: s.hooks.BeforeCancellationAck}
		b.Queue(cancellationRecordSQL, f.RunID).QueryRow(func(row pgx.Row) error { return noRowsOK(row.Scan(&ack.raw)) })
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, false, err
	}
	// Released once the transaction ended: committed in fileFenced's last
	// batch, or by the Commit or Rollback below (a connection still in a
	// transaction would be closed by the pool instead).
	defer conn.Release()
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	committed := false
	// A no-op once committed; else it ends the transaction (BeginFunc's
	// rule).
	defer func() {
		if !committed {
			_ = tx.Rollback(ctx)
		}
	}()
	if err = br.Close(); lost {
		return AppendResult{}, false, ErrLeaseLost(f)
	}
	if err != nil {
		return res, locked, err
	}
	fresh, dups, err := filterWith(ownOf, own)
	if err != nil {
		return res, locked, err
	}
	res.Duplicates += dups
	ffresh, fdups, err := filterWith(foreignOf, foreign)
	if err != nil {
		return res, locked, err
	}
	res.Duplicates += fdups
	var pre *governedRead
	if gov.ok {
		pre = &gov
	}
	if err = fileFenced(ctx, tx, rules, s.Month(), f, count, terminalLast(sourceOrdered(append(ffresh, fresh...))), &res, pre, ack, &committed); err != nil {
		return res, locked, err
	}
	if committed {
		return res, locked, nil
	}
	committed = true // Commit ends the transaction, whatever it returns
	return res, locked, tx.Commit(ctx)
}

// partitionByRun splits encoded into the events of run runID and those of
// other runs of its scope; another run's run.terminal is dropped (counted).
func partitionByRun(encoded []encodedEvent, runID string) (own, foreign []encodedEvent, dropped int) {
	for _, e := range encoded {
		switch {
		case e.ev.GetRunId() == runID:
			own = append(own, e)
		case e.ev.GetEventType() == EventTerminal:
			dropped++
		default:
			foreign = append(foreign, e)
		}
	}
	return own, foreign, dropped
}

// queueDedupe queues on b the reads that find which of own (run runID's)
// and foreign (its scope's other runs') events are stored already; their
// callbacks set *ownOf and *foreignOf (filterWith).
func queueDedupe(b *pgx.Batch, runID string, own, foreign []encodedEvent, ownOf, foreignOf *func([]encodedEvent) ([]encodedEvent, int, error)) {
	if len(own) > 0 {
		instances, seqs := sourceKeys(own)
		b.Queue(dedupeSQL, runID, instances, seqs).Query(func(rows pgx.Rows) error {
			*ownOf = filterStored(rows, nil)
			return nil
		})
	}
	if len(foreign) > 0 {
		b.Queue(dedupeInScopeSQL, dedupeInScopeArgs(runID, foreign)...).Query(func(rows pgx.Rows) error {
			*foreignOf = filterStored(rows, nil)
			return nil
		})
	}
}

// noRowsOK is err, except that no row is no error: a read after the
// fenced lock in its batch, whose row the lock found unless the fence does
// not hold (then the lock's result is the batch's).
func noRowsOK(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// filterWith applies a dedupe read's filter (nil: nothing was read, as
// there was nothing to look up).
func filterWith(filter func([]encodedEvent) ([]encodedEvent, int, error), evs []encodedEvent) ([]encodedEvent, int, error) {
	if filter == nil {
		return nil, 0, nil
	}
	return filter(evs)
}

// opensInteractions reports whether a batch carries an event whose
// filing may open an interaction (Rules.Decides).
func opensInteractions(rules Rules, evs []encodedEvent) bool {
	for _, e := range evs {
		if rules.Decides(e.ev.GetEventType()) {
			return true
		}
	}
	return false
}

// queued is an execer that queues statements on a batch, for the
// functions that need of a statement's result only its success (its error
// comes with the batch's).
type queued struct{ b *pgx.Batch }

func (q queued) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// ownTerminal is the run.terminal among a run's own events (the one of
// the lowest source seq), or nil.
func ownTerminal(evs []encodedEvent) *prpv1.Event {
	var term *prpv1.Event
	for _, e := range evs {
		if e.ev.GetEventType() == EventTerminal && (term == nil || e.ev.GetSourceSeq() < term.GetSourceSeq()) {
			term = e.ev
		}
	}
	return term
}

// splitAfter splits events at a run's run.terminal term: the events of
// term's source instance with a higher source seq come after it.
func splitAfter(term *prpv1.Event, evs []encodedEvent) (upTo, after []encodedEvent) {
	if term == nil {
		return evs, nil
	}
	for _, e := range evs {
		if e.ev.GetSourceInstanceId() == term.GetSourceInstanceId() && e.ev.GetSourceSeq() > term.GetSourceSeq() {
			after = append(after, e)
		} else {
			upTo = append(upTo, e)
		}
	}
	return upTo, after
}

// terminalLast moves a run.terminal to the end of the events filed with
// it: what is left beside it (splitAfter took its own source's later
// events) comes from other sources, and nothing of a run follows its
// terminal.
func terminalLast(evs []encodedEvent) []encodedEvent {
	for i, e := range evs {
		if e.ev.GetEventType() == EventTerminal && i != len(evs)-1 {
			out := append(append(make([]encodedEvent, 0, len(evs)), evs[:i]...), evs[i+1:]...)
			return append(out, e)
		}
	}
	return evs
}

// fileFenced writes fresh events (deduplicated, in source order) under the
// fence, whose run holds count rows: a harness.ready records the provider
// process the run is served by, the run's run.terminal finishes it, and
// acknowledges ack's intents beside it (AppendEventsAcking). Its
// statements go in one batch (one round trip); in two, around the
// governed wait read, when a succeeded terminal's read was not made ahead
// (pre) or the events may open interactions (the read must see them).
func fileFenced(ctx context.Context, tx pgx.Tx, rules Rules, month time.Time, f Fence, count int64, fresh []encodedEvent, res *AppendResult, pre *governedRead, ack *acking, committed *bool) error {
	if len(fresh) == 0 {
		return nil
	}
	if rules == nil {
		return errNoRules
	}
	evs := make([]*prpv1.Event, len(fresh))
	for i, e := range fresh {
		evs[i] = e.ev
	}
	d, err := rules.Batch(f.RunID, evs)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	if err := queueFresh(ctx, b, f, count, fresh, d, res); err != nil {
		return err
	}
	terminal := d.Terminal
	if terminal == nil {
		b.Queue(`UPDATE executor.runs SET event_count = event_count + $2, updated_at = now() WHERE run_id = $1`,
			f.RunID, len(fresh))
	}
	acked := &ackWrite{}
	lost := false // the run's finish found the fence gone
	spent := &settled{month: month}
	if terminal != nil {
		t := *terminal
		res.Outcome = Terminal{State: t.State, Code: t.Code}
		if t.Result != nil && t.State == StateSucceeded {
			if pre == nil || opensInteractions(rules, fresh) {
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					return err
				}
				b = &pgx.Batch{}
				if err := governedWait(ctx, tx, rules, f.RunID, t.Result); err != nil {
					return err
				}
			} else if err := pre.apply(ctx, tx, rules, f.RunID, t.Result); err != nil {
				return err
			}
		}
		// The run's finish counts the rows too: one update of its row.
		if err := queueFinishAs(b, f, t, len(fresh), &lost, spent, committed != nil); err != nil {
			return err
		}
	}
	b.Queue(`SELECT pg_notify($1, $2)`, EventsChannel, f.RunID)
	if terminal != nil && ack != nil {
		acked = queueAcks(ctx, b, f, ack, res)
	}
	// The COMMIT goes with the writes (one round trip fewer), unless the
	// month's spend is settled: the thresholds it crosses are recorded
	// after its result is read (crossBudget). A statement of the batch that
	// fails, the lost fence among them (queueFinishAs), skips the rest of
	// the batch, COMMIT included, and the transaction is rolled back, or
	// the acknowledgement alone (its savepoint) and committed after, as
	// before.
	pipelined := committed != nil && !spent.queued
	if pipelined {
		b.Queue(`COMMIT`).Exec(func(tag pgconn.CommandTag) error {
			*committed = tag.String() == "COMMIT"
			return nil
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); lost || isFenceGuard(err) {
		return ErrLeaseLost(f)
	} else if err != nil {
		if !acked.begun {
			return err
		}
		// The acknowledgement failed, after everything before its
		// savepoint succeeded: it is rolled back alone.
		if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT acknowledgement`); rerr != nil {
			return errors.Join(err, rerr)
		}
		res.Acknowledged = slices.DeleteFunc(res.Acknowledged, func(id string) bool { return id == acked.intent })
		acked.rec = nil
	}
	if acked.rec != nil {
		res.AcknowledgedRecord = acked.rec.proto()
	}
	if err := crossBudget(ctx, tx, rules, spent); err != nil {
		return err
	}
	res.Inserted += len(fresh)
	res.RuntimeInputs = append(res.RuntimeInputs, d.RuntimeInputs...)
	res.Terminal = terminal != nil
	return nil
}

// queueFresh queues on b the rows of fresh events under f (the run holds
// count rows), the interactions and plan decision d found in them, and the
// provider process a harness.ready names; res learns of a turn.started.
func queueFresh(ctx context.Context, b *pgx.Batch, f Fence, count int64, fresh []encodedEvent, d Decisions, res *AppendResult) error {
	q := queued{b}
	if err := insertEvents(ctx, q, f.RunID, count, f.Attempt, fresh); err != nil {
		return err
	}
	if err := recordInteractions(ctx, q, f.RunID, d.Interactions); err != nil {
		return err
	}
	for _, e := range fresh {
		switch e.ev.GetEventType() {
		case prp.EventTurnStarted:
			res.TurnStarted = res.TurnStarted || e.ev.GetRunId() == f.RunID
		case EventHarnessReady:
			if err := recordProviderProcess(ctx, q, f.RunID, e.ev); err != nil {
				return err
			}
		}
	}
	if d.Plan != "" {
		// The run's latest plan (SPEC E3).
		b.Queue(`UPDATE executor.runs SET plan = $2 WHERE run_id = $1`, f.RunID, d.Plan)
	}
	return nil
}

// fenceViolation maps the database's own refusal of an unfenced row
// (migration 00010: a row by another attempt than the run's, a row after
// its run.terminal, a second run.terminal) to native_session_lease_lost:
// whatever code path tried, the fence it wrote under does not hold.
func fenceViolation(f Fence, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	if c := pgErr.ConstraintName; c == ConstraintWriterFence || c == ConstraintAfterTerminal || IsOneTerminal(c) {
		return failure.Wrap(err, codes.Aborted, failure.NativeSessionLeaseLost,
			"run %s attempt %d by %s: the database refused the row (%s): %s", f.RunID, f.Attempt, f.Owner, pgErr.ConstraintName, pgErr.Message)
	}
	return err
}

// The database's event fence rules (migration 00010).
const (
	ConstraintWriterFence   = "events_writer_fence"
	ConstraintAfterTerminal = "events_after_terminal"
	ConstraintOneTerminal   = "events_one_terminal_idx"
)

// sourceOrdered sorts events by source seq within each source instance
// (stable otherwise), so run-local seqs follow source seqs.
func sourceOrdered(evs []encodedEvent) []encodedEvent {
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := evs[i].ev, evs[j].ev
		if a.GetSourceInstanceId() != b.GetSourceInstanceId() {
			return false
		}
		return a.GetSourceSeq() < b.GetSourceSeq()
	})
	return evs
}

// dedupeSQL reads which of a batch's events of a run are stored under it
// (args: run, source instances, source seqs); filterStored drops them (a
// duplicate, same bytes) or refuses the batch (a replay with other bytes).
const dedupeSQL = `
SELECT e.source_instance_id, e.source_seq, e.payload_sha256 FROM executor.events e
  JOIN unnest($2::text[], $3::bigint[]) AS k(source_instance_id, source_seq)
    ON e.source_instance_id = k.source_instance_id AND e.source_seq = k.source_seq
 WHERE e.run_id = $1`

// dedupeInScope is the dedupe (dedupeSQL) of events naming another run than runID: they
// may be stored under the run they name (before SPEC R9 they were) or
// under any later run of runID's scope that filed them, so runs of the
// scope from the earliest one they name on are searched.
func dedupeInScope(ctx context.Context, tx pgx.Tx, runID string, evs []encodedEvent) ([]encodedEvent, int, error) {
	if len(evs) == 0 {
		return nil, 0, nil
	}
	return filterStored(tx.Query(ctx, dedupeInScopeSQL, dedupeInScopeArgs(runID, evs)...))(evs)
}

const dedupeInScopeSQL = `
SELECT e.source_instance_id, e.source_seq, e.payload_sha256
  FROM executor.runs b
  JOIN executor.runs r ON r.session_scope = b.session_scope
   AND r.submit_seq >= coalesce((SELECT min(o.submit_seq) FROM executor.runs o
                                  WHERE o.run_id = ANY($4) AND o.session_scope = b.session_scope), 0)
  JOIN executor.events e ON e.run_id = r.run_id
  JOIN unnest($2::text[], $3::bigint[]) AS k(source_instance_id, source_seq)
    ON e.source_instance_id = k.source_instance_id AND e.source_seq = k.source_seq
 WHERE b.run_id = $1`

func dedupeInScopeArgs(runID string, evs []encodedEvent) []any {
	instances, seqs := sourceKeys(evs)
	origins := make([]string, len(evs))
	for i, e := range evs {
		origins[i] = e.ev.GetRunId()
	}
	return []any{runID, instances, seqs, origins}
}

func sourceKeys(evs []encodedEvent) ([]string, []int64) {
	instances := make([]string, len(evs))
	seqs := make([]int64, len(evs))
	for i, e := range evs {
		instances[i], seqs[i] = e.ev.GetSourceInstanceId(), int64(e.ev.GetSourceSeq())
	}
	return instances, seqs
}

// filterStored reads the (source instance, source seq, hash) rows of a
// lookup and returns a filter keeping the events not stored yet, in order:
// a stored one with the same bytes is a duplicate, with other bytes a
// replay conflict.
func filterStored(rows pgx.Rows, err error) func([]encodedEvent) ([]encodedEvent, int, error) {
	type key struct {
		inst string
		seq  uint64
	}
	seen := map[key][]byte{}
	if err == nil {
		for rows.Next() {
			var (
				inst string
				seq  int64
				h    []byte
			)
			if err = rows.Scan(&inst, &seq, &h); err != nil {
				break
			}
			seen[key{inst, uint64(seq)}] = h
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	return func(evs []encodedEvent) ([]encodedEvent, int, error) {
		if err != nil {
			return nil, 0, err
		}
		var fresh []encodedEvent
		dups := 0
		for _, e := range evs {
			k := key{e.ev.GetSourceInstanceId(), e.ev.GetSourceSeq()}
			if h, ok := seen[k]; ok {
				if !bytes.Equal(h, e.hash) {
					return nil, 0, ReplayConflict(k.seq)
				}
				dups++
				continue
			}
			seen[k] = e.hash
			fresh = append(fresh, e)
		}
		return fresh, dups, nil
	}
}

// parkEvents holds the events of an unfenced append for the scope of the
// run each names (see AppendEvents); a run.terminal, or an event of a run
// the database does not know, is dropped.
func parkEvents(ctx context.Context, tx pgx.Tx, evs []encodedEvent, res *AppendResult) error {
	b := &pgx.Batch{}
	queuePark(b, evs, res)
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

// queuePark queues parkEvents' statement on b, if there is anything to
// park; the counts are added to res when its result is read.
func queuePark(b *pgx.Batch, evs []encodedEvent, res *AppendResult) {
	var (
		runs, insts []string
		seqs        []int64
		hashes      [][]byte
		raws        [][]byte
	)
	for _, e := range evs {
		if e.ev.GetEventType() == EventTerminal {
			res.Dropped++
			continue
		}
		runs = append(runs, e.ev.GetRunId())
		insts = append(insts, e.ev.GetSourceInstanceId())
		seqs = append(seqs, int64(e.ev.GetSourceSeq()))
		hashes = append(hashes, e.hash)
		raws = append(raws, e.raw)
	}
	if len(runs) == 0 {
		return
	}
	b.Queue(`
WITH k AS (
  SELECT r.session_scope, k.source_instance_id, k.source_seq, k.payload_sha256, k.event
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::bytea[])
         AS k(run_id, source_instance_id, source_seq, payload_sha256, event)
    JOIN executor.runs r ON r.run_id = k.run_id),
ins AS (
  INSERT INTO executor.parked_events (session_scope, source_instance_id, source_seq, payload_sha256, event)
  SELECT * FROM k ON CONFLICT (source_instance_id, source_seq) DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM k)`, runs, insts, seqs, hashes, raws).QueryRow(func(row pgx.Row) error {
		var parked, known int
		if err := row.Scan(&parked, &known); err != nil {
			return err
		}
		res.Parked += parked
		res.Duplicates += known - parked
		res.Dropped += len(runs) - known
		return nil
	})
}

// adoptParked files the events parked for the fenced run's scope (see
// parkEvents) under the fence, whose run holds count rows, and returns the
// run's new row count.
func adoptParked(ctx context.Context, tx pgx.Tx, rules Rules, month time.Time, f Fence, count int64) (int64, error) {
	rows, err := tx.Query(ctx, adoptParkedSQL, f.RunID)
	if err != nil {
		return count, err
	}
	parked, err := scanParked(rows)
	if err != nil {
		return count, err
	}
	return fileParked(ctx, tx, rules, month, f, count, parked)
}

// adoptParkedSQL takes the events parked for run $1's scope (adoptParked).
const adoptParkedSQL = `
DELETE FROM executor.parked_events WHERE session_scope = (SELECT session_scope FROM executor.runs WHERE run_id = $1)
RETURNING payload_sha256, event`

// scanParked reads adoptParkedSQL's rows, and closes them.
func scanParked(rows pgx.Rows) ([]encodedEvent, error) {
	defer rows.Close()
	var parked []encodedEvent
	for rows.Next() {
		var e encodedEvent
		if err := rows.Scan(&e.hash, &e.raw); err != nil {
			return nil, err
		}
		e.ev = &prpv1.Event{}
		if err := proto.Unmarshal(e.raw, e.ev); err != nil {
			return nil, err
		}
		parked = append(parked, e)
	}
	rows.Close()
	return parked, rows.Err()
}

// fileParked files the parked events adoptParked took under the fence,
// whose run holds count rows, and returns the run's new row count.
func fileParked(ctx context.Context, tx pgx.Tx, rules Rules, month time.Time, f Fence, count int64, parked []encodedEvent) (int64, error) {
	if len(parked) == 0 {
		return count, nil
	}
	sort.SliceStable(parked, func(i, j int) bool {
		a, b := parked[i].ev, parked[j].ev
		if a.GetSourceInstanceId() != b.GetSourceInstanceId() {
			return a.GetSourceInstanceId() < b.GetSourceInstanceId()
		}
		return a.GetSourceSeq() < b.GetSourceSeq()
	})
	fresh, _, err := dedupeInScope(ctx, tx, f.RunID, parked)
	if err != nil {
		return count, err
	}
	var res AppendResult
	if err := fileFenced(ctx, tx, rules, month, f, count, fresh, &res, nil, nil, nil); err != nil {
		return count, err
	}
	return count + int64(res.Inserted), nil
}

// eventColumns are a batch's event columns as the arrays an unnest of the
// events table takes (the careful and the fast append build them alike).
type eventColumns struct {
	insts, ids, types []string
	srcSeqs           []int64
	hashes, raws      [][]byte
}

func columnsOf(evs []encodedEvent) eventColumns {
	n := len(evs)
	c := eventColumns{
		insts: make([]string, n), ids: make([]string, n), types: make([]string, n),
		srcSeqs: make([]int64, n), hashes: make([][]byte, n), raws: make([][]byte, n),
	}
	for i, e := range evs {
		c.insts[i] = e.ev.GetSourceInstanceId()
		c.srcSeqs[i] = int64(e.ev.GetSourceSeq())
		c.ids[i] = e.ev.GetSourceEventId()
		c.types[i] = e.ev.GetEventType()
		c.hashes[i] = e.hash
		c.raws[i] = e.raw
	}
	return c
}

func insertEvents(ctx context.Context, tx execer, runID string, count int64, writer uint64, evs []encodedEvent) error {
	seqs := make([]int64, len(evs))
	for i := range seqs {
		seqs[i] = count + int64(i) + 1
	}
	c := columnsOf(evs)
	_, err := tx.Exec(ctx, `
INSERT INTO executor.events (run_id, run_created_at, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
SELECT $1, (SELECT created_at FROM executor.runs WHERE run_id = $1), $9, * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bytea[])`,
		runID, seqs, c.insts, c.srcSeqs, c.ids, c.types, c.hashes, c.raws, int64(writer))
	return err
}

// Terminal is the outcome a run.terminal event reports.
type Terminal struct {
	State   string // succeeded | failed | cancelled
	Result  *executorv1.RunResult
	Code    string
	Message string
}

func finishRun(ctx context.Context, tx pgx.Tx, rules Rules, month time.Time, f Fence, t Terminal) error {
	if t.Result != nil && t.State == StateSucceeded {
		if err := governedWait(ctx, tx, rules, f.RunID, t.Result); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	lost := false
	spent := &settled{month: month}
	if err := queueFinish(b, f, t, 0, &lost, spent); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if lost {
		return ErrLeaseLost(f)
	}
	return crossBudget(ctx, tx, rules, spent)
}

// queueFinish queues the statements that finish a run with t (its
// governed wait, if any, already applied to t.Result): its coordinator,
// fenced (no row sets *lost: the lease is lost, the caller rolls back),
// and its state and result, with the rows filed beside it (added to its
// event count).
func queueFinish(b *pgx.Batch, f Fence, t Terminal, rows int, lost *bool, spent *settled) error {
	return queueFinishAs(b, f, t, rows, lost, spent, false)
}

// finishGuardedSQL is the run's fenced coordinator update that fails
// (division by zero, isFenceGuard) when the fence does not hold, so that a
// COMMIT pipelined behind it is skipped with the rest of its batch.
const finishGuardedSQL = `
WITH c AS (
  UPDATE executor.coordinators SET phase = $4, lease_expires_at = now()
   WHERE run_id = $1 AND lease_owner = $2 AND attempt = $3 AND phase = 'observed'
  RETURNING 1)
SELECT 1 / count(*)::int FROM c`

// isFenceGuard reports whether err is finishGuardedSQL's refusal: the
// fence did not hold at the run's finish.
func isFenceGuard(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22012"
}

// queueFinishAs is queueFinish; guarded, a lost fence fails the batch
// (finishGuardedSQL) instead of setting *lost, for a batch that commits.
func queueFinishAs(b *pgx.Batch, f Fence, t Terminal, rows int, lost *bool, spent *settled, guarded bool) error {
	var (
		result                      []byte
		usageIn, usageCached, usOut *int64
		costUSD                     *float64
	)
	if t.Result != nil {
		// The run's usage and cost are columns of the run (migration
		// 00011), not part of the stored result.
		stored := proto.Clone(t.Result).(*executorv1.RunResult)
		if u := stored.GetUsage(); u != nil {
			in, cached, out := int64(u.GetInputTokens()), int64(u.GetCachedInputTokens()), int64(u.GetOutputTokens())
			usageIn, usageCached, usOut = &in, &cached, &out
		}
		costUSD = stored.CostUsd
		stored.Usage, stored.CostUsd = nil, nil
		var err error
		if result, err = marshalDet.Marshal(stored); err != nil {
			return err
		}
	}
	phase := PhaseCompleted
	if t.State == StateFailed {
		phase = PhaseTerminalFailure
	}
	if guarded {
		b.Queue(finishGuardedSQL, f.RunID, f.Owner, int64(f.Attempt), phase)
	} else {
		b.Queue(`
UPDATE executor.coordinators SET phase = $4, lease_expires_at = now()
 WHERE run_id = $1 AND lease_owner = $2 AND attempt = $3 AND phase = 'observed'`,
			f.RunID, f.Owner, int64(f.Attempt), phase).Exec(func(tag pgconn.CommandTag) error {
			*lost = tag.RowsAffected() == 0
			return nil
		})
	}
	b.Queue(`
UPDATE executor.runs SET state = $2, result = $3, failure_code = nullif($4, ''), failure_message = nullif($5, ''),
       plan = coalesce(nullif($6, ''), plan),
       usage_input_tokens = $7, usage_cached_input_tokens = $8, usage_output_tokens = $9, cost_usd = $10,
       event_count = event_count + $11, ended_at = now(), updated_at = now()
 WHERE run_id = $1`, f.RunID, t.State, result, t.Code, t.Message, t.Result.GetPlan(), usageIn, usageCached, usOut, costUSD, rows)
	if costUSD != nil && *costUSD > 0 {
		// The company's spend of the month (SPEC Q2), once.
		queueSettle(b, f.RunID, spent)
	}
	return nil
}

// FailRun ends a run the executor itself must fail (the runner could not
// deliver a terminal event): it appends a control-plane run.terminal event so
// every run's stream ends with exactly one, and records the failure, fenced.
func (s *Store) FailRun(ctx context.Context, f Fence, code, message string) error {
	return s.failRun(ctx, f, code, message, nil)
}

func (s *Store) failRun(ctx context.Context, f Fence, code, message string, recovery []byte) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		count, err := lockFenced(ctx, tx, f)
		if err != nil {
			return err
		}
		var termCount int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM executor.events WHERE run_id = $1 AND event_type = 'run.terminal'`,
			f.RunID).Scan(&termCount); err != nil {
			return err
		}
		if termCount == 0 {
			if err := appendControlEvent(ctx, tx, f.RunID, count, f.Attempt, EventTerminal, &prpv1.RunTerminal{
				TurnTerminalState: "failed", RunTerminalState: StateFailed, Code: code, Message: message,
			}); err != nil {
				return err
			}
		}
		t := Terminal{State: StateFailed, Code: code, Message: message,
			Result: &executorv1.RunResult{TurnTerminalState: "failed", RunTerminalState: StateFailed}}
		if err := finishRun(ctx, tx, s.rules, s.Month(), f, t); err != nil {
			return err
		}
		if recovery != nil {
			if _, err := tx.Exec(ctx, `UPDATE executor.runs SET recovery = $2 WHERE run_id = $1`, f.RunID, recovery); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, EventsChannel, f.RunID)
		return err
	})
	if err == nil {
		s.eventsCommitted(f.RunID, nil)
	}
	return err
}

// StoredEvent is a persisted event with its run-local cursor.
type StoredEvent struct {
	Seq   uint64
	Event *prpv1.Event
	// Result is, on a run.terminal EventsAfter read, the run's result as
	// GetRun returns it, read in the same statement (the terminal event
	// and the result are committed together); nil otherwise, or when the
	// run has none.
	Result *executorv1.RunResult
}

// EventsAfter returns up to limit events of a run with seq > after, in
// order; the run's run.terminal comes with the run's result (so that a
// watcher sends it without reading the run again, SPEC P4).
func (s *Store) EventsAfter(ctx context.Context, runID string, after uint64, limit int) ([]StoredEvent, error) {
	rows, err := s.pool.Query(ctx, `SELECT e.seq, e.event, `+resultColumns+`
  FROM executor.events e LEFT JOIN executor.runs r ON e.event_type = 'run.terminal' AND r.run_id = e.run_id
 WHERE e.run_id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3`,
		runID, int64(after), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []StoredEvent
	for rows.Next() {
		var (
			seq                            int64
			raw, result                    []byte
			usageIn, usageCached, usageOut *int64
			costUSD                        *float64
		)
		if err := rows.Scan(&seq, &raw, &result, &usageIn, &usageCached, &usageOut, &costUSD); err != nil {
			return nil, err
		}
		ev := &prpv1.Event{}
		if err := proto.Unmarshal(raw, ev); err != nil {
			return nil, err
		}
		res, err := decodeResult(result, usageIn, usageCached, usageOut, costUSD)
		if err != nil {
			return nil, err
		}
		out = append(out, StoredEvent{Seq: uint64(seq), Event: ev, Result: res})
	}
	return out, rows.Err()
}

// HighestContiguousSourceSeq returns the largest n such that every source
// seq in (floor, n] of the instance is stored (for any run), starting from
// floor (the runner's own acknowledged cursor).
func (s *Store) HighestContiguousSourceSeq(ctx context.Context, instance string, floor uint64) (uint64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `
WITH s AS (
  SELECT source_seq, source_seq - row_number() OVER (ORDER BY source_seq) AS grp
    FROM executor.events WHERE source_instance_id = $1 AND source_seq > $2)
SELECT coalesce(max(source_seq), $2) FROM s WHERE grp = $2`, instance, int64(floor)).Scan(&n)
	return uint64(n), err
}

// encodeEvents marshals each event deterministically (the stored bytes)
// and hashes it (payload_sha256), into one shared buffer.
func encodeEvents(events []*prpv1.Event) ([]encodedEvent, error) {
	out := make([]encodedEvent, len(events))
	sums := make([]byte, sha256.Size*len(events))
	buf := make([]byte, 0, 512*len(events))
	for i, ev := range events {
		start := len(buf)
		var err error
		if buf, err = marshalDet.MarshalAppend(buf, ev); err != nil {
			return nil, err
		}
		raw := buf[start:len(buf):len(buf)]
		sum := sums[i*sha256.Size : (i+1)*sha256.Size : (i+1)*sha256.Size]
		h := sha256.Sum256(raw)
		copy(sum, h[:])
		out[i] = encodedEvent{ev: ev, raw: raw, hash: sum}
	}
	return out, nil
}

// fastEligible reports whether a batch can take the one-statement path: all
// events of the fenced run, in strictly increasing source order per
// instance, none that changes the run's outcome or process facts.
func fastEligible(f Fence, evs []encodedEvent, rules Rules) bool {
	if len(evs) == 0 {
		return false
	}
	// The last source seq per instance; a batch rarely has more than one.
	type last struct {
		inst string
		seq  uint64
	}
	var lasts []last
next:
	for _, e := range evs {
		ev := e.ev
		if ev.GetRunId() != f.RunID || ev.GetEventType() == EventTerminal || ev.GetEventType() == EventHarnessReady ||
			ev.GetEventType() == prp.EventRunPlanUpdated || rules.Decides(ev.GetEventType()) {
			return false
		}
		inst, seq := ev.GetSourceInstanceId(), ev.GetSourceSeq()
		for i := range lasts {
			if lasts[i].inst == inst {
				if seq <= lasts[i].seq {
					return false
				}
				lasts[i].seq = seq
				continue next
			}
		}
		lasts = append(lasts, last{inst, seq})
	}
	return true
}

// appendFastSQL appends a batch of the fenced run in one statement, one
// round trip, one commit. While the fence holds, it bumps the run's event
// count by the batch size (the UPDATE locks the run row, which serialises
// the run's appends, and returns the count the batch's run-local seqs
// follow) and inserts the batch; EventsChannel is notified after the commit
// (notifyAfter, beside the caller). A batch with an
// event already stored under its (run, source instance, source seq) fails
// on the events unique key, so the statement writes nothing; the caller
// then takes the careful path. When the fence does not hold, nothing is
// written and no row is counted.
const appendFastSQL = `
WITH fence AS (
  UPDATE executor.runs r SET event_count = r.event_count + $10, updated_at = now()
    FROM executor.coordinators c
   WHERE r.run_id = $1 AND c.run_id = r.run_id AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'
  RETURNING r.event_count - $10 AS base, r.created_at),
ins AS (
  INSERT INTO executor.events (run_id, run_created_at, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
  SELECT $1, fence.created_at, $3, fence.base + k.ord, k.source_instance_id, k.source_seq, k.source_event_id, k.event_type, k.payload_sha256, k.event
    FROM fence, unnest($4::text[], $5::bigint[], $6::text[], $7::text[], $8::bytea[], $9::bytea[]) WITH ORDINALITY
         AS k(source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, ord)
  RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ins), coalesce((SELECT base FROM fence), 0)`

// eventsSourceKey is the events unique key on (run, source instance,
// source seq): a violation means the batch replays stored events. Each
// partition of a partitioned events table has its own (partitionIndex).
const eventsSourceKey = "events_run_id_source_instance_id_source_seq_key"

// IsEventsSourceKey reports whether constraint is the events' unique key
// on (run, source instance, source seq), of the table or of a partition.
func IsEventsSourceKey(constraint string) bool {
	return constraint == eventsSourceKey || isPartitionIndex(constraint, partitionSourceKey)
}

// IsOneTerminal reports whether constraint is the unique index that keeps
// one run.terminal per run, of the table or of a partition.
func IsOneTerminal(constraint string) bool {
	return constraint == ConstraintOneTerminal || isPartitionIndex(constraint, partitionOneTerminal)
}

func (s *Store) appendFast(ctx context.Context, f Fence, evs []encodedEvent) (AppendResult, bool, error) {
	n := len(evs)
	c := columnsOf(evs)
	var fence, ins, base int64
	err := s.pool.QueryRow(ctx, appendFastSQL, f.RunID, f.Owner, int64(f.Attempt),
		c.insts, c.srcSeqs, c.ids, c.types, c.hashes, c.raws, int64(n)).Scan(&fence, &ins, &base)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" && IsEventsSourceKey(pgErr.ConstraintName) {
		return AppendResult{}, false, nil
	}
	if err != nil {
		return AppendResult{}, false, err
	}
	if fence == 0 {
		return AppendResult{}, false, ErrLeaseLost(f)
	}
	if ins != int64(n) {
		return AppendResult{}, false, fmt.Errorf("store: fast append of %d events inserted %d", n, ins)
	}
	if s.committed != nil {
		stored := make([]StoredEvent, n)
		for i, e := range evs {
			stored[i] = StoredEvent{Seq: uint64(base) + uint64(i) + 1, Event: e.ev}
		}
		s.committed(f.RunID, stored)
	}
	s.notifyAfter(EventsChannel, f.RunID)
	res := AppendResult{Inserted: n}
	for _, e := range evs {
		res.TurnStarted = res.TurnStarted || e.ev.GetEventType() == prp.EventTurnStarted && e.ev.GetRunId() == f.RunID
	}
	return res, true, nil
}

// acking is what a run's terminal commit needs to acknowledge the
// cancellation intents dispatched to its runner (AppendEventsAcking): the
// intents, and the run's cancellation record, read in the append's first
// batch, after the run's row was locked (no other writer changes it
// before the commit).
type acking struct {
	intents []string
	raw     []byte
	hook    func(runID string) error // Hooks.BeforeCancellationAck
}

// cancellationRecordSQL reads a run's cancellation record (arg: run).
const cancellationRecordSQL = `SELECT result_metadata -> 'nativeCancellation' FROM executor.runs WHERE run_id = $1`

// ackWrite is the acknowledgement queueAcks queued: intent's writes, in a
// savepoint begun once begun is true (the batch got that far).
type ackWrite struct {
	intent string
	begun  bool
	// rec is the record acknowledged (written here, or found so), nil
	// for none.
	rec *cancellationJSON
}

// queueAcks acknowledges ack's intents as acknowledgeCancellation would,
// one after the other, inside the terminal's transaction (whose fenced
// coordinator update precedes them, so the fence acknowledgeCancellation
// checks holds): an intent the record is not pending for is acknowledged
// with no write; the one it is pending for has its writes queued on b
// (the record, its activity, the coordinator's mirror) under a savepoint,
// so that a failure of theirs is rolled back alone (fileFenced); a record
// that does not parse, or a BeforeCancellationAck hook that fails,
// acknowledges nothing of what it concerns — as the savepoint per intent
// did.
func queueAcks(ctx context.Context, b *pgx.Batch, f Fence, ack *acking, res *AppendResult) *ackWrite {
	rec, err := parseCancellation(ack.raw)
	if err != nil {
		return &ackWrite{}
	}
	w := &ackWrite{}
	var writes *pgx.Batch
	for _, intent := range ack.intents {
		if rec == nil || rec.IntentID != intent || rec.DispatchState == "acknowledged" {
			res.Acknowledged = append(res.Acknowledged, intent)
			if rec != nil && rec.IntentID == intent && rec.DispatchState == "acknowledged" {
				w.rec = rec
			}
			continue
		}
		if ack.hook != nil && ack.hook(f.RunID) != nil {
			continue
		}
		next := *rec
		next.DispatchState, next.Dispatched = "acknowledged", true
		next.AcknowledgementAuditID = newID("activity-")
		wb := &pgx.Batch{}
		if insertActivity(ctx, queued{wb}, next.AcknowledgementAuditID, f.Owner, actionCancellationAcknowledged, &next) != nil ||
			mergeCancellation(ctx, queued{wb}, &next) != nil {
			continue
		}
		rec, writes, w.intent, w.rec = &next, wb, intent, &next
		res.Acknowledged = append(res.Acknowledged, intent)
	}
	if writes == nil {
		return &ackWrite{rec: w.rec}
	}
	b.Queue(`SAVEPOINT acknowledgement`).Exec(func(pgconn.CommandTag) error {
		w.begun = true
		return nil
	})
	b.QueuedQueries = append(b.QueuedQueries, writes.QueuedQueries...)
	b.Queue(`RELEASE SAVEPOINT acknowledgement`)
	return w
}
