package store

import (
	"context"
	"errors"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"

	"github.com/jackc/pgx/v5"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/pkg/telemetry"
)

// submitSQL inserts the run and its coordinator in one statement (one round
// trip, one commit). The run is stored under key $1 with the client id $13
// its company chose (SPEC T2). When the company has a run of that client id
// already, or the key is taken (another company's run), it inserts nothing
// and returns the company's run's stored input digest and key, if any.
// Dispatchers are notified after the commit (notifyCommitted), not inside
// it.
const submitSQL = `
WITH ins AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, issue_id, agent_id, trace_parent, submitted_by, client_run_id)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, nullif($11, ''), nullif($12, ''), $13)
  ON CONFLICT DO NOTHING
  RETURNING run_id, session_scope, submit_seq),
co AS (
  INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, company_id)
  SELECT run_id, $10, session_scope, submit_seq, $2 FROM ins
  RETURNING run_id, scope_head),
mine AS (
  SELECT input_digest FROM executor.runs WHERE client_run_id = $13 AND company_id = $2 AND NOT EXISTS (SELECT 1 FROM ins))
SELECT (SELECT count(*) FROM co) > 0, coalesce((SELECT input_digest FROM mine), ''), coalesce((SELECT scope_head FROM co), false)`

// ErrRunKeyTaken reports a submission whose key is another run's (of
// another company, or under another client id): nothing was stored; submit
// again under a fresh key (NewRunKey) with the same client id.
var ErrRunKeyTaken = errors.New("store: the run key is another run's")

// Submit stores a queued run and its coordinator, atomically, and notifies
// dispatchers on commit when the run heads its session scope (SPEC:
// SubmitRun; a run queued behind another is claimable only once the runs
// before it end, and whoever ends them is not told by this notification
// anyway). It is idempotent by run id: the
// same input again is created false; another input under the same id is
// run_id_conflict. Run ids are unique per company (SPEC T2): runID is the
// run's key, its client id is WithClientRunID's (runID without), and a key
// another run holds is ErrRunKeyTaken. The trace context of ctx is kept with the run, so
// whoever drives it continues the caller's trace. The caller reads the run
// (GetRun) afterwards, so a dispatcher of this process can be woken before
// that read.
func (s *Store) Submit(ctx context.Context, runID string, in *prpv1.ExecutionInput) (created bool, err error) {
	end := synctrace.Begin("executor.submit", runID)
	created, head, err := s.submitAdmitted(ctx, runID, in)
	end()
	if created && head {
		s.notifyCommitted(ctx, RunsChannel, runID)
	}
	return created, err
}

// claimSubmittedSQL claims the run just submitted ($8) in the submitting
// transaction when it heads its session scope (migration 00009's insert
// trigger decided that under the scope's lock) and is due: the claim of
// claimQueuedSQL, for one known run. Only a coordinator this transaction
// inserted is claimed (its xmin is the transaction's id): the statement is
// pipelined behind the submission, which inserts nothing when the run
// exists already. The company must be under its limit of runs in flight
// and not blocked by its budget (SPEC Q1, Q2): executor.take_slot, the
// check claim_queued makes, evaluated last. A claim into a free slot
// advances no virtual time (SPEC Q3 shares slots companies wait for).
const claimSubmittedSQL = `
WITH claimed AS (
  UPDATE executor.coordinators c SET ` + claimSet + `
   WHERE c.run_id = $8 AND c.xmin = pg_current_xact_id()::xid
     AND c.scope_head AND c.phase = 'queued' AND c.next_attempt_at <= now()
     AND c.result_id IS NULL AND c.cancel_state IS NULL
     AND executor.take_slot(c.company_id)
  RETURNING c.run_id, c.attempt, c.lease_expires_at, c.turn_generation
)
SELECT claimed.run_id, claimed.attempt, claimed.lease_expires_at, claimed.turn_generation, r.input, r.session_scope, coalesce(r.trace_parent, ''), r.created_at
  FROM claimed JOIN executor.runs r ON r.run_id = claimed.run_id`

// AttachReads asks SubmitClaim to read, in its round trip, what the first
// attach of a run it claims needs (Claim.Preread).
type AttachReads struct {
	// PriorRuns bounds the prior-run records read (AttachFacts' limit).
	PriorRuns int
	// GatewayTTL, when set, has the scope's placement read too, with the
	// gateways' state for this TTL (ScopePlacement's).
	GatewayTTL time.Duration
}

// Preread is what SubmitClaim read for the first attach of a run it
// claimed, in the claiming transaction, after the claim.
type Preread struct {
	// Facts are the run's AttachFacts.
	Facts *AttachFacts
	// Placement is the scope's placement, read under a share lock as
	// ScopePlacement reads it (a move that locked it first was waited
	// for; one that comes after waits for the claim's commit, and then
	// sees the run in flight). Nil when the scope has none, or it was
	// not asked for.
	Placement *Placement
}

