package store_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/audit"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// runCreatedAt submits run id of session as if created at created (set
// before any event is stored), claims it, stores n events through
// AppendEvents and, when end, its run.terminal.
func runCreatedAt(t *testing.T, s *store.Store, id, session string, created time.Time, n int, end bool) store.Fence {
	t.Helper()
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, id, input(session, "x"))
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE executor.runs SET created_at = $2 WHERE run_id = $1`, id, created)
	require.NoError(t, err)
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, id, c.RunID)
	evs := make([]*prpv1.Event, n)
	for i := range evs {
		evs[i] = event(id, "runner-"+id, uint64(i+1), "item.delta", map[string]any{"i": i})
	}
	if n > 0 {
		res, err := s.AppendEvents(ctx, c.Fence, evs)
		require.NoError(t, err)
		require.Equal(t, n, res.Inserted)
	}
	if end {
		res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(id, "runner-"+id, uint64(n)+1, "run.terminal", map[string]any{
			"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
		require.NoError(t, err)
		require.True(t, res.Terminal)
	}
	return c.Fence
}

// partitionsOf lists the partitions holding run id's events.
func partitionsOf(t *testing.T, s *store.Store, id string) []string {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `SELECT DISTINCT tableoid::regclass::text FROM executor.events WHERE run_id = $1 ORDER BY 1`, id)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

func requireCode(t *testing.T, err error, code, constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, "%v", err)
	if constraint != "" {
		require.Equal(t, constraint, pgErr.ConstraintName, "%v", err)
	}
}

func auditClean(t *testing.T, s *store.Store) audit.Report {
	t.Helper()
	h, err := s.AuditRows(context.Background(), store.AuditFilter{})
	require.NoError(t, err)
	rep := audit.Check(h)
	require.True(t, rep.Clean(), "audit: %+v", rep.Violations)
	return rep
}

// TestL2_ARunsEventsLandInOnePartitionAndItsKeysStillRefuseAReplay: on a
// partitioned events table every row of a run — the fast path's batches,
// the careful path's run.terminal — lands in the partition of the run's
// creation week, and the partition's unique keys refuse what the table's
// did: a replayed batch (deduplicated, nothing stored twice), a row at a
// taken seq, a taken (source, source seq), a second run.terminal; a row
// whose key is not its run's creation time (which would put it in another
// partition, past those keys) is refused as well.
func TestL2_ARunsEventsLandInOnePartitionAndItsKeysStillRefuseAReplay(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	require.NoError(t, s.PartitionEvents(ctx, store.PartitionOptions{Cutoff: now.Add(-5 * store.PartitionWeek)}))
	partitioned, err := s.EventsPartitioned(ctx)
	require.NoError(t, err)
	require.True(t, partitioned)

	created := now.Add(-17 * 24 * time.Hour)
	f := runCreatedAt(t, s, "p1", "s1", created, 40, false)
	p1 := partitionsOf(t, s, "p1")
	runCreatedAt(t, s, "p2", "s2", now, 10, false)
	p2 := partitionsOf(t, s, "p2")
	require.Len(t, p1, 1, "every event of p1 in one partition")
	require.Len(t, p2, 1)
	require.NotEqual(t, p1, p2, "runs of other weeks, other partitions")
	var want string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT name FROM executor.event_partitions WHERE from_at <= $1 AND to_at > $1`, created).Scan(&want))
	require.Equal(t, "executor."+want, p1[0])

	// A replay of a stored batch stores nothing twice.
	replay := make([]*prpv1.Event, 40)
	for i := range replay {
		replay[i] = event("p1", "runner-p1", uint64(i+1), "item.delta", map[string]any{"i": i})
	}
	res, err := s.AppendEvents(ctx, f, replay)
	require.NoError(t, err)
	require.Equal(t, 0, res.Inserted)
	require.Equal(t, 40, res.Duplicates)
	res, err = s.AppendEvents(ctx, f, []*prpv1.Event{event("p1", "runner-p1", 41, "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	require.Len(t, partitionsOf(t, s, "p1"), 1)

	insert := func(seq, srcSeq int64, typ string, key time.Time) error {
		_, err := s.Pool().Exec(ctx, `
INSERT INTO executor.events (run_id, run_created_at, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
VALUES ('p1', $1, $2, $3, 'runner-p1', $4, 'x', $5, '\x00'::bytea, '\x00'::bytea)`, key, int64(f.Attempt), seq, srcSeq, typ)
		return err
	}
	var pkey, srcKey, termKey string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT $1 || '_pkey', $1 || '_source_key', $1 || '_one_terminal_idx'`, want).Scan(&pkey, &srcKey, &termKey))
	requireCode(t, insert(5, 1000, "item.delta", created), "23505", pkey)
	requireCode(t, insert(1000, 5, "item.delta", created), "23505", srcKey)
	require.True(t, store.IsEventsSourceKey(srcKey))
	requireCode(t, insert(1001, 1001, "run.terminal", created), "23505", termKey)
	require.True(t, store.IsOneTerminal(termKey))
	// The same rows under another key would land in another partition.
	requireCode(t, insert(5, 5, "item.delta", now), "23514", "events_run_created_at")
	requireCode(t, insert(1001, 1001, "run.terminal", now), "23514", "events_run_created_at")

	var rows int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.events WHERE run_id = 'p1'`).Scan(&rows))
	require.Equal(t, 41, rows)
	auditClean(t, s)
}

