package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"
)

// ControlInstance is the source instance of events the executor itself
// appends to a run (retry notices, executor-side terminals).
const ControlInstance = "executor:control"

// BindingDigest is the hex sha256 of the run's governance binding; a claim
// refuses a run whose binding changed since submission.
func BindingDigest(in *prpv1.ExecutionInput) string {
	b, _ := marshalDet.Marshal(in.GetBinding())
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// NewID returns prefix followed by 24 random hex digits.
func NewID(prefix string) string { return newID(prefix) }

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Claim refusal codes (E7).
const (
	actionCancellationIntentRecorded = ActionCancellationIntent
	actionCancellationAcknowledged   = ActionCancellationAck
)

// Lease TTL bounds.
const (
	MinLeaseTTL     = time.Second
	MaxLeaseTTL     = 20 * time.Minute
	DefaultLeaseTTL = 60 * time.Second
)

// CheckLeaseTTL refuses a TTL outside 1 s … 20 min.
func CheckLeaseTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL || ttl > MaxLeaseTTL {
		return failure.New(codes.InvalidArgument, failure.NativeSessionLeaseTTLInvalid, "lease TTL %s is outside %s..%s", ttl, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

// DeadProof says the caller checked, on this host, that the controller
// recorded for (owner, attempt) is dead. ClaimRun accepts it only when the
// coordinator still records exactly that controller.
type DeadProof struct {
	Owner      string
	Attempt    uint64
	Controller Controller
}

// ClaimRun claims one named run, refusing with the exact E7 codes, in one
// transaction holding the run and coordinator rows: a durable result →
// native_result_pending_finalization; a pending or acknowledged cancellation
// → native_cancellation_pending_recovery; a binding that changed since
// submission → native_execution_binding_changed; another unexpired owner →
// native_finalization_lease_busy (unless proof shows its controller process
// on this host is dead). Nothing is written when the claim is refused.
func (s *Store) ClaimRun(ctx context.Context, runID, owner string, ttl time.Duration, ctl Controller,
	binding *prpv1.Binding, proof *DeadProof) (*Claim, error) {
	if err := CheckLeaseTTL(ttl); err != nil {
		return nil, err
	}
	var c *Claim
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			raw             []byte
			held            bool
			state           string
			phase, bdigest  string
			resultID, lease *string
			attempt         uint64
			expired         bool
			ctlBoot         *string
			ctlPID          *int32
			ctlTicks        *int64
			ctlNS           *string
		)
		var (
			traceParent string
			submittedAt time.Time
		)
		err := tx.QueryRow(ctx, `SELECT input, state, `+cancellationHeld("r")+`, coalesce(trace_parent, ''), created_at FROM executor.runs r WHERE run_id = $1 FOR UPDATE`, runID).
			Scan(&raw, &state, &held, &traceParent, &submittedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrRunNotFound(runID)
		}
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `
SELECT phase, binding_digest, result_id, lease_owner, attempt, coalesce(lease_expires_at <= now(), true),
       controller_boot_id, controller_pid, controller_start_ticks, controller_pid_ns
  FROM executor.coordinators WHERE run_id = $1 FOR UPDATE`, runID).
			Scan(&phase, &bdigest, &resultID, &lease, &attempt, &expired, &ctlBoot, &ctlPID, &ctlTicks, &ctlNS)
		if errors.Is(err, pgx.ErrNoRows) {
			return failure.New(codes.FailedPrecondition, failure.NativeRunCoordinatorMissing, "run %s has no coordinator", runID)
		}
		if err != nil {
			return err
		}
		switch {
		case resultID != nil || phase == PhaseResultPersisted || phase == "workspace_finalizing":
			return failure.New(codes.FailedPrecondition, failure.NativeResultPendingFinalization,
				"run %s already holds a durable result; it is never driven again", runID)
		case held:
			return failure.New(codes.FailedPrecondition, failure.NativeCancellationPendingRecovery,
				"run %s holds a durable cancellation; it is never driven again", runID)
		case phase == PhaseCompleted || phase == PhaseTerminalFailure:
			return failure.New(codes.FailedPrecondition, failure.NativeRunAlreadyTerminal, "run %s already ended (%s)", runID, phase)
		}
		in := &prpv1.ExecutionInput{}
		if err := proto.Unmarshal(raw, in); err != nil {
			return err
		}
		if binding != nil {
			want := BindingDigest(&prpv1.ExecutionInput{Binding: binding})
			if bdigest != "" && want != bdigest {
				return failure.New(codes.FailedPrecondition, failure.NativeExecutionBindingChanged,
					"run %s was submitted under another binding", runID)
			}
		}
		if lease != nil && *lease != owner && !expired {
			proven := proof != nil && proof.Owner == *lease && proof.Attempt == attempt &&
				ctlBoot != nil && *ctlBoot == proof.Controller.BootID &&
				ctlPID != nil && int(*ctlPID) == proof.Controller.PID &&
				ctlTicks != nil && uint64(*ctlTicks) == proof.Controller.StartTicks &&
				ctlNS != nil && *ctlNS != "" && *ctlNS == proof.Controller.PIDNamespace
			if !proven {
				return failure.New(codes.Aborted, failure.NativeFinalizationLeaseBusy,
					"run %s is leased by %s (attempt %d) until its lease expires", runID, *lease, attempt)
			}
		}
		var gen uint64
		var exp time.Time
		var sc string
		err = tx.QueryRow(ctx, `
UPDATE executor.coordinators
   SET attempt = attempt + 1, lease_owner = $2, lease_expires_at = now() + $3 * interval '1 microsecond', phase = 'observed',
       controller_boot_id = $4, controller_pid = $5, controller_start_ticks = $6, started_at = coalesce(started_at, now()),
       controller_addr = nullif($8, ''), controller_pid_ns = nullif($9, '')
 WHERE run_id = $1 AND attempt = $7
RETURNING attempt, lease_expires_at, turn_generation, session_scope`, runID, owner, ttl.Microseconds(),
			ctl.BootID, ctl.PID, int64(ctl.StartTicks), int64(attempt), ctl.Addr, ctl.PIDNamespace).Scan(&attempt, &exp, &gen, &sc)
		if err != nil {
			return err
		}
		c = &Claim{Fence: Fence{RunID: runID, Owner: owner, Attempt: attempt}, Input: in, SessionScope: sc, LeaseExpiresAt: exp, TurnGeneration: gen, TraceParent: traceParent, SubmittedAt: submittedAt}
		return nil
	})
	return c, err
}