// SubmitClaim is Submit and, in the same transaction (one commit instead
// of two, SPEC P4), the claim of the new run by owner when it can start at
// once: it heads its session scope (no earlier run of the scope is
// unfinished) and is due. c is nil when the run existed already or waits
// behind its scope; dispatchers are then notified as by Submit (when it
// heads its scope). A claimed run is announced to nobody: its owner drives
// it. run is the new run as this transaction left it (claimed or not), nil
// when it existed already or the read failed.
//
// The submission and the claim go in one round trip: a pipelined batch,
// which PostgreSQL runs as one implicit transaction (the batch's single
// Sync commits it; an error in either statement rolls back both). An
// explicit transaction took four round trips (BEGIN, the two statements,
// COMMIT), each a wake-up of the server and of this process.
//
// With reads, the same round trip also reads what the claimed run's first
// attach needs (Claim.Preread; SPEC P4: the driver then contacts the
// gateway at once, with no read of its own before the Open). They are read
// after the claim, in its transaction, so they see the database as a read
// right after its commit would, except for what commits in between: the
// run was not visible to anyone before its commit (no cancellation of it
// can be missed), and the claim holds the run's coordinator row. They are
// sent whether or not the run is claimed (a round trip costs more than
// the reads), except into a scope whose previous submission through this
// store queued behind an unfinished run a moment ago (busyScopes): that
// run most likely queues too, and is left without a Preread if it is
// claimed after all. A result that cannot be decoded leaves Preread nil,
// and the driver reads again.
func (s *Store) SubmitClaim(ctx context.Context, runID string, in *prpv1.ExecutionInput, owner string, ttl time.Duration, ctl Controller, reads *AttachReads) (created bool, c *Claim, run *executorv1.Run, err error) {
	end := synctrace.Begin("executor.submit+claim", runID)
	args, digest, err := submitArgs(ctx, runID, in)
	if err != nil {
		end()
		return false, nil, nil, err
	}
	var (
		existing string
		head     bool
		pre      func() *Preread
		sc       = args[submitArgScope].(string)
		now      = time.Now()
	)
	if reads != nil && s.busy.busy(sc, now) {
		// It will most likely queue (busyScopes): its driver reads
		// what its first attach needs if it is claimed after all.
		reads = nil
	}
	err = s.sendAdmitted(ctx, runID, in, func(b *pgx.Batch) {
		created, existing, head, c, run = false, "", false, nil, nil
		b.Queue(submitSQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&created, &existing, &head) })
		pre = queueSubmitClaim(b, runID, sc, in, owner, ttl, ctl, reads, &c, &run)
	})
	end()
	if err != nil {
		return false, nil, nil, err
	}
	if !created {
		return false, nil, nil, checkResubmitted(ctx, s.pool, runID, in, digest, existing)
	}
	if c == nil && !head {
		s.busy.queued(sc, now)
	} else {
		s.busy.idle(sc)
	}
	if c == nil {
		if head {
			s.notifyCommitted(ctx, RunsChannel, runID)
		}
		return true, nil, run, nil
	}
	c.Preread = pre()
	c.Run = run
	return true, c, run, nil
}

// queueSubmitClaim queues SubmitClaim's statements after the submission of
// run runID of scope sc (scope.OfRun's, computed once: a canonical digest):
// the claim (into c), the run (into run) and the reads; the Preread is
// complete once the batch is: the function returned gives it then (nil when
// not asked for, or a read failed).
func queueSubmitClaim(b *pgx.Batch, runID, sc string, in *prpv1.ExecutionInput, owner string, ttl time.Duration, ctl Controller, reads *AttachReads, c **Claim, run **executorv1.Run) func() *Preread {
	b.Queue(claimSubmittedSQL, append(claimArgs(owner, ttl, ctl), runID)...).QueryRow(func(row pgx.Row) (err error) {
		*c, err = scanClaim(row, owner)
		return err
	})
	// The run as the claim left it (or as stored, unclaimed), for
	// SubmitRun's answer (a round trip less than reading it after the
	// commit). A read that fails to scan leaves it nil: the caller reads
	// the run itself.
	b.Queue(getRunSQL, runID).QueryRow(func(row pgx.Row) error {
		if r, _, err := scanRun(row); err == nil {
			*run = r
		}
		return nil
	})
	var (
		pre        *Preread
		decodeErr  = new(error)
		placeErr   error
		placedRead bool
	)
	if reads != nil {
		pre = &Preread{}
		pre.Facts, decodeErr = queueAttachFacts(b, runID, sc, in, reads.PriorRuns, true)
		if reads.GatewayTTL > 0 {
			b.Queue(claimedHere(scopePlacementSQL+` FOR SHARE OF p`, 2), sc, reads.GatewayTTL.Microseconds(), runID).QueryRow(func(row pgx.Row) error {
				placedRead = true
				pre.Placement, placeErr = scanOptionalPlacement(row)
				return nil
			})
		}
	}
	return func() *Preread {
		if pre != nil && *decodeErr == nil && placeErr == nil && (placedRead || reads.GatewayTTL <= 0) {
			return pre
		}
		return nil
	}
}

