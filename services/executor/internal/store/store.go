// Package store owns the executor's SQL: runs, their coordinators (phase and
// fenced lease) and their events. Every write made on behalf of a lease is
// fenced in SQL by (run, owner, attempt); a stale attempt changes nothing.
package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/synctrace"
)

// Migrations holds the embedded, numbered goose migrations.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// EventsChannel is the LISTEN/NOTIFY channel announcing new events; the
// payload is the run id.
const EventsChannel = "tether_run_events"

// notifyCommitted announces payload on channel in a transaction of its own,
// after the write it announces has committed. A NOTIFY inside a writing
// transaction holds PostgreSQL's one notification-queue lock through that
// transaction's WAL flush, so notifying commits cannot share a flush: raw
// inserts of SubmitRun's rows by 32 clients fell from about 3,900/s to
// 1,000/s with a NOTIFY in each (tether-bench unary_submit). A transaction
// that only notifies writes no WAL and holds the lock for a moment.
//
// It is best effort: a notification lost to a crash (or an error) between
// the commit and this call is covered elsewhere — dispatchers also poll for
// due runs (-poll-interval), and a run's watchers read everything after
// their cursor on the run's next notification, which its run.terminal
// always sends (it is written with its NOTIFY in one transaction).
func (s *Store) notifyCommitted(ctx context.Context, channel, payload string) {
	// The write committed: announce it even when the caller gives up now.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
}

// RunsChannel announces newly submitted runs to dispatchers.
const RunsChannel = "tether_runs_due"

// Coordinator phases.
const (
	PhaseQueued          = "queued"
	PhaseObserved        = "observed"
	PhaseResultPersisted = "result_persisted"
	PhaseCompleted       = "completed"
)

// Run states as stored.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// EventTerminal is the event type that ends a run's event stream.
const EventTerminal = prp.EventRunTerminal

var marshalDet = proto.MarshalOptions{Deterministic: true}

// Store is the executor's PostgreSQL access.
type Store struct {
	pool  *pgxpool.Pool
	hooks Hooks
	// rules decide what the events a runner reports, and an interaction's
	// answer, write beside their rows (nil: errNoRules on such a write).
	rules Rules
	// committed, when set, learns of each commit that appended events to
	// a run (OnEventsCommitted).
	committed func(runID string, evs []StoredEvent)
	// clock is the store's clock for the current month (SetClock).
	clock func() time.Time
	// busy are the scopes SubmitClaim sends no first attach's reads for.
	busy busyScopes
	// notes sends the event appends' notifications after their commit
	// (notifyAfter).
	notes notifier
}

// OnEventsCommitted has fn called after each commit of this store that
// appended events to a run, before the commit is announced to other
// processes: with the events stored, in seq order, when the append knows
// them (its one-statement path), else nil. The executor wakes the run's
// watch feed with it (SPEC P4: no notification round trip between a local
// commit and the run's watchers). fn must not block; it may keep evs, read
// only. Set it before the store is used.
func (s *Store) OnEventsCommitted(fn func(runID string, evs []StoredEvent)) { s.committed = fn }

// eventsCommitted calls the OnEventsCommitted function, if any.
func (s *Store) eventsCommitted(runID string, evs []StoredEvent) {
	if s.committed != nil {
		s.committed(runID, evs)
	}
}

// GooseTable is the goose version table of the executor schema.
const GooseTable = "executor_goose_version"

// Schema is the executor schema's embedded migrations (`executor migrate`,
// SPEC L3).
var Schema = pgstore.Migrations{FS: Migrations, Dir: "migrations", Table: GooseTable}

// Migrate applies the embedded migrations to the database at dsn.
func Migrate(ctx context.Context, dsn string) error { return pgstore.Migrate(ctx, dsn, Schema) }

// CheckSchema fails with schema_outdated when the database at dsn lacks a
// migration this executor needs (started with -migrate=false, SPEC L3); a
// schema newer than this executor's passes.
func CheckSchema(ctx context.Context, dsn string) error {
	return pgstore.CheckCurrent(ctx, dsn, Schema, "executor migrate -database-url URL")
}

// MigrateDB applies the embedded migrations on an open database.
func MigrateDB(ctx context.Context, db *sql.DB) error { return pgstore.MigrateDB(ctx, db, Schema) }

