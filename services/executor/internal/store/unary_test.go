package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// batchRows records, for each statement of each batch, its SQL and the
// rows its command tag reports.
type batchRows struct {
	mu   sync.Mutex
	sqls []string
	rows []int64
}

func (r *batchRows) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sqls, r.rows = nil, nil
}

// read returns the statements whose SQL contains part, and their rows.
func (r *batchRows) read(part string) (n int, rows int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, sql := range r.sqls {
		if strings.Contains(sql, part) {
			n++
			rows += r.rows[i]
		}
	}
	return n, rows
}

func (r *batchRows) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (r *batchRows) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *batchRows) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *batchRows) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sqls = append(r.sqls, d.SQL)
	r.rows = append(r.rows, d.CommandTag.RowsAffected())
}
func (r *batchRows) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// SPEC P1: a submission that queues behind its session scope (most
// submissions of a busy session) reads nothing for a first attach it will
// not make: SubmitClaim's attach reads ride in its round trip but read
// only when the transaction claimed the run. A run it claims reads them
// all (TestP4_SubmitClaimReadsTheFirstAttachsFactsAndPlacementInItsRoundTrip
// checks what).
func TestP1_ASubmissionQueuedBehindItsScopeReadsNoAttachFacts(t *testing.T) {
	t.Parallel()
	r, s := tracedStore(t)
	ctx := context.Background()
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	reads := &store.AttachReads{PriorRuns: 16, GatewayTTL: gatewayTTL}
	const gated = "claimed_here"

	// The scope's head is claimed: its reads read (its own run row, at
	// least, for its cancellation record and continuity).
	created, c, _, err := s.SubmitClaim(ctx, "h1", input("busy", "h1"), "o", time.Minute, ctl, reads)
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c)
	require.NotNil(t, c.Preread)
	statements, rows := r.read(gated)
	require.Equal(t, 9, statements, "the attach reads and the placement, each gated by the claim")
	require.Positive(t, rows)

	// The runs behind it queue: the same statements read no row (and
	// once one queued, the next ones do not send them: TestP1_ASubmission
	// IntoAScopeThatJustQueuedSendsNoAttachReads).
	for i, id := range []string{"q1", "q2", "q3"} {
		r.reset()
		created, c, run, err := s.SubmitClaim(ctx, id, input("busy", id), "o", time.Minute, ctl, reads)
		require.NoError(t, err)
		require.True(t, created)
		require.Nil(t, c, "queued behind h1")
		require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, run.GetState())
		statements, rows = r.read(gated)
		if i == 0 {
			require.Equal(t, 9, statements)
		} else {
			require.Zero(t, statements, "%s: the scope's previous submission queued", id)
		}
		require.Zero(t, rows, "%s queued: nothing is read for an attach", id)
	}
}