// rowQuerier is a pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// submitAdmitted is Submit's submission, admitted (sendAdmitted).
func (s *Store) submitAdmitted(ctx context.Context, runID string, in *prpv1.ExecutionInput) (created, head bool, err error) {
	args, digest, err := submitArgs(ctx, runID, in)
	if err != nil {
		return false, false, err
	}
	var existing string
	err = s.sendAdmitted(ctx, runID, in, func(b *pgx.Batch) {
		created, existing, head = false, "", false
		b.Queue(submitSQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&created, &existing, &head) })
	})
	if err != nil || created {
		return created, head, err
	}
	return false, false, checkResubmitted(ctx, s.pool, runID, in, digest, existing)
}

// sendAdmitted sends a submission's statements (queue queues them) behind
// the admission guard, in one round trip; when a limit applies to it,
// again in an explicit transaction under its company's lock (admitLocked).
// queue must reset what its statements scan into.
func (s *Store) sendAdmitted(ctx context.Context, runID string, in *prpv1.ExecutionInput, queue func(b *pgx.Batch)) error {
	company := in.GetBinding().GetCompanyId()
	warm := in.GetSession().GetLifecycle().GetMode() == prpv1.LifecycleMode_LIFECYCLE_MODE_WARM
	b := &pgx.Batch{}
	b.Queue(guardSQL, company, warm)
	queue(b)
	err := s.pool.SendBatch(ctx, b).Close()
	if guardMissing(err) {
		// A schema before migration 00035 (this release's store beside a
		// migration in progress, SPEC L3): no limits yet.
		b = &pgx.Batch{}
		queue(b)
		return s.pool.SendBatch(ctx, b).Close()
	}
	if !limitedErr(err) {
		return err
	}
	err = s.admitLocked(ctx, company, clientRunID(ctx, runID), scope.OfRun(runID, in), warm, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		queue(b)
		return tx.SendBatch(ctx, b).Close()
	})
	s.countRefusal(ctx, company, err)
	return err
}

func submit(ctx context.Context, q rowQuerier, runID string, in *prpv1.ExecutionInput) (created, head bool, err error) {
	args, digest, err := submitArgs(ctx, runID, in)
	if err != nil {
		return false, false, err
	}
	var existing string
	if err := q.QueryRow(ctx, submitSQL, args...).Scan(&created, &existing, &head); err != nil {
		return false, false, err
	}
	if created {
		return true, head, nil
	}
	return false, false, checkResubmitted(ctx, q, runID, in, digest, existing)
}

// submitArgScope is the index of the run's scope in submitArgs' arguments.
const submitArgScope = 3

// submitArgs are submitSQL's parameters for the run, and its input digest.
func submitArgs(ctx context.Context, runID string, in *prpv1.ExecutionInput) (args []any, digest string, err error) {
	digest, raw, err := InputDigest(in)
	if err != nil {
		return nil, "", err
	}
	return []any{runID, in.GetBinding().GetCompanyId(), in.GetSession().GetNormalizedSessionId(), scope.OfRun(runID, in),
		in.GetSession().GetLifecycle().GetMode().String(), raw, digest,
		in.GetBinding().GetIssueId(), in.GetBinding().GetAgentId(), BindingDigest(in),
		telemetry.TraceParent(ctx), ActorOf(ctx), clientRunID(ctx, runID)}, digest, nil
}

// checkResubmitted checks a submission that stored nothing (existing is
// the stored input digest of the company's run of the same client id, ""
// when there was none in the statement's snapshot): the same input is an
// idempotent retry, another one run_id_conflict; without a run of the
// client id in the company, the key was another run's (ErrRunKeyTaken).
func checkResubmitted(ctx context.Context, q rowQuerier, runID string, in *prpv1.ExecutionInput, digest, existing string) error {
	clientID := clientRunID(ctx, runID)
	if existing == "" {
		// Inserted concurrently, after this statement's snapshot, or the
		// key is taken: read it now that it committed.
		err := q.QueryRow(ctx, `SELECT input_digest FROM executor.runs WHERE client_run_id = $1 AND company_id = $2`,
			clientID, in.GetBinding().GetCompanyId()).Scan(&existing)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrRunKeyTaken
		}
		if err != nil {
			return err
		}
	}
	if existing != digest {
		return failure.New(codes.AlreadyExists, failure.RunIDConflict, "run %q already exists with a different input", clientID)
	}
	return nil
}
