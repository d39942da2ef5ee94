package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/synctrace"
)

// CancelChannel announces a run whose cancellation needs dispatching; the
// payload is the run id. Notified on commit, so listeners see the intent only
// once it is durable.
const CancelChannel = "tether_run_cancel"

// CancellationSchema names the durable cancellation record.
const CancellationSchema = "tether.native-cancellation.v1"

// Hooks let tests inject faults at exact points of the store's work.
type Hooks struct {
	// BeforeCancellationAck runs inside the acknowledgement transaction;
	// an error aborts it (the record stays pending).
	BeforeCancellationAck func(runID string) error
}

// SetHooks installs test hooks.
func (s *Store) SetHooks(h Hooks) { s.hooks = h }

// cancellationJSON is the record as stored in runs.result_metadata under
// "nativeCancellation" (camelCase, like the reference record).
type cancellationJSON struct {
	Schema                 string   `json:"schema"`
	IntentID               string   `json:"intentId"`
	IntentAuditID          string   `json:"intentAuditId"`
	CompanyID              string   `json:"companyId"`
	RunID                  string   `json:"runId"`
	IssueID                string   `json:"issueId"`
	Scope                  string   `json:"scope"`
	ReasonCode             string   `json:"reasonCode"`
	Reason                 string   `json:"reason,omitempty"`
	RequestID              string   `json:"requestId,omitempty"`
	Effects                []string `json:"effects"`
	DispatchState          string   `json:"dispatchState"`
	Dispatched             bool     `json:"dispatched"`
	DecisionID             *string  `json:"decisionId"`
	AcknowledgementAuditID string   `json:"acknowledgementAuditId,omitempty"`
}

func (c *cancellationJSON) proto() *executorv1.Cancellation {
	p := &executorv1.Cancellation{
		Schema: c.Schema, IntentId: c.IntentID, IntentAuditId: c.IntentAuditID, CompanyId: c.CompanyID,
		RunId: c.RunID, IssueId: c.IssueID, Scope: c.Scope, ReasonCode: c.ReasonCode, Effects: c.Effects,
		DispatchState: c.DispatchState, Dispatched: c.Dispatched, AcknowledgementAuditId: c.AcknowledgementAuditID,
		Reason: c.Reason, RequestId: c.RequestID,
	}
	if c.DecisionID != nil {
		p.DecisionId = *c.DecisionID
	}
	return p
}

func decodeCancellation(b []byte) (*executorv1.Cancellation, error) {
	c, err := parseCancellation(b)
	if c == nil || err != nil {
		return nil, err
	}
	return c.proto(), nil
}

func parseCancellation(b []byte) (*cancellationJSON, error) {
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var c cancellationJSON
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Cancellation scopes and their effects.
var cancellationEffects = map[string][]string{
	"run":   {"interrupt_provider_turn", "release_run_resources"},
	"turn":  {"interrupt_provider_turn"},
	"issue": {"interrupt_provider_turn", "release_run_resources"},
}

// CancelRequest asks to cancel a run.
type CancelRequest struct {
	RunID, Scope, Reason, RequestID, Actor string
}

// CancelOutcome reports what a cancel call found or did.
type CancelOutcome struct {
	// Active is false when the run had already ended without a cancellation.
	Active bool
	Record *executorv1.Cancellation
	// NeedsDispatch is true while a live driver still has to tell the
	// provider (the record is pending).
	NeedsDispatch bool
}

func isTerminalState(state string) bool {
	return state == StateSucceeded || state == StateFailed || state == StateCancelled
}

// RecordCancellation records a durable cancellation intent (E6) in one
// transaction holding the run row and the coordinator row (FOR UPDATE, in
// that order): the record is bound to the run's own issue id, merged into the
// run's result metadata without losing other keys, and audited
// (native.cancellation_intent_recorded). Listeners on CancelChannel learn of
// it on commit. A run nobody drives (queued, or waiting for a retry) is
// cancelled on the spot and the record acknowledged with dispatched=false. A
// repeated call changes nothing; a run that ended without a cancellation is
// Active=false. No coordinator → native_cancellation_coordinator_missing and
// nothing is written.
//
// Its statements are pipelined (SPEC P2: the commit is on every
// cancellation's path): BEGIN with both rows' locks in one round trip; the
// activity, the record's merge and the notification of a new record in a
// second; COMMIT — three round trips where the statements one by one took
// eight. A run nobody drives takes a few more (its terminal's append).
func (s *Store) RecordCancellation(ctx context.Context, req CancelRequest) (CancelOutcome, error) {
	defer synctrace.Begin("executor.cancel", req.RunID)()
	var (
		state, company, issue, phase string
		raw                          []byte
		count, attempt               int64
		noRun, noCoordinator         bool
	)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(`
SELECT state, company_id, issue_id, result_metadata -> 'nativeCancellation', event_count
  FROM executor.runs WHERE run_id = $1 FOR UPDATE`, req.RunID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&state, &company, &issue, &raw, &count)
		noRun = errors.Is(err, pgx.ErrNoRows)
		return noRowsOK(err)
	})
	b.Queue(`SELECT phase, attempt FROM executor.coordinators WHERE run_id = $1 FOR UPDATE`, req.RunID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&phase, &attempt)
		noCoordinator = errors.Is(err, pgx.ErrNoRows)
		return noRowsOK(err)
	})
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	// A no-op once committed; else it ends the transaction and hands the
	// connection back.
	defer func() { _ = tx.Rollback(ctx) }()
	if err := br.Close(); err != nil {
		return CancelOutcome{}, err
	}
	if noRun {
		return CancelOutcome{}, ErrRunNotFound(req.RunID)
	}
	if noCoordinator {
		return CancelOutcome{}, failure.New(codes.FailedPrecondition, failure.NativeCancellationCoordinatorMissing,
			"run %s has no coordinator; refusing to record a cancellation", req.RunID)
	}
	out, err := recordCancellation(ctx, tx, req, state, company, issue, phase, raw, count, attempt)
	if err != nil {
		return CancelOutcome{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return CancelOutcome{}, err
	}
	return out, nil
}