// DefaultMaxConns is the executor's main pool size: leases, event appends,
// claims and unary calls of the runs a replica drives (64 by default) share it, each
// holding a connection only for one statement or transaction; 4 per core,
// at least 8 (pgx's own default is 4 on a 2-core host).
func DefaultMaxConns() int { return max(8, 4*runtime.NumCPU()) }

// Open connects a pool to dsn. rules decide what the events a runner
// reports, and an interaction's answer, write beside their rows; a store
// that only reads (tools, tetherctl audit) may pass nil, and a write that
// decides through them then fails.
func Open(ctx context.Context, dsn string, rules Rules, opts ...pgstore.Option) (*Store, error) {
	pool, err := pgstore.Open(ctx, dsn, opts...)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, rules: rules}, nil
}

// New wraps an existing pool (rules as in Open).
func New(pool *pgxpool.Pool, rules Rules) *Store { return &Store{pool: pool, rules: rules} }

// Pool exposes the pool (for LISTEN connections and benchmarks).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close sends the notifications still pending (notifyAfter), then closes
// the pool.
func (s *Store) Close() {
	s.FlushNotifications()
	s.pool.Close()
}

// Fence is the exact lease a driver holds.
type Fence struct {
	RunID   string
	Owner   string
	Attempt uint64
}

// ErrLeaseLost reports that the fence no longer holds.
func ErrLeaseLost(f Fence) error {
	return failure.New(codes.Aborted, failure.NativeSessionLeaseLost,
		"run %s attempt %d is no longer owned by %s", f.RunID, f.Attempt, f.Owner)
}

// ErrRunNotFound reports an unknown run.
func ErrRunNotFound(id string) error {
	return failure.New(codes.NotFound, failure.RunNotFound, "no run %q", id)
}

// InputDigest is the hex sha256 of the deterministic encoding of an input.
func InputDigest(in *prpv1.ExecutionInput) (string, []byte, error) {
	b, err := marshalDet.Marshal(in)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%x", sum), b, nil
}

// SubmitRun is Submit followed by GetRun: it returns the stored run and
// whether this call created it.
func (s *Store) SubmitRun(ctx context.Context, runID string, in *prpv1.ExecutionInput) (*executorv1.Run, bool, error) {
	created, err := s.Submit(ctx, runID, in)
	if err != nil {
		return nil, false, err
	}
	run, err := s.GetRun(ctx, runID)
	return run, created, err
}

// stateExpr derives the caller-facing state: terminal outcomes are stored on
// the run; queued and running follow from the coordinator's phase (so a
// claim writes only the coordinator row).
const stateExpr = `CASE WHEN r.state IN ('succeeded', 'failed', 'cancelled') THEN r.state
	WHEN c.phase = 'observed' THEN 'running' ELSE 'queued' END`

// runColumns are a run's columns as the API shows it: its id is the one
// its company chose (runs.client_run_id, SPEC T2), not its internal key.
const runColumns = `r.client_run_id, ` + stateExpr + `, c.phase, c.attempt, coalesce(c.lease_owner, ''), c.lease_expires_at,
	r.input, r.result, coalesce(r.failure_code, ''), coalesce(r.failure_message, ''), r.event_count,
	coalesce(r.runner_instance_id, ''), r.runner_process, r.provider_process,
	r.created_at, r.updated_at, c.started_at, r.ended_at, r.submit_seq,
	r.result_metadata -> 'nativeCancellation', r.recovery, coalesce(r.plan, ''),
	r.usage_input_tokens, r.usage_cached_input_tokens, r.usage_output_tokens, r.cost_usd::float8,
	coalesce(r.queued_reason, ''), coalesce(r.queued_message, ''), coalesce(r.submitted_by, '')`

func scanRun(row pgx.Row) (*executorv1.Run, int64, error) { return scanRunWith(row) }