// Held is a lease some controller holds, as a same-host successor sees it.
type Held struct {
	RunID      string
	Owner      string
	Attempt    uint64
	Controller Controller
}

// HeldOnHost lists unexpired leases of other owners whose controller ran on
// this boot and in this PID namespace (self's BootID and PIDNamespace), so
// the caller can check whether that process is dead. Controllers of another
// namespace — another container on the same host — are not listed: their
// pids mean nothing here.
func (s *Store) HeldOnHost(ctx context.Context, self Controller, exceptOwner string) ([]Held, error) {
	if self.BootID == "" || self.PIDNamespace == "" {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
SELECT run_id, lease_owner, attempt, coalesce(controller_pid, 0), coalesce(controller_start_ticks, 0)
  FROM executor.coordinators
 WHERE phase = 'observed' AND lease_expires_at > now() AND controller_boot_id = $1 AND controller_pid_ns = $2
   AND lease_owner <> $3`, self.BootID, self.PIDNamespace, exceptOwner)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Held
	for rows.Next() {
		var (
			h     Held
			pid   int32
			ticks int64
		)
		if err := rows.Scan(&h.RunID, &h.Owner, &h.Attempt, &pid, &ticks); err != nil {
			return nil, err
		}
		h.Controller = Controller{Identity: procid.Identity{BootID: self.BootID, PIDNamespace: self.PIDNamespace,
			PID: int(pid), StartTicks: uint64(ticks)}}
		out = append(out, h)
	}
	return out, rows.Err()
}

// ReleaseLease hands the lease of fence f back (SPEC F5): while exactly f
// holds it, it expires now, so any replica claims the run at once (as an
// expired lease: the next attempt resumes the same provider turn). The
// dispatchers are notified. It reports whether f still held the lease.
func (s *Store) ReleaseLease(ctx context.Context, f Fence) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE executor.coordinators SET lease_expires_at = now()
 WHERE run_id = $1 AND lease_owner = $2 AND attempt = $3 AND phase = 'observed' AND lease_expires_at > now()`,
		f.RunID, f.Owner, int64(f.Attempt))
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	s.notifyCommitted(ctx, RunsChannel, f.RunID)
	return true, nil
}

// FailureDecision is what a failed attempt leads to (see package recovery).
type FailureDecision struct {
	// Retry schedules another attempt at NextAttemptAt; otherwise terminal.
	Retry         bool
	NextAttemptAt time.Time
	Code, Message string
	Recovery      *executorv1.Recovery
}