// recordCancellation is RecordCancellation's work once both rows are
// locked (what they hold given).
func recordCancellation(ctx context.Context, tx pgx.Tx, req CancelRequest, state, company, issue, phase string, raw []byte, count, attempt int64) (CancelOutcome, error) {
	var out CancelOutcome
	rec, err := parseCancellation(raw)
	if err != nil {
		return out, err
	}
	if rec != nil {
		out.Active, out.Record = true, rec.proto()
		out.NeedsDispatch = rec.DispatchState == "pending"
		if out.NeedsDispatch {
			// Nudge the driver: it re-dispatches by the same command id,
			// which the runner executes at most once.
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, CancelChannel, req.RunID)
		}
		return out, err
	}
	if isTerminalState(state) {
		return out, nil // not active: nothing to cancel
	}
	scope := req.Scope
	rec = &cancellationJSON{
		Schema: CancellationSchema, IntentID: newID("native-cancellation:"), IntentAuditID: newID("activity-"),
		CompanyID: company, RunID: req.RunID, IssueID: issue, Scope: scope,
		ReasonCode: "cancellation_" + scope + "_requested", Reason: req.Reason, RequestID: req.RequestID,
		Effects: cancellationEffects[scope], DispatchState: "pending",
	}
	// The writes go in one batch.
	w := &pgx.Batch{}
	q := queued{w}
	if err := insertActivity(ctx, q, rec.IntentAuditID, req.Actor, actionCancellationIntentRecorded, rec); err != nil {
		return out, err
	}
	driven := phase == PhaseObserved
	if !driven {
		rec.DispatchState = "acknowledged"
		rec.AcknowledgementAuditID = newID("activity-")
		if err := insertActivity(ctx, q, rec.AcknowledgementAuditID, req.Actor, actionCancellationAcknowledged, rec); err != nil {
			return out, err
		}
	}
	if err := mergeCancellation(ctx, q, rec); err != nil {
		return out, err
	}
	if driven {
		// Inside the transaction: a driver on another replica learns of
		// the record on its commit (no notification is lost to a crash
		// after it).
		w.Queue(`SELECT pg_notify($1, $2)`, CancelChannel, req.RunID)
	}
	if err := tx.SendBatch(ctx, w).Close(); err != nil {
		return out, err
	}
	if !driven {
		// Nobody holds a lease: the run's terminal is written under
		// its coordinator's attempt (0 if it was never claimed), the
		// fence the database checks (R9), with both rows locked.
		if err := appendControlEvent(ctx, tx, req.RunID, count, uint64(attempt), EventTerminal, &prpv1.RunTerminal{
			TurnTerminalState: "cancelled", RunTerminalState: StateCancelled,
			Code: "run_cancelled", Message: "cancelled before a runner took it: " + req.Reason,
		}); err != nil {
			return out, err
		}
		if _, err := tx.Exec(ctx, `UPDATE executor.coordinators SET phase = 'completed', lease_owner = NULL, lease_expires_at = NULL WHERE run_id = $1`, req.RunID); err != nil {
			return out, err
		}
		if _, err := tx.Exec(ctx, `UPDATE executor.runs SET state = 'cancelled', ended_at = now(), updated_at = now() WHERE run_id = $1`, req.RunID); err != nil {
			return out, err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, EventsChannel, req.RunID); err != nil {
			return out, err
		}
	}
	out.Active, out.Record, out.NeedsDispatch = true, rec.proto(), driven
	return out, nil
}