// scanRunWith scans runColumns followed by extra destinations.
func scanRunWith(row pgx.Row, extra ...any) (*executorv1.Run, int64, error) {
	var (
		run                                    executorv1.Run
		state, failCode, failMsg               string
		leaseExp, startedAt, endedAt           *time.Time
		createdAt, updatedAt                   time.Time
		input, result, runnerProc, providerPrc []byte
		seq                                    int64
		cancel, recovery                       []byte
		usageIn, usageCached, usageOut         *int64
		costUSD                                *float64
		queuedReason, queuedMsg                string
	)
	dest := append([]any{&run.RunId, &state, &run.Phase, &run.Attempt, &run.LeaseOwner, &leaseExp,
		&input, &result, &failCode, &failMsg, &run.EventCount,
		&run.RunnerInstanceId, &runnerProc, &providerPrc,
		&createdAt, &updatedAt, &startedAt, &endedAt, &seq, &cancel, &recovery, &run.Plan,
		&usageIn, &usageCached, &usageOut, &costUSD, &queuedReason, &queuedMsg, &run.SubmittedBy}, extra...)
	err := row.Scan(dest...)
	if err != nil {
		return nil, 0, err
	}
	if run.Cancellation, err = decodeCancellation(cancel); err != nil {
		return nil, 0, err
	}
	if run.Cancellation != nil {
		// The record names the run by its internal key (SPEC T2).
		run.Cancellation.RunId = run.RunId
	}
	if run.Recovery, err = decodeRecovery(recovery); err != nil {
		return nil, 0, err
	}
	run.State = stateToProto(state)
	run.Input = &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(input, run.Input); err != nil {
		return nil, 0, err
	}
	if run.Result, err = decodeResult(result, usageIn, usageCached, usageOut, costUSD); err != nil {
		return nil, 0, err
	}
	if failCode != "" {
		run.Failure = &executorv1.Failure{Code: failCode, Message: failMsg}
	}
	if queuedReason != "" && state == StateQueued {
		run.QueuedReason = &executorv1.Failure{Code: queuedReason, Message: queuedMsg}
	}
	if len(runnerProc) > 0 {
		run.RunnerProcess = &prpv1.ProcessInfo{}
		_ = proto.Unmarshal(runnerProc, run.RunnerProcess)
	}
	if len(providerPrc) > 0 {
		run.ProviderProcess = &prpv1.ProcessInfo{}
		_ = proto.Unmarshal(providerPrc, run.ProviderProcess)
	}
	run.CreatedAt = timestamppb.New(createdAt)
	run.UpdatedAt = timestamppb.New(updatedAt)
	run.LeaseExpiresAt = tsOrNil(leaseExp)
	run.StartedAt = tsOrNil(startedAt)
	run.EndedAt = tsOrNil(endedAt)
	return &run, seq, nil
}

// resultColumns are the columns decodeResult reads, of the runs row r.
const resultColumns = `r.result, r.usage_input_tokens, r.usage_cached_input_tokens, r.usage_output_tokens, r.cost_usd::float8`