// RecordFailure records a failed attempt under the fence. A retry releases
// the lease, bumps the turn generation (the retry starts a new provider
// turn), re-queues the run for NextAttemptAt and appends a run.retry_scheduled
// control event; a terminal failure ends the run with one run.terminal.
func (s *Store) RecordFailure(ctx context.Context, f Fence, d FailureDecision) error {
	defer synctrace.Begin("executor.failure", f.RunID)()
	rec, err := encodeRecovery(d.Recovery)
	if err != nil {
		return err
	}
	if !d.Retry {
		return s.failRun(ctx, f, d.Code, d.Message, rec)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		count, err := lockFenced(ctx, tx, f)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
UPDATE executor.coordinators SET phase = 'retryable_failure', next_attempt_at = $2, lease_owner = NULL,
       lease_expires_at = NULL, turn_generation = turn_generation + 1
 WHERE run_id = $1`, f.RunID, d.NextAttemptAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
UPDATE executor.runs SET state = 'queued', failure_code = $2, failure_message = $3, recovery = $4, updated_at = now()
 WHERE run_id = $1`, f.RunID, d.Code, d.Message, rec); err != nil {
			return err
		}
		if err := appendControlEvent(ctx, tx, f.RunID, count, f.Attempt, "run.retry_scheduled", &prpv1.RunRetryScheduled{
			Code: d.Code, Message: d.Message, Attempt: float64(f.Attempt),
			NextAttemptAt: d.NextAttemptAt.UTC().Format(time.RFC3339Nano),
		}); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, EventsChannel, f.RunID)
		return err
	})
}

// lockFenced locks the run row while the fence holds and returns its event
// count.
func lockFenced(ctx context.Context, tx pgx.Tx, f Fence) (int64, error) {
	var count int64
	err := scanFenced(tx.QueryRow(ctx, lockFencedSQL, f.RunID, f.Owner, int64(f.Attempt)), f, &count)
	return count, err
}

// lockFencedSQL is lockFenced's statement (args: run, owner, attempt).
const lockFencedSQL = `
SELECT r.event_count FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
 WHERE r.run_id = $1 AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'
   FOR UPDATE OF r`

// scanFenced reads lockFencedSQL's row into count: no row is a lost lease.
func scanFenced(row pgx.Row, f Fence, count *int64) error {
	err := row.Scan(count)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost(f)
	}
	return err
}

// controlPayload is a control event's payload with every field written,
// zero values too, as the previous release wrote them; a run.terminal's
// with the fields it sets (its usage and artifacts absent, not null).
func controlPayload(msg proto.Message) (*structpb.Struct, error) {
	if _, ok := msg.(*prpv1.RunTerminal); ok {
		return prp.Payload(msg)
	}
	return prp.PayloadAll(msg)
}