// TestL2_AnExpiredPartitionIsDroppedWhileAPinnedRunsEventsSurvive: the
// purge drops a weekly partition whose runs have all expired — the table
// goes, its runs' rows follow — and keeps one that holds a run retention
// keeps (its session's newest), whose events survive; that partition's
// expired runs go row by row.
func TestL2_AnExpiredPartitionIsDroppedWhileAPinnedRunsEventsSurvive(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	require.NoError(t, s.PartitionEvents(ctx, store.PartitionOptions{Cutoff: now.Add(-8 * store.PartitionWeek)}))
	// A day into the week of 6 and of 4 weeks ago.
	oldWeek := store.WeekStart(now.Add(-6 * store.PartitionWeek)).Add(24 * time.Hour)
	pinnedWeek := store.WeekStart(now.Add(-4 * store.PartitionWeek)).Add(24 * time.Hour)
	// oldWeek: two runs of s1 (a later run of s1 follows) and one of s3.
	runCreatedAt(t, s, "a1", "s1", oldWeek, 30, true)
	runCreatedAt(t, s, "a2", "s1", oldWeek.Add(time.Hour), 30, true)
	runCreatedAt(t, s, "x1", "s3", oldWeek.Add(2*time.Hour), 30, true)
	// pinnedWeek: p1 stays the newest run of s2; y1 of s3 expires.
	runCreatedAt(t, s, "y1", "s3", pinnedWeek, 20, true)
	runCreatedAt(t, s, "p1", "s2", pinnedWeek.Add(time.Hour), 20, true)
	// This week: the newest runs of s1 and s3.
	runCreatedAt(t, s, "a3", "s1", now, 5, true)
	runCreatedAt(t, s, "x2", "s3", now, 5, true)
	_, err := s.Pool().Exec(ctx, `UPDATE executor.runs SET ended_at = created_at + interval '1 hour' WHERE run_id IN ('a1', 'a2', 'x1', 'y1', 'p1')`)
	require.NoError(t, err)
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: 24 * time.Hour}, "test"))
	dropped := partitionsOf(t, s, "a1")[0]
	kept := partitionsOf(t, s, "p1")[0]

	c, err := (&retention.Purger{Store: s, Owner: "purger", Duty: 1}).Pass(ctx)
	require.NoError(t, err)
	// The old week's, and the past weeks' without runs.
	require.GreaterOrEqual(t, c.Partitions, int64(1), "%+v", c)

	var exists bool
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, dropped).Scan(&exists))
	require.False(t, exists, "the expired partition %s is dropped", dropped)
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, kept).Scan(&exists))
	require.True(t, exists, "the partition of a kept run stays")
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, s.Pool().QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	require.Equal(t, 0, count(`SELECT count(*) FROM executor.runs WHERE run_id IN ('a1', 'a2', 'x1', 'y1')`), "expired runs deleted")
	require.Equal(t, 21, count(`SELECT count(*) FROM executor.events WHERE run_id = 'p1'`), "the kept run's events survive")
	require.Equal(t, 0, count(`SELECT count(*) FROM executor.events WHERE run_id = 'y1'`), "the kept partition's expired run goes row by row")
	require.Equal(t, 12, count(`SELECT count(*) FROM executor.events WHERE run_id IN ('a3', 'x2')`))
	// Partitions exist ahead of time.
	parts, err := s.EventPartitions(ctx)
	require.NoError(t, err)
	require.True(t, parts[len(parts)-1].To.After(now.Add(store.PartitionsAhead)), "last partition ends %s", parts[len(parts)-1].To)
	auditClean(t, s)
}