// SPEC P1: a submission into a scope whose previous submission (through
// the same store, within busyScopeMemory) queued behind an unfinished run
// sends none of the nine gated attach reads: it will most likely queue as
// well, and PostgreSQL's cost of those statements (bind, executor start
// and end, even when their one-time filter reads nothing) was ≈ 40 % of
// its CPU per queued SubmitRun. Counted: the statements of each
// submission's batch (13 on the old code, 4: the admission guard, the
// submission, the claim, the run). A run guessed wrong is claimed as
// usual, without a Preread (its driver reads), and the next submission
// reads again; so does one after the memory.
func TestP1_ASubmissionIntoAScopeThatJustQueuedSendsNoAttachReads(t *testing.T) {
	t.Parallel()
	r, s := tracedStore(t)
	ctx := context.Background()
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	reads := &store.AttachReads{PriorRuns: 16, GatewayTTL: gatewayTTL}
	const gated = "claimed_here"
	submit := func(id string) (statements, gatedStatements int, c *store.Claim) {
		t.Helper()
		r.reset()
		created, c, _, err := s.SubmitClaim(ctx, id, input("burst", id), "o", time.Minute, ctl, reads)
		require.NoError(t, err)
		require.True(t, created)
		r.mu.Lock()
		statements = len(r.sqls)
		r.mu.Unlock()
		gatedStatements, _ = r.read(gated)
		return statements, gatedStatements, c
	}
	end := func(c *store.Claim) {
		t.Helper()
		_, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(c.RunID, "runner-1", 1, "run.terminal", map[string]any{
			"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
		require.NoError(t, err)
	}

	n, g, b1 := submit("b1")
	require.NotNil(t, b1, "the scope's first run is claimed")
	require.NotNil(t, b1.Preread)
	require.Equal(t, 13, n)
	require.Equal(t, 9, g)
	n, g, c := submit("b2")
	require.Nil(t, c, "queued behind b1")
	require.Equal(t, 13, n, "nothing queued in the scope before")
	require.Equal(t, 9, g)
	for _, id := range []string{"b3", "b4", "b5"} {
		n, g, c = submit(id)
		require.Nil(t, c, "%s queues behind b1", id)
		require.Equal(t, 4, n, "%s: guard, submission, claim, run", id)
		require.Zero(t, g)
	}

	// Every run of the scope ends: the next submission is guessed busy,
	// claimed all the same, without the reads (its driver reads them).
	end(b1)
	for range 4 {
		next, err := s.ClaimNext(ctx, "o", time.Minute, ctl)
		require.NoError(t, err)
		require.NotNil(t, next)
		end(next)
	}
	n, g, c = submit("b6")
	require.NotNil(t, c, "the scope is idle")
	require.Nil(t, c.Preread, "guessed busy: the driver reads")
	require.Equal(t, 4, n)
	require.Zero(t, g)
	run, err := s.GetRun(ctx, "b6")
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_RUNNING, run.GetState())
	end(c)
	n, g, c = submit("b7")
	require.NotNil(t, c)
	require.NotNil(t, c.Preread, "b6 headed the scope: read again")
	require.Equal(t, 13, n)
	require.Equal(t, 9, g)

	// After the memory, a queued submission's successor reads again.
	store.SetBusyScopeMemory(s, time.Nanosecond)
	for _, id := range []string{"b8", "b9"} {
		n, g, c = submit(id)
		require.Nil(t, c)
		require.Equal(t, 13, n, "%s: the scope's queued submission is forgotten at once", id)
		require.Equal(t, 9, g)
	}
}

// SPEC Q1 with P1's cheaper guard: the guard that sends a submission to
// admission under its company's lock applies exactly the row the limits
// come from — the company's own, else the default's — and only the limits
// admission checks (a warm-session limit only for a warm run). A company
// whose own row sets no such limit is not limited by the default's.
func TestQ1_TheAdmissionGuardAppliesTheCompanysRowElseTheDefaults(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	of := func(company, session string) *prpv1.ExecutionInput {
		in := input(session, "x")
		in.Binding.CompanyId = company
		return in
	}
	// The default row limits queued runs to 1: a company without a row
	// of its own is limited, one whose row sets only a weight is not.
	setLimits(t, s, store.CompanyLimits{Company: store.DefaultCompany, MaxQueuedRuns: intp(1)})
	setLimits(t, s, store.CompanyLimits{Company: "free", Weight: 3})
	for i := range 3 {
		_, err := s.Submit(ctx, fmt.Sprintf("free-%d", i), of("free", "busy"))
		require.NoError(t, err, "its own row has no queued limit")
	}
	_, err := s.Submit(ctx, "dflt-0", of("dflt", "busy"))
	require.NoError(t, err)
	_, err = s.Submit(ctx, "dflt-1", of("dflt", "busy"))
	requireQuotaRefused(t, err, failure.QuotaQueuedRuns)

	// A warm-session limit guards warm runs only.
	setLimits(t, s, store.CompanyLimits{Company: store.DefaultCompany})
	setLimits(t, s, store.CompanyLimits{Company: "warm", MaxWarmSessions: intp(1)})
	_, err = s.Submit(ctx, "warm-0", of("warm", "s1"))
	require.NoError(t, err)
	_, err = s.Submit(ctx, "warm-1", of("warm", "s2"))
	requireQuotaRefused(t, err, failure.QuotaWarmSessions)
	perTurn := of("warm", "s3")
	perTurn.Session.Lifecycle.Mode = prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN
	_, err = s.Submit(ctx, "warm-2", perTurn)
	require.NoError(t, err)
	_, err = s.Submit(ctx, "dflt-1", of("dflt", "busy"))
	require.NoError(t, err, "the default row no longer limits")
}

// SPEC L3: this release's store beside a schema before migration 00035
// (no admission guard function yet) submits without the guard, as before.
func TestL3_ASubmissionBesideASchemaWithoutTheAdmissionGuardIsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := store.Open(ctx, pgtest.NewDB(t, migratedUpTo(31)), runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	created, err := s.Submit(ctx, "old-schema-1", input("s", "x"))
	require.NoError(t, err)
	require.True(t, created)
	created, c, run, err := s.SubmitClaim(ctx, "old-schema-2", input("s2", "x"), "o", time.Minute, store.Controller{Addr: "127.0.0.1:1"},
		&store.AttachReads{PriorRuns: 4})
	require.NoError(t, err)
	require.True(t, created)
	require.NotNil(t, c)
	require.NotNil(t, run)
}

// SPEC P1, P4: the run before a run in its session scope is read with one
// backward probe of the scope's index, however many runs the table and
// the scope's neighbours hold: the generic plan (a prepared statement's
// after five executions) must not walk runs by submit_seq filtering by
// scope, which for the first run of a scope reads the whole table.
func TestP1_ThePreviousRunInAScopeIsOneProbeOfTheScopesIndex(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	// A skewed table: one scope with many runs, many small scopes, then
	// the first run of a new scope.
	_, err := s.Pool().Exec(ctx, `
INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
SELECT 'r' || g, 'acme', 's', CASE WHEN g % 2 = 0 THEN 'big' ELSE 'small-' || g % 200 END, 'LIFECYCLE_MODE_WARM', '\x00', 'd'
  FROM generate_series(1, 4000) g;
INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
VALUES ('head', 'acme', 'fresh', 'fresh', 'LIFECYCLE_MODE_WARM', '\x00', 'd');
ANALYZE executor.runs`)
	require.NoError(t, err)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE previous_in_scope(text) AS `+store.PreviousInScopeSQL)
	require.NoError(t, err)
	for _, run := range []string{"head", "r4000", "r3999", "r2"} {
		text := explainAnalyze(ctx, t, tx, `EXECUTE previous_in_scope('`+run+`')`)
		require.Contains(t, text, "runs_session_idx", "%s:\n%s", run, text)
		require.NotContains(t, text, "Rows Removed", "%s reads only the rows it returns:\n%s", run, text)
	}
	_, err = tx.Exec(ctx, `DEALLOCATE previous_in_scope`)
	require.NoError(t, err)
}

// tracedStore is a store of two connections whose batches r counts.
func tracedStore(t *testing.T) (*batchRows, *store.Store) {
	t.Helper()
	r := &batchRows{}
	s, err := store.Open(context.Background(), pgtest.NewDB(t, Migrator), runrules.New(), pgstore.MaxConns(2), func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = r
	})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return r, s
}