// decodeResult is a run's result as stored: the result column, with the
// usage and cost kept in columns of their own (migration 00011); nil when
// the run has none.
func decodeResult(result []byte, usageIn, usageCached, usageOut *int64, costUSD *float64) (*executorv1.RunResult, error) {
	if len(result) == 0 {
		return nil, nil
	}
	res := &executorv1.RunResult{}
	if err := proto.Unmarshal(result, res); err != nil {
		return nil, err
	}
	if usageIn != nil {
		res.Usage = &executorv1.Usage{
			InputTokens: uint64(*usageIn), CachedInputTokens: uint64(deref(usageCached)), OutputTokens: uint64(deref(usageOut)),
		}
		res.CostUsd = costUSD
	}
	return res, nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func tsOrNil(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func stateToProto(s string) executorv1.RunState {
	switch s {
	case StateQueued:
		return executorv1.RunState_RUN_STATE_QUEUED
	case StateRunning:
		return executorv1.RunState_RUN_STATE_RUNNING
	case StateSucceeded:
		return executorv1.RunState_RUN_STATE_SUCCEEDED
	case StateFailed:
		return executorv1.RunState_RUN_STATE_FAILED
	case StateCancelled:
		return executorv1.RunState_RUN_STATE_CANCELLED
	}
	return executorv1.RunState_RUN_STATE_UNSPECIFIED
}

func stateFromProto(s executorv1.RunState) string {
	switch s {
	case executorv1.RunState_RUN_STATE_QUEUED:
		return StateQueued
	case executorv1.RunState_RUN_STATE_RUNNING:
		return StateRunning
	case executorv1.RunState_RUN_STATE_SUCCEEDED:
		return StateSucceeded
	case executorv1.RunState_RUN_STATE_FAILED:
		return StateFailed
	case executorv1.RunState_RUN_STATE_CANCELLED:
		return StateCancelled
	}
	return ""
}

// getRunSQL reads one run ($1).
const getRunSQL = `SELECT ` + runColumns + `
FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id WHERE r.run_id = $1`

// GetRun returns the run of internal key runID or run_not_found. The run's
// RunId is the id its company chose.
func (s *Store) GetRun(ctx context.Context, runID string) (*executorv1.Run, error) {
	run, _, err := scanRun(s.pool.QueryRow(ctx, getRunSQL, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrRunNotFound(runID)
	}
	return run, err
}

// findRunSQL reads the runs a RunRef may name (resolveRunSQL's), with
// their keys and companies.
const findRunSQL = `SELECT ` + runColumns + `, r.run_id, r.company_id
FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
WHERE r.client_run_id = $1 AND ($2 = '' OR r.company_id = $2) AND ($3::text[] IS NULL OR r.company_id = ANY($3))
ORDER BY r.company_id LIMIT 2`

// FindRun is ResolveRun and GetRun in one round trip: the run a caller
// names, and its key and company.
func (s *Store) FindRun(ctx context.Context, ref RunRef) (*executorv1.Run, ResolvedRun, error) {
	rows, err := s.pool.Query(ctx, findRunSQL, ref.ID, ref.Company, companiesArg(ref.Companies))
	if err != nil {
		return nil, ResolvedRun{}, err
	}
	defer rows.Close()
	var (
		run   *executorv1.Run
		found ResolvedRun
		n     int
	)
	for rows.Next() {
		var r ResolvedRun
		if run, _, err = scanRunWith(rows, &r.Key, &r.Company); err != nil {
			return nil, ResolvedRun{}, err
		}
		found = r
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, ResolvedRun{}, err
	}
	switch n {
	case 0:
		return nil, ResolvedRun{}, ErrRunNotFound(ref.ID)
	case 1:
		return run, found, nil
	}
	return nil, ResolvedRun{}, ErrRunAmbiguous(ref.ID)
}

// ListFilter narrows ListRuns.
type ListFilter struct {
	NormalizedSessionID string
	State               executorv1.RunState
	// Companies, when not nil, keeps only runs of these companies (the
	// caller's, SPEC T2, narrowed by the request's company filter with
	// ScopeCompanies); nil lists every company's.
	Companies []string
}

// ListRuns pages through runs, newest first. The page token is opaque and
// bound to the filter (page_token_filter_mismatch otherwise).
func (s *Store) ListRuns(ctx context.Context, f ListFilter, pageSize int, pageToken string) ([]*executorv1.Run, string, error) {
	if pageSize <= 0 {
		pageSize = 50
	}
	filter := filterDigest("runs", f.Companies, f.NormalizedSessionID, f.State.String())
	cur, ok, err := decodePageToken(pageToken, filter)
	if err != nil {
		return nil, "", err
	}
	before := int64(1<<63 - 1)
	if ok {
		before = cur.Seq
	}
	rows, err := s.pool.Query(ctx, `SELECT `+runColumns+`
FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
WHERE r.submit_seq < $1 AND ($2 = '' OR r.normalized_session_id = $2) AND ($3 = '' OR `+stateExpr+` = $3)
  AND ($5::text[] IS NULL OR r.company_id = ANY($5))
ORDER BY r.submit_seq DESC LIMIT $4`, before, f.NormalizedSessionID, stateFromProto(f.State), pageSize+1, companiesArg(f.Companies))
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var (
		runs []*executorv1.Run
		seqs []int64
	)
	for rows.Next() {
		run, seq, err := scanRun(rows)
		if err != nil {
			return nil, "", err
		}
		runs = append(runs, run)
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(runs) > pageSize {
		runs = runs[:pageSize]
		next = encodePageToken(filter, pageCursor{Seq: seqs[pageSize-1]})
	}
	return runs, next, nil
}

// Claim is a run a dispatcher now holds a lease on.
type Claim struct {
	Fence
	Input *prpv1.ExecutionInput
	// SessionScope is the run's stored scope key (runs.session_scope).
	SessionScope   string
	LeaseExpiresAt time.Time
	// TurnGeneration counts recorded retries: a takeover keeps it (the same
	// provider turn is resumed, never started twice), a retry bumps it.
	TurnGeneration uint64
	// TraceParent is the trace context the run was submitted in ("" when
	// none), which its driver continues.
	TraceParent string
	// SubmittedAt is when the run was submitted (runs.created_at), the
	// start of its submit → turn.started latency (SPEC D6).
	SubmittedAt time.Time
	// Expired: the claim took over a lease that had expired (its
	// controller stopped renewing it).
	Expired bool
	// Preread, when set, is what the claiming transaction read for the
	// run's first attach (SubmitClaim with AttachReads); nil: the driver
	// reads it.
	Preread *Preread
	// Run is the run as its claim committed (SubmitClaim reads it in the
	// same round trip): what SubmitRun answers, with no read after the
	// commit; nil when it could not be read.
	Run *executorv1.Run
}

// Scope returns the run's session scope key: the stored one, or for a claim
// made without it (tests, benchmarks) the key of its input.
func (c *Claim) Scope() string {
	if c.SessionScope != "" {
		return c.SessionScope
	}
	return scope.OfRun(c.RunID, c.Input)
}

// Controller identifies the process holding a lease, so a successor on the
// same host and in the same PID namespace can prove it dead (no such pid,
// or another start time).
type Controller struct {
	procid.Identity
	// Addr is where this controller serves the executor API (for
	// forwarding steering and resolutions to the live session).
	Addr string
}

// ClaimNext claims the oldest due run in one statement: a queued run, a
// retryable failure whose next attempt is due, or an observed run whose lease
// expired. Runs of one session scope are claimed in submission order, one at
// a time. Runs the claim must refuse (E7: a durable result, a pending or
// acknowledged cancellation) are never candidates. The claim increments
// attempt, sets the lease from the database clock and records the
// controller process. It returns nil when nothing is due.
func (s *Store) ClaimNext(ctx context.Context, owner string, ttl time.Duration, ctl Controller) (*Claim, error) {
	c, err := s.claimNext(ctx, claimQueuedSQL, owner, ttl, ctl)
	if c != nil || err != nil {
		return c, err
	}
	return s.claimNext(ctx, claimExpiredSQL, owner, ttl, ctl)
}

// claimSet is the lease a claim writes.
const claimSet = `attempt = c.attempt + 1, lease_owner = $1, lease_expires_at = now() + $2 * interval '1 microsecond',
         phase = 'observed', controller_boot_id = $3, controller_pid = $4, controller_start_ticks = $5,
         started_at = coalesce(c.started_at, now()), controller_addr = nullif($6, ''), controller_pid_ns = nullif($7, '')`

// dueHead is the SQL condition "coordinator c is a due queued run that heads
// its session scope" (migration 00009 keeps scope_head on exactly one
// unfinished run per scope): what a claim may take.
const dueHead = `c2.scope_head AND c2.phase IN ('queued', 'retryable_failure') AND c2.next_attempt_at <= now()
            AND c2.result_id IS NULL AND c2.cancel_state IS NULL`

// claimQueuedSQL claims a due queued run that heads its session scope, of
// the company next by weighted fair share (SPEC Q3): among the companies
// with due heads and not blocked by their budget (SPEC Q2), the one with the
// least virtual time (company_state.pass, migration 00031); of that company,
// its oldest due head that no other claim holds (one probe of
// coordinators_company_head_idx per company with FOR UPDATE SKIP LOCKED:
// runs waiting behind a busy session are not heads and cost nothing, so an
// attempt costs the same with 100 or 100,000 of them; the first free head
// of each company is locked for the statement, only the chosen one is
// claimed, and one index walk serves both the choice and the claim). A
// claim made while another company has due work too advances the company's
// virtual time by 1/weight, from no lower than 1 behind the next company's.
//
// It always answers one row: the claim, or no run and whether a company
// had due work. A company with a limit of runs in flight (SPEC Q1), or
// whose due heads were all being claimed by others, is not claimed here:
// the caller then claims through executor.claim_queued, which serializes
// the claims of a limited company and counts its runs in flight.
const claimQueuedSQL = `
WITH cand AS MATERIALIZED (
  SELECT s.company_id, h.run_id, CASE WHEN own.company_id IS NULL THEN dflt.weight ELSE own.weight END AS weight,
         CASE WHEN own.company_id IS NULL THEN dflt.max_running_runs ELSE own.max_running_runs END IS NOT NULL AS limited,
         count(*) OVER () AS waiting, lead(s.pass) OVER (ORDER BY s.pass, s.company_id) AS next_pass
    FROM executor.company_state s
    LEFT JOIN executor.company_limits own ON own.company_id = s.company_id
    LEFT JOIN executor.company_limits dflt ON dflt.company_id = '*'
    CROSS JOIN LATERAL (SELECT c2.run_id FROM executor.coordinators c2
                         WHERE c2.company_id = s.company_id AND ` + dueHead + `
                         ORDER BY c2.submit_seq LIMIT 1
                         FOR UPDATE SKIP LOCKED) h
   WHERE NOT s.budget_blocked
   ORDER BY s.pass, s.company_id
   LIMIT 1),
claimed AS (
  UPDATE executor.coordinators c SET ` + claimSet + `
   WHERE c.run_id = (SELECT run_id FROM cand WHERE NOT limited)
  RETURNING c.run_id, c.attempt, c.lease_expires_at, c.turn_generation),
passed AS (
  UPDATE executor.company_state s SET pass = greatest(s.pass, cand.next_pass - 1) + 1.0 / coalesce(cand.weight, 1)
    FROM cand
   WHERE s.company_id = cand.company_id AND cand.waiting > 1 AND EXISTS (SELECT 1 FROM claimed))
SELECT claimed.run_id, claimed.attempt, claimed.lease_expires_at, claimed.turn_generation, r.input, r.session_scope,
       coalesce(r.trace_parent, ''), r.created_at, EXISTS (SELECT 1 FROM cand)
  FROM (SELECT) one
  LEFT JOIN claimed ON true
  LEFT JOIN executor.runs r ON r.run_id = claimed.run_id`

// claimLimitedSQL is claimQueuedSQL's slow path (executor.claim_queued,
// migration 00031): the same choice, claiming a limited company's run only
// under its limit, and passing over a company whose due heads others are
// claiming.
const claimLimitedSQL = `SELECT *, true FROM executor.claim_queued($1, $2, $3, $4, $5, $6, $7)`

// claimExpiredSQL takes over the oldest observed run whose lease expired.
const claimExpiredSQL = `
WITH claimed AS (
  UPDATE executor.coordinators c SET ` + claimSet + `
   WHERE c.run_id = (
     SELECT c2.run_id FROM executor.coordinators c2
      WHERE c2.phase = 'observed' AND c2.lease_expires_at < now()
        AND c2.result_id IS NULL AND c2.cancel_state IS NULL
      ORDER BY c2.submit_seq
      LIMIT 1
      FOR UPDATE SKIP LOCKED)
  RETURNING c.run_id, c.attempt, c.lease_expires_at, c.turn_generation
)
SELECT claimed.run_id, claimed.attempt, claimed.lease_expires_at, claimed.turn_generation, r.input, r.session_scope, coalesce(r.trace_parent, ''), r.created_at
  FROM claimed JOIN executor.runs r ON r.run_id = claimed.run_id`

func (s *Store) claimNext(ctx context.Context, query, owner string, ttl time.Duration, ctl Controller) (*Claim, error) {
	// Traced only when it claimed: an attempt that finds nothing writes
	// no WAL and syncs nothing.
	end := synctrace.Begin("executor.claim", "")
	var (
		c   *Claim
		err error
	)
	if query == claimQueuedSQL {
		c, err = s.claimQueued(ctx, owner, ttl, ctl)
	} else {
		c, err = scanClaim(s.pool.QueryRow(ctx, query, claimArgs(owner, ttl, ctl)...), owner)
	}
	if c != nil {
		end()
		c.Expired = query == claimExpiredSQL
	}
	return c, err
}

// claimQueued claims by claimQueuedSQL, or by its slow path when it
// claimed nothing while a company had due work.
func (s *Store) claimQueued(ctx context.Context, owner string, ttl time.Duration, ctl Controller) (*Claim, error) {
	args := claimArgs(owner, ttl, ctl)
	c, due, err := scanQueuedClaim(s.pool.QueryRow(ctx, claimQueuedSQL, args...), owner)
	if c != nil || !due || err != nil {
		return c, err
	}
	c, _, err = scanQueuedClaim(s.pool.QueryRow(ctx, claimLimitedSQL, args...), owner)
	return c, err
}

// scanQueuedClaim reads the row of claimQueuedSQL or claimLimitedSQL: the
// claim (nil when none) and whether a company had due work.
func scanQueuedClaim(row pgx.Row, owner string) (*Claim, bool, error) {
	var (
		c     Claim
		runID *string
		raw   []byte
		due   bool
		scope *string
		trace *string
		at    *time.Time
		att   *uint64
		exp   *time.Time
		gen   *uint64
	)
	err := row.Scan(&runID, &att, &exp, &gen, &raw, &scope, &trace, &at, &due)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && runID == nil) {
		return nil, due, nil
	}
	if err != nil {
		return nil, false, err
	}
	c.RunID, c.Attempt, c.LeaseExpiresAt, c.TurnGeneration = *runID, *att, *exp, *gen
	c.SessionScope, c.TraceParent, c.SubmittedAt = *scope, *trace, *at
	c.Owner = owner
	c.Input = &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, c.Input); err != nil {
		return nil, false, err
	}
	return &c, true, nil
}

// claimArgs are the parameters $1..$7 of claimSet.
func claimArgs(owner string, ttl time.Duration, ctl Controller) []any {
	return []any{owner, ttl.Microseconds(), ctl.BootID, ctl.PID, int64(ctl.StartTicks), ctl.Addr, ctl.PIDNamespace}
}

// scanClaim reads the row of a claim statement; nil when it claimed
// nothing.
func scanClaim(row pgx.Row, owner string) (*Claim, error) {
	var (
		c   Claim
		raw []byte
	)
	err := row.Scan(&c.RunID, &c.Attempt, &c.LeaseExpiresAt, &c.TurnGeneration, &raw, &c.SessionScope, &c.TraceParent, &c.SubmittedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c.Owner = owner
	c.Input = &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, c.Input); err != nil {
		return nil, err
	}
	return &c, nil
}

// QueueDepth counts the runs waiting to be claimed by phase: queued, and
// retryable_failure (a failed attempt waiting for its next one).
func (s *Store) QueueDepth(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `
SELECT phase, count(*) FROM executor.coordinators
 WHERE phase IN ('queued', 'retryable_failure') GROUP BY phase`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{PhaseQueued: 0, PhaseRetryableFailure: 0}
	for rows.Next() {
		var (
			phase string
			n     int64
		)
		if err := rows.Scan(&phase, &n); err != nil {
			return nil, err
		}
		out[phase] = n
	}
	return out, rows.Err()
}

// cancellationHeld is the SQL condition "the run holds a pending or
// acknowledged durable cancellation".
func cancellationHeld(alias string) string {
	return `coalesce(` + alias + `.result_metadata -> 'nativeCancellation' ->> 'dispatchState' IN ('pending', 'acknowledged'), false)`
}

// Lease names one held lease for RenewLeases.
type Lease struct {
	RunID   string
	Attempt uint64
}

// renewLeasesSQL renews the listed leases of one owner, each only while its
// exact (owner, attempt) is current and unexpired, writing only
// lease_expires_at (no indexed column: a HOT update). The owner's held
// leases come from one range of coordinators_owner_idx and are matched to
// the list with a hash join.
//
// The statement is prepared once and must run on its generic plan. That
// plan estimates unnest of an array parameter at 10 rows, for which one
// index probe per listed lease looks cheaper than the hash join; and an
// estimate well above the real list length makes a custom plan (planned
// anew on every tick) look cheaper than the generic one. The third function
// of ROWS FROM yields no rows (ROWS FROM pads it with nulls, the arrays
// decide the row count): it is there for its estimate of 100 rows.
const renewLeasesSQL = `
UPDATE executor.coordinators c
   SET lease_expires_at = now() + $4 * interval '1 microsecond'
  FROM ROWS FROM (unnest($2::text[]), unnest($3::bigint[]), jsonb_array_elements('[]'))
       AS l(run_id, attempt, estimate)
 WHERE c.lease_owner = $1 AND c.phase = 'observed' AND c.lease_expires_at > now()
   AND c.run_id = l.run_id AND c.attempt = l.attempt`

// RenewLeases renews every given lease of owner in one statement, each only
// while its exact (owner, attempt) is current and unexpired. It returns the
// run ids that were renewed; a missing one has lost its lease.
func (s *Store) RenewLeases(ctx context.Context, owner string, leases []Lease, ttl time.Duration) (map[string]bool, error) {
	ids := make([]string, len(leases))
	attempts := make([]int64, len(leases))
	for i, l := range leases {
		ids[i], attempts[i] = l.RunID, int64(l.Attempt)
	}
	tag, err := s.pool.Exec(ctx, renewLeasesSQL, owner, ids, attempts, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	renewed := make(map[string]bool, len(leases))
	if int(tag.RowsAffected()) == len(leases) {
		for _, id := range ids { // the common case: every lease held
			renewed[id] = true
		}
		return renewed, nil
	}
	// Some were lost: find which are still held (just renewed).
	rows, err := s.pool.Query(ctx, `
SELECT c.run_id FROM executor.coordinators c JOIN unnest($2::text[], $3::bigint[]) AS l(run_id, attempt)
    ON c.run_id = l.run_id AND c.attempt = l.attempt
 WHERE c.lease_owner = $1 AND c.phase = 'observed' AND c.lease_expires_at > now()`, owner, ids, attempts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		renewed[id] = true
	}
	return renewed, rows.Err()
}

// RunnerRecord names the runner instance and the processes that serve a
// run (as the gateway's Opened reports them).
type RunnerRecord struct {
	InstanceID       string
	Runner, Provider *prpv1.ProcessInfo
}

// RecordRunner stores which runner and provider processes serve the run.
// Without a provider process (a warm runner's hello predates its provider),
// the run inherits the provider the same runner instance last reported in
// its scope; a provider started during the run overwrites it (its spawn
// event).
func (s *Store) RecordRunner(ctx context.Context, f Fence, runnerInstanceID string, runner, provider *prpv1.ProcessInfo) error {
	defer synctrace.Begin("executor.runner", f.RunID)()
	return recordRunner(ctx, s.pool, f, RunnerRecord{InstanceID: runnerInstanceID, Runner: runner, Provider: provider})
}

// execer is a pool, a transaction, or a batch being built (queued).
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// recordRunnerArgs are recordRunnerSQL's arguments for rec under f.
func recordRunnerArgs(f Fence, rec RunnerRecord) ([]any, error) {
	rp, err := marshalOpt(rec.Runner)
	if err != nil {
		return nil, err
	}
	pp, err := marshalOpt(rec.Provider)
	if err != nil {
		return nil, err
	}
	return []any{f.RunID, f.Owner, int64(f.Attempt), rec.InstanceID, rp, pp}, nil
}

func recordRunner(ctx context.Context, q execer, f Fence, rec RunnerRecord) error {
	args, err := recordRunnerArgs(f, rec)
	if err != nil {
		return err
	}
	tag, err := q.Exec(ctx, recordRunnerSQL, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost(f)
	}
	return nil
}

// queueRecordRunnerGuarded queues recordRunnerGuardedSQL on b: the batch
// fails when the fence no longer holds.
func queueRecordRunnerGuarded(b *pgx.Batch, f Fence, rec RunnerRecord) error {
	args, err := recordRunnerArgs(f, rec)
	if err != nil {
		return err
	}
	b.Queue(recordRunnerGuardedSQL, args...)
	return nil
}

// recordRunnerSQL is one statement: the run's runner, and the scope's
// record of every runner that attached for it (scope_runners; its upsert
// affects one row exactly when the fenced update did). Args: run, owner,
// attempt, runner instance, runner process, provider process.
const recordRunnerSQL = `
WITH u AS (` + recordRunnerUpdate + `)
` + recordRunnerInsert

// recordRunnerGuardedSQL is recordRunnerSQL failing (division by zero,
// isFenceGuard) when the fence does not hold, so that a COMMIT pipelined
// behind it is skipped with the rest of its batch.
const recordRunnerGuardedSQL = `
WITH u AS (` + recordRunnerUpdate + `),
i AS (` + recordRunnerInsert + ` RETURNING 1)
SELECT 1 / count(*)::int FROM i`

const recordRunnerUpdate = `
UPDATE executor.runs r SET runner_instance_id = $4, runner_process = $5, updated_at = now(),
       provider_process = coalesce($6, r.provider_process,
         (SELECT p.provider_process FROM executor.runs p
           WHERE p.session_scope = r.session_scope AND p.runner_instance_id = $4 AND p.provider_process IS NOT NULL
             AND p.submit_seq < r.submit_seq
           ORDER BY p.submit_seq DESC LIMIT 1))
  FROM executor.coordinators c
 WHERE r.run_id = $1 AND c.run_id = r.run_id AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'
RETURNING r.session_scope, r.run_id, r.submit_seq`

const recordRunnerInsert = `
INSERT INTO executor.scope_runners AS s (session_scope, runner_instance_id, first_run_id, last_submit_seq)
SELECT session_scope, $4, run_id, submit_seq FROM u
    ON CONFLICT (session_scope, runner_instance_id) DO UPDATE SET last_submit_seq = greatest(s.last_submit_seq, excluded.last_submit_seq)`

func marshalOpt(m proto.Message) ([]byte, error) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return nil, nil
	}
	return marshalDet.Marshal(m)
}