// previousAppendSQL is the fast append statement of the previous release
// (v0.1.0): it names no run_created_at.
const previousAppendSQL = `
WITH fence AS (
  UPDATE executor.runs r SET event_count = r.event_count + $10, updated_at = now()
    FROM executor.coordinators c
   WHERE r.run_id = $1 AND c.run_id = r.run_id AND c.lease_owner = $2 AND c.attempt = $3 AND c.phase = 'observed'
  RETURNING r.event_count - $10 AS base),
ins AS (
  INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
  SELECT $1, $3, fence.base + k.ord, k.source_instance_id, k.source_seq, k.source_event_id, k.event_type, k.payload_sha256, k.event
    FROM fence, unnest($4::text[], $5::bigint[], $6::text[], $7::text[], $8::bytea[], $9::bytea[]) WITH ORDINALITY
         AS k(source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, ord)
  RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ins), coalesce((SELECT base FROM fence), 0)`

// TestL2_AnExecutorOfThePreviousReleaseKeepsAppendingThroughTheMigrationAndThePartitioningWaitsForIt:
// an executor of the previous release (its heartbeat and its append
// statement) drives a run on the schema before migration 00028, while
// 00028 is applied and after it, beside this release's appends; the
// partitioning step refuses while it is alive, and once it stopped
// partitions the table with the run's events (backfilled) in one
// partition. Its append would now be refused, which is why the step
// waits. The audit is clean throughout.
func TestL2_AnExecutorOfThePreviousReleaseKeepsAppendingThroughTheMigrationAndThePartitioningWaitsForIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t, migratedUpTo(27))
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	defer s.Close()

	// The previous release's replica heartbeats and drives run old-1.
	const oldOwner = "exec-old@v0.1.0"
	_, err = s.Pool().Exec(ctx, `INSERT INTO executor.replicas (owner, capacity) VALUES ($1, 8)`, oldOwner)
	require.NoError(t, err)
	old := previousSubmitClaim(ctx, t, s, "old-1", input("old", "x"), oldOwner)
	var mu sync.Mutex
	var oldSeq int64
	oldAppend := func(n int) error {
		mu.Lock()
		defer mu.Unlock()
		insts, seqs, ids, types, hashes, raws := []string{}, []int64{}, []string{}, []string{}, [][]byte{}, [][]byte{}
		for range n {
			oldSeq++
			raw, err := proto.Marshal(event("old-1", "runner-old", uint64(oldSeq), "item.delta", nil))
			if err != nil {
				return err
			}
			sum := sha256.Sum256(raw)
			insts, seqs, ids, types = append(insts, "runner-old"), append(seqs, oldSeq), append(ids, fmt.Sprintf("event_runner-old_%016d", oldSeq)), append(types, "item.delta")
			hashes, raws = append(hashes, sum[:]), append(raws, raw)
		}
		var fence, ins, base int64
		err := s.Pool().QueryRow(ctx, previousAppendSQL, "old-1", oldOwner, int64(old.Attempt), insts, seqs, ids, types, hashes, raws, int64(n)).Scan(&fence, &ins, &base)
		if err == nil && (fence != 1 || ins != int64(n)) {
			err = fmt.Errorf("previous release's append: fence %d, inserted %d of %d", fence, ins, n)
		}
		return err
	}
	require.NoError(t, oldAppend(20))

	// Migration 00028 while the old executor appends.
	stop := make(chan struct{})
	appended := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				appended <- nil
				return
			default:
			}
			if err := oldAppend(5); err != nil {
				appended <- err
				return
			}
		}
	}()
	require.NoError(t, store.Migrate(ctx, dsn))
	close(stop)
	require.NoError(t, <-appended)
	mu.Lock()
	before := oldSeq
	mu.Unlock()
	require.NoError(t, oldAppend(20), "the previous release appends on the migrated schema")
	var keyed int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.events e JOIN executor.runs r USING (run_id)
 WHERE e.run_id = 'old-1' AND e.seq > $1 AND e.run_created_at = r.created_at`, before).Scan(&keyed))
	require.Equal(t, 20, keyed, "its rows get their run's creation time")

	// This release's executor drives another run beside it.
	_, err = s.HeartbeatReplica(ctx, "exec-new", "", 8, time.Minute)
	require.NoError(t, err)
	_, _, err = s.SubmitRun(ctx, "new-1", input("new", "x"))
	require.NoError(t, err)
	nw, err := s.ClaimNext(ctx, "exec-new", time.Hour, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, "new-1", nw.RunID)
	_, err = s.AppendEvents(ctx, nw.Fence, []*prpv1.Event{event("new-1", "runner-new", 1, "item.delta", nil)})
	require.NoError(t, err)
	var unkeyed int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.events e JOIN executor.runs r USING (run_id)
 WHERE e.run_created_at IS DISTINCT FROM r.created_at`).Scan(&unkeyed))
	require.GreaterOrEqual(t, unkeyed, 20, "the rows from before 00028 lack the key")
	require.LessOrEqual(t, int64(unkeyed), before)

	// The step waits for the previous release.
	err = s.PartitionEvents(ctx, store.PartitionOptions{})
	var older *store.ErrOlderExecutorsAlive
	require.ErrorAs(t, err, &older)
	require.Equal(t, []string{oldOwner}, older.Owners)
	partitioned, err := s.EventsPartitioned(ctx)
	require.NoError(t, err)
	require.False(t, partitioned)

	// The old executor ends its run and stops.
	mu.Lock()
	oldSeq++
	mu.Unlock()
	res, err := s.AppendEvents(ctx, old.Fence, []*prpv1.Event{event("old-1", "runner-old", uint64(oldSeq), "run.terminal", map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded"})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	require.NoError(t, s.RemoveReplica(ctx, oldOwner))
	require.NoError(t, s.PartitionEvents(ctx, store.PartitionOptions{BackfillRuns: 1}))
	partitioned, err = s.EventsPartitioned(ctx)
	require.NoError(t, err)
	require.True(t, partitioned)
	require.Equal(t, []string{"executor." + store.LegacyPartition}, partitionsOf(t, s, "old-1"))
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.events e JOIN executor.runs r USING (run_id)
 WHERE e.run_created_at IS DISTINCT FROM r.created_at`).Scan(&unkeyed))
	require.Equal(t, 0, unkeyed, "backfilled")

	// This release goes on appending; the previous one could not.
	_, err = s.AppendEvents(ctx, nw.Fence, []*prpv1.Event{event("new-1", "runner-new", 2, "item.delta", nil)})
	require.NoError(t, err)
	_, _, err = s.SubmitRun(ctx, "new-2", input("new-2", "x"))
	require.NoError(t, err)
	n2, err := s.ClaimNext(ctx, "exec-new", time.Hour, store.Controller{})
	require.NoError(t, err)
	_, err = s.AppendEvents(ctx, n2.Fence, []*prpv1.Event{event("new-2", "runner-new-2", 1, "item.delta", nil)})
	require.NoError(t, err)
	require.Equal(t, []string{"executor." + store.LegacyPartition}, partitionsOf(t, s, "new-2"), "a run created before the cutoff (a week ahead at least) lands in the legacy partition")
	_, err = s.Pool().Exec(ctx, `INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
VALUES ('new-2', $1, 99, 'x', 99, 'x', 'item.delta', '\x00'::bytea, '\x00'::bytea)`, int64(n2.Attempt))
	requireCode(t, err, "23514", "")
	rep := auditClean(t, s)
	require.Equal(t, 3, rep.Runs)
}

// previousSubmitClaim submits and claims a run with the statements of a
// release before migration 00031 (coordinators without company_id, the
// claim without executor.claim_queued), as store.Submit and ClaimNext did.
func previousSubmitClaim(ctx context.Context, t *testing.T, s *store.Store, runID string, in *prpv1.ExecutionInput, owner string) *store.Claim {
	t.Helper()
	raw, err := proto.Marshal(in)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `
WITH ins AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
  VALUES ($1, $2, $3, $4, 'LIFECYCLE_MODE_WARM', $5, 'previous')
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq)
SELECT run_id, '', session_scope, submit_seq FROM ins`,
		runID, in.GetBinding().GetCompanyId(), in.GetSession().GetNormalizedSessionId(), scope.OfRun(runID, in), raw)
	require.NoError(t, err)
	c := &store.Claim{Fence: store.Fence{RunID: runID, Owner: owner}, Input: in}
	require.NoError(t, s.Pool().QueryRow(ctx, `
UPDATE executor.coordinators SET attempt = attempt + 1, lease_owner = $2, lease_expires_at = now() + interval '1 hour',
       phase = 'observed', started_at = now()
 WHERE run_id = $1 RETURNING attempt`, runID, owner).Scan(&c.Attempt))
	return c
}

// migratedUpTo is a test database migrator that applies the executor's
// migrations up to version (a schema of an earlier release).
func migratedUpTo(version int64) pgtest.Migrator {
	return pgtest.MigratorFunc(fmt.Sprintf("executor-upto-%05d", version), func(ctx context.Context, db *sql.DB) error {
		sub, err := fs.Sub(store.Migrations, "migrations")
		if err != nil {
			return err
		}
		p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithTableName("executor_goose_version"))
		if err != nil {
			return err
		}
		_, err = p.UpTo(ctx, version)
		return err
	})
}