// appendControlEvent appends an executor-originated event to the run.
func appendControlEvent(ctx context.Context, tx pgx.Tx, runID string, count int64, writer uint64, typ string, payload proto.Message) error {
	var n int64
	if err := tx.QueryRow(ctx, controlCountSQL, runID, ControlInstance).Scan(&n); err != nil {
		return err
	}
	e, err := encodeControlEvent(runID, n+1, typ, payload)
	if err != nil {
		return err
	}
	if err := insertEvents(ctx, tx, runID, count, writer, []encodedEvent{e}); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE executor.runs SET event_count = event_count + 1 WHERE run_id = $1`, runID)
	return err
}

// encodeControlEvent is the run's control event of source seq seq (the
// count of its control events before it, plus one).
func encodeControlEvent(runID string, seq int64, typ string, payload proto.Message) (encodedEvent, error) {
	p, err := controlPayload(payload)
	if err != nil {
		return encodedEvent{}, err
	}
	ev := &prpv1.Event{
		Schema: "tether.prp.event.v1", SourceInstanceId: ControlInstance,
		SourceEventId: fmt.Sprintf("%s:%s:%d", runID, ControlInstance, seq), SourceSeq: uint64(seq),
		SourceKind: "control_plane", RunId: runID, EventType: typ, SchemaVersion: 1,
		EmittedAt: timestamppb.Now(), Payload: p,
	}
	raw, err := marshalDet.Marshal(ev)
	if err != nil {
		return encodedEvent{}, err
	}
	sum := sha256.Sum256(raw)
	return encodedEvent{ev: ev, raw: raw, hash: sum[:]}, nil
}

// controlCountSQL counts run $1's control events (their source seqs are
// 1..count).
const controlCountSQL = `SELECT count(*) FROM executor.events WHERE run_id = $1 AND source_instance_id = $2`

type recoveryJSON struct {
	Exhausted                 bool   `json:"exhausted"`
	IssueStatus               string `json:"issueStatus,omitempty"`
	RecoveryOwnerKind         string `json:"recoveryOwnerKind"`
	RecoveryOwnerAgentID      string `json:"recoveryOwnerAgentId,omitempty"`
	RecoveryActionCause       string `json:"recoveryActionCause"`
	SupersedeOnIdentityChange bool   `json:"supersedeOnIdentityChange"`
	NextAttemptAt             string `json:"nextAttemptAt,omitempty"`
}

func encodeRecovery(r *executorv1.Recovery) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	j := recoveryJSON{
		Exhausted: r.GetExhausted(), IssueStatus: r.GetIssueStatus(), RecoveryOwnerKind: r.GetRecoveryOwnerKind(),
		RecoveryOwnerAgentID: r.GetRecoveryOwnerAgentId(), RecoveryActionCause: r.GetRecoveryActionCause(),
		SupersedeOnIdentityChange: r.GetSupersedeOnIdentityChange(),
	}
	if r.GetNextAttemptAt() != nil {
		j.NextAttemptAt = r.GetNextAttemptAt().AsTime().UTC().Format(time.RFC3339Nano)
	}
	return json.Marshal(j)
}

func decodeRecovery(b []byte) (*executorv1.Recovery, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var j recoveryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, err
	}
	r := &executorv1.Recovery{
		Exhausted: j.Exhausted, IssueStatus: j.IssueStatus, RecoveryOwnerKind: j.RecoveryOwnerKind,
		RecoveryOwnerAgentId: j.RecoveryOwnerAgentID, RecoveryActionCause: j.RecoveryActionCause,
		SupersedeOnIdentityChange: j.SupersedeOnIdentityChange,
	}
	if j.NextAttemptAt != "" {
		if t, err := time.Parse(time.RFC3339Nano, j.NextAttemptAt); err == nil {
			r.NextAttemptAt = timestamppb.New(t)
		}
	}
	return r, nil
}

// ControllerAddr returns where the controller currently driving the run
// serves the executor API ("" when the run is not being driven); a run that
// ended is native_run_already_terminal (FailedPrecondition).
func (s *Store) ControllerAddr(ctx context.Context, runID string) (string, error) {
	var (
		addr  *string
		ended bool
		state string
	)
	err := s.pool.QueryRow(ctx, `
SELECT CASE WHEN c.phase = 'observed' AND c.lease_expires_at > now() THEN c.controller_addr END,
       r.ended_at IS NOT NULL, r.state
  FROM executor.coordinators c JOIN executor.runs r ON r.run_id = c.run_id WHERE c.run_id = $1`, runID).Scan(&addr, &ended, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrRunNotFound(runID)
	}
	if err != nil {
		return "", err
	}
	if ended {
		// Not a passing condition to retry: the run is over.
		return "", failure.Newf(failure.NativeRunAlreadyTerminal,
			"run %s already ended (%s): it has no live provider session", runID, state)
	}
	if addr == nil {
		return "", nil
	}
	return *addr, nil
}

// RuntimeRequestPending reports whether the run's provider asked
// (runtime_request.created) for requestID and nothing has settled it yet
// (resolved, expired or cancelled).
func (s *Store) RuntimeRequestPending(ctx context.Context, runID, requestID string) (bool, error) {
	rows, err := s.pool.Query(ctx, `
SELECT event FROM executor.events
 WHERE run_id = $1 AND event_type IN ('runtime_request.created', 'runtime_request.resolved', 'runtime_request.expired', 'runtime_request.cancelled')
 ORDER BY seq`, runID)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	pending := false
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return false, err
		}
		ev := &prpv1.Event{}
		if err := proto.Unmarshal(raw, ev); err != nil {
			return false, err
		}
		if RequestID(ev.GetPayload().GetFields()["requestId"]) != requestID {
			continue
		}
		pending = ev.GetEventType() == "runtime_request.created"
	}
	return pending, rows.Err()
}

// RequestID renders a JSON-RPC request id (a number, possibly 0, or a
// string) as a string.
func RequestID(v *structpb.Value) string {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64)
	}
	return ""
}

// PreviousInScope returns the run submitted just before runID in the same
// session scope (its id and input), or "" when there is none.
func (s *Store) PreviousInScope(ctx context.Context, runID string) (string, *prpv1.ExecutionInput, error) {
	var (
		id  string
		raw []byte
	)
	err := s.pool.QueryRow(ctx, previousInScopeSQL, runID).Scan(&id, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	in := &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, in); err != nil {
		return "", nil, err
	}
	return id, in, nil
}

// AppendControlEvent appends an executor-originated event to the run under
// its fence (e.g. session.closed with the warm supervision reason).
func (s *Store) AppendControlEvent(ctx context.Context, f Fence, typ string, payload proto.Message) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		count, err := lockFenced(ctx, tx, f)
		if err != nil {
			return err
		}
		if err := appendControlEvent(ctx, tx, f.RunID, count, f.Attempt, typ, payload); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, EventsChannel, f.RunID)
		return err
	})
}