func mergeCancellation(ctx context.Context, tx execer, rec *cancellationJSON) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err = tx.Exec(ctx, `
UPDATE executor.runs SET result_metadata = result_metadata || jsonb_build_object('nativeCancellation', $2::jsonb), updated_at = now()
 WHERE run_id = $1`, rec.RunID, b); err != nil {
		return err
	}
	// The claim reads the coordinator only: mirror the dispatch state there.
	_, err = tx.Exec(ctx, `UPDATE executor.coordinators SET cancel_state = $2 WHERE run_id = $1`, rec.RunID, rec.DispatchState)
	return err
}

func insertActivity(ctx context.Context, tx execer, id, actor, action string, rec *cancellationJSON) error {
	if actor == "" {
		actor = "system"
	}
	details, err := json.Marshal(map[string]any{"intentId": rec.IntentID, "scope": rec.Scope, "reasonCode": rec.ReasonCode, "reason": rec.Reason})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `
INSERT INTO executor.activities (activity_id, actor, action, company_id, issue_id, run_id, details, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())`, id, actor, action, rec.CompanyID, rec.IssueID, rec.RunID, details)
	return err
}

// Cancellation returns the run's cancellation record, or nil.
func (s *Store) Cancellation(ctx context.Context, runID string) (*executorv1.Cancellation, error) {
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT result_metadata -> 'nativeCancellation' FROM executor.runs WHERE run_id = $1`, runID).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrRunNotFound(runID)
	}
	if err != nil {
		return nil, err
	}
	return decodeCancellation(raw)
}

// AcknowledgeCancellation records, under the driver's fence (owner and
// attempt; the run may already have ended), that the provider was told to
// stop: the record becomes acknowledged with dispatched=true and a second
// audit activity (native.cancellation_acknowledged). It holds the run and
// coordinator rows. Acknowledging twice is a no-op.
func (s *Store) AcknowledgeCancellation(ctx context.Context, f Fence, intentID string) error {
	defer synctrace.Begin("executor.cancel_ack", f.RunID)()
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.acknowledgeCancellation(ctx, tx, f, intentID) })
}

// acknowledgeCancellation is AcknowledgeCancellation's transaction.
func (s *Store) acknowledgeCancellation(ctx context.Context, tx pgx.Tx, f Fence, intentID string) error {
	var raw []byte
	err := tx.QueryRow(ctx, `SELECT result_metadata -> 'nativeCancellation' FROM executor.runs WHERE run_id = $1 FOR UPDATE`, f.RunID).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrRunNotFound(f.RunID)
	}
	if err != nil {
		return err
	}
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM executor.coordinators WHERE run_id = $1 AND lease_owner = $2 AND attempt = $3 FOR UPDATE`,
		f.RunID, f.Owner, int64(f.Attempt)).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost(f)
	}
	if err != nil {
		return err
	}
	rec, err := parseCancellation(raw)
	if err != nil {
		return err
	}
	if rec == nil || rec.IntentID != intentID || rec.DispatchState == "acknowledged" {
		return nil
	}
	rec.DispatchState, rec.Dispatched = "acknowledged", true
	rec.AcknowledgementAuditID = newID("activity-")
	if err := insertActivity(ctx, tx, rec.AcknowledgementAuditID, f.Owner, actionCancellationAcknowledged, rec); err != nil {
		return err
	}
	if err := mergeCancellation(ctx, tx, rec); err != nil {
		return err
	}
	if s.hooks.BeforeCancellationAck != nil {
		if err := s.hooks.BeforeCancellationAck(f.RunID); err != nil {
			return failure.Wrap(err, codes.Unavailable, failure.PostDispatchDBFailure,
				"recording the cancellation acknowledgement failed: %v", err)
		}
	}
	return nil
}

// Activity is one audit entry.
type Activity struct {
	ID, Actor, Action, CompanyID, IssueID, RunID string
	CreatedAt                                    time.Time
}

// Activities lists a run's audit trail, oldest first.
func (s *Store) Activities(ctx context.Context, runID string) ([]Activity, error) {
	rows, err := s.pool.Query(ctx, `SELECT activity_id, actor, action, company_id, issue_id, run_id, created_at
  FROM executor.activities WHERE run_id = $1 ORDER BY created_at, activity_id`, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Activity
	for rows.Next() {
		var a Activity
		if err := rows.Scan(&a.ID, &a.Actor, &a.Action, &a.CompanyID, &a.IssueID, &a.RunID, &a.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
