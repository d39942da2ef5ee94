package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Raw baseline SQL. The tables copy the executor's (columns, defaults,
// primary keys, unique and partial indexes) but not its foreign keys or
// triggers; the raw claim gets an index for its own queue order.
const (
	rawSchemaSQL = `
DROP SCHEMA IF EXISTS tether_bench CASCADE;
CREATE SCHEMA tether_bench;
CREATE TABLE tether_bench.coordinators (LIKE executor.coordinators INCLUDING ALL) WITH (fillfactor = 50);
-- The raw claim's own queue index (executor's claim walks session heads).
CREATE INDEX ON tether_bench.coordinators (submit_seq) WHERE phase IN ('queued', 'retryable_failure');
CREATE TABLE tether_bench.events (LIKE executor.events INCLUDING ALL);
CREATE TABLE tether_bench.runs (LIKE executor.runs INCLUDING ALL);`

	rawSeedQueuedSQL = `
INSERT INTO tether_bench.coordinators (run_id, next_attempt_at, session_scope, submit_seq, company_id)
SELECT $1 || lpad(g::text, 6, '0'), now() - interval '1 hour' + g * interval '1 millisecond', $1 || g::text, g, 'bench'
  FROM generate_series(1, $2::int) g`

	rawClaimSQL = `
UPDATE tether_bench.coordinators c
   SET attempt = c.attempt + 1, lease_owner = $1, lease_expires_at = now() + $2 * interval '1 microsecond',
       phase = 'observed'
 WHERE c.run_id = (
   SELECT run_id FROM tether_bench.coordinators
    WHERE phase IN ('queued', 'retryable_failure') AND next_attempt_at <= now()
    ORDER BY submit_seq
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING c.run_id, c.attempt, c.lease_expires_at`

	rawSeedLeasesSQL = `
INSERT INTO tether_bench.coordinators (run_id, phase, attempt, lease_owner, lease_expires_at, session_scope, submit_seq, company_id)
SELECT $1 || lpad(g::text, 6, '0'), 'observed', 1, $3, now() + interval '1 hour', $1 || g::text, g, 'bench'
  FROM generate_series(1, $2::int) g`

	rawRenewSQL = `
UPDATE tether_bench.coordinators c
   SET lease_expires_at = now() + $2 * interval '1 microsecond'
  FROM unnest($1::text[]) AS l(run_id)
 WHERE c.run_id = l.run_id`

	rawInsertEventsSQL = `
INSERT INTO tether_bench.events (run_id, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bytea[])`
)

const leaseTTL = time.Hour // nothing expires while we measure

type bench struct {
	cfg   config
	st    *store.Store
	claim claimFn
	raw   *pgxpool.Pool
	dsn   string        // the database, for the processes the curves start
	exe   *executorProc // the executor the unary figures call
	// absolute are BENCH lines of curve points with absolute targets.
	absolute []string
}

// measurement is ops done in elapsed time.
type measurement struct {
	ops     int64
	elapsed time.Duration
}

func (m *measurement) add(o measurement) { m.ops += o.ops; m.elapsed += o.elapsed }

func (m measurement) rate() float64 {
	if m.elapsed <= 0 {
		return 0
	}
	return float64(m.ops) / m.elapsed.Seconds()
}

type result struct {
	name, unit  string
	tether, raw measurement
	target      float64 // minimum tether/raw
	// p99Limit, when set, is the maximum tether/raw of the p99 latencies.
	p99Limit          float64
	tetherP99, rawP99 time.Duration
}

func (r result) p99Ratio() float64 {
	if r.rawP99 == 0 {
		return 0
	}
	return float64(r.tetherP99) / float64(r.rawP99)
}

func (r result) ratio() float64 {
	if r.raw.rate() == 0 {
		return 0
	}
	return r.tether.rate() / r.raw.rate()
}

// claimFn claims the next due run for owner.
type claimFn func(ctx context.Context, owner string, ttl time.Duration) (*store.Claim, error)

// claimFunc binds store.ClaimNext to this process's controller identity,
// as the executor's dispatcher claims.
func claimFunc(st *store.Store) claimFn {
	ctl := dispatch.SelfController()
	return func(ctx context.Context, owner string, ttl time.Duration) (*store.Claim, error) {
		return st.ClaimNext(ctx, owner, ttl, ctl)
	}
}

// leaseClaim is figure 1.
func (b *bench) leaseClaim(ctx context.Context) (result, error) {
	res := result{name: "lease_claim", unit: "claims/s", target: 0.70}
	total := b.cfg.claims + b.cfg.claimWarmup
	logf("lease_claim: seeding %d queued runs in distinct sessions (store.SubmitRun) and %d raw rows", total, total)
	if err := b.submitRuns(ctx, "claim-", total); err != nil {
		return res, err
	}
	if _, err := b.raw.Exec(ctx, rawSeedQueuedSQL, "claim-", total); err != nil {
		return res, err
	}
	b.settle(ctx)

	tether := func(ctx context.Context, owner string) error {
		c, err := b.claim(ctx, owner, leaseTTL)
		if err == nil && c == nil {
			err = errDry
		}
		return err
	}
	raw := func(ctx context.Context, owner string) error {
		var (
			id      string
			attempt int64
			exp     time.Time
		)
		err := b.raw.QueryRow(ctx, rawClaimSQL, owner, leaseTTL.Microseconds()).Scan(&id, &attempt, &exp)
		if err != nil {
			return fmt.Errorf("raw claim: %w", err)
		}
		return nil
	}
	claimer := func(w int) string { return fmt.Sprintf("bench-claimer-%d", w) }
	if _, err := parallel(ctx, b.cfg.workers, b.cfg.claimWarmup, claimer, tether); err != nil {
		return res, fmt.Errorf("lease_claim warm-up: %w", err)
	}
	if _, err := parallel(ctx, b.cfg.workers, b.cfg.claimWarmup, claimer, raw); err != nil {
		return res, fmt.Errorf("lease_claim warm-up: %w", err)
	}
	b.settle(ctx)
	per := func(slice int) int {
		n := b.cfg.claims / b.cfg.slices
		if slice == b.cfg.slices-1 {
			n += b.cfg.claims % b.cfg.slices
		}
		return n
	}
	var err error
	res.tether, res.raw, err = alternate(b.cfg.slices,
		func(i int) (measurement, error) { return parallel(ctx, b.cfg.workers, per(i), claimer, tether) },
		func(i int) (measurement, error) { return parallel(ctx, b.cfg.workers, per(i), claimer, raw) })
	if err != nil {
		return res, fmt.Errorf("lease_claim: %w", err)
	}
	// Every seeded run is claimed now: nothing is left for the next figures.
	logf("lease_claim: tether %d claims in %s, raw %d in %s (%d workers each)",
		res.tether.ops, res.tether.elapsed.Round(time.Millisecond), res.raw.ops, res.raw.elapsed.Round(time.Millisecond), b.cfg.workers)
	return res, nil
}

// leaseRenewal is figure 2.
func (b *bench) leaseRenewal(ctx context.Context) (result, error) {
	res := result{name: "lease_renewal", unit: "renewals/s", target: 0.90}
	const owner = "bench-renewer"
	n := b.cfg.leases
	logf("lease_renewal: claiming %d leases for one owner (store.SubmitRun + ClaimNext) and seeding %d raw leases", n, n)
	if err := b.submitRuns(ctx, "renew-", n); err != nil {
		return res, err
	}
	var (
		mu     sync.Mutex
		leases []store.Lease
	)
	_, err := parallel(ctx, b.cfg.workers, n, func(int) string { return owner }, func(ctx context.Context, owner string) error {
		c, err := b.claim(ctx, owner, leaseTTL)
		if err == nil && c == nil {
			err = errDry
		}
		if err != nil {
			return err
		}
		if !strings.HasPrefix(c.RunID, "renew-") {
			return fmt.Errorf("claimed %s, not one of the renewal runs", c.RunID)
		}
		mu.Lock()
		leases = append(leases, store.Lease{RunID: c.RunID, Attempt: c.Attempt})
		mu.Unlock()
		return nil
	})
	if err != nil {
		return res, err
	}
	if _, err := b.raw.Exec(ctx, rawSeedLeasesSQL, "renew-", n, owner); err != nil {
		return res, err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("renew-%06d", i+1)
	}
	b.settle(ctx)

	tether := func(ctx context.Context) (int, error) {
		renewed, err := b.st.RenewLeases(ctx, owner, leases, leaseTTL)
		if err != nil {
			return 0, err
		}
		if len(renewed) != n {
			return 0, fmt.Errorf("RenewLeases renewed %d of %d leases", len(renewed), n)
		}
		return n, nil
	}
	raw := func(ctx context.Context) (int, error) {
		tag, err := b.raw.Exec(ctx, rawRenewSQL, ids, leaseTTL.Microseconds())
		if err != nil {
			return 0, fmt.Errorf("raw renew: %w", err)
		}
		if tag.RowsAffected() != int64(n) {
			return 0, fmt.Errorf("raw renew updated %d of %d leases", tag.RowsAffected(), n)
		}
		return n, nil
	}
	res.tether, res.raw, err = b.timedFigure(ctx, tether, raw)
	if err != nil {
		return res, fmt.Errorf("lease_renewal: %w", err)
	}
	logf("lease_renewal: tether %d ticks in %s, raw %d in %s (%d leases per statement)",
		res.tether.ops/int64(n), res.tether.elapsed.Round(time.Millisecond), res.raw.ops/int64(n), res.raw.elapsed.Round(time.Millisecond), n)
	return res, nil
}

// eventPersistence is figure 3.
func (b *bench) eventPersistence(ctx context.Context) (result, error) {
	res := result{name: "event_persistence", unit: "events/s", target: 0.60}
	const (
		runID    = "events-000001"
		instance = "bench-runnerd-1"
		evType   = "item.delta"
	)
	if err := b.submitRuns(ctx, "events-", 1); err != nil {
		return res, err
	}
	c, err := b.claim(ctx, "bench-driver", leaseTTL)
	if err == nil && c == nil {
		err = errDry
	}
	if err != nil {
		return res, err
	}
	if c.RunID != runID {
		return res, fmt.Errorf("claimed %s, want %s", c.RunID, runID)
	}
	fence := c.Fence
	payload := payloadOf(b.cfg.payload)
	event := func(seq uint64) *prpv1.Event {
		return &prpv1.Event{
			Schema: "tether.prp.event.v1", SourceInstanceId: instance, SourceSeq: seq,
			SourceEventId: fmt.Sprintf("event_%s_%016d", instance, seq), SourceKind: "runner",
			RunId: runID, EventType: evType, SchemaVersion: 1, Priority: 1, Payload: payload,
		}
	}
	// The raw rows carry bytes of the same size as tether's (one encoding of
	// a representative event), so the baseline pays no encoding at all.
	sample, err := proto.MarshalOptions{Deterministic: true}.Marshal(event(1 << 20))
	if err != nil {
		return res, err
	}
	sampleSum := sha256.Sum256(sample)
	logf("event_persistence: %d events per batch, payload %d B, encoded event %d B; one driver per side",
		b.cfg.batch, proto.Size(payload), len(sample))
	b.settle(ctx)

	batch := b.cfg.batch
	var tetherSeq uint64
	tether := func(ctx context.Context) (int, error) {
		evs := make([]*prpv1.Event, batch)
		for i := range evs {
			tetherSeq++
			evs[i] = event(tetherSeq)
		}
		r, err := b.st.AppendEvents(ctx, fence, evs)
		if err != nil {
			return 0, err
		}
		if r.Inserted != batch {
			return 0, fmt.Errorf("AppendEvents inserted %d of %d events", r.Inserted, batch)
		}
		return batch, nil
	}
	var rawSeq int64
	raw := func(ctx context.Context) (int, error) {
		seqs := make([]int64, batch)
		insts := make([]string, batch)
		ids := make([]string, batch)
		types := make([]string, batch)
		sums := make([][]byte, batch)
		raws := make([][]byte, batch)
		for i := range seqs {
			rawSeq++
			seqs[i], insts[i], types[i], sums[i], raws[i] = rawSeq, instance, evType, sampleSum[:], sample
			ids[i] = fmt.Sprintf("event_%s_%016d", instance, rawSeq)
		}
		tag, err := b.raw.Exec(ctx, rawInsertEventsSQL, runID, seqs, insts, seqs, ids, types, sums, raws)
		if err != nil {
			return 0, fmt.Errorf("raw insert: %w", err)
		}
		if tag.RowsAffected() != int64(batch) {
			return 0, fmt.Errorf("raw insert stored %d of %d events", tag.RowsAffected(), batch)
		}
		return batch, nil
	}
	res.tether, res.raw, err = b.timedFigure(ctx, tether, raw)
	if err != nil {
		return res, fmt.Errorf("event_persistence: %w", err)
	}
	logf("event_persistence: tether %d batches in %s, raw %d in %s",
		res.tether.ops/int64(batch), res.tether.elapsed.Round(time.Millisecond), res.raw.ops/int64(batch), res.raw.elapsed.Round(time.Millisecond))
	return res, nil
}

// payloadOf is a struct payload whose encoding is n bytes (or just under).
func payloadOf(n int) *structpb.Struct {
	mk := func(l int) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"text": structpb.NewStringValue(strings.Repeat("x", l))}}
	}
	l := n
	for l > 0 && proto.Size(mk(l)) > n {
		l--
	}
	return mk(l)
}

// submitRuns queues n runs named prefix000001… through store.SubmitRun, each
// in its own session, with the claim workers in parallel.
func (b *bench) submitRuns(ctx context.Context, prefix string, n int) error {
	var next atomic.Int64
	_, err := parallel(ctx, b.cfg.workers, n, func(int) string { return "" }, func(ctx context.Context, _ string) error {
		i := next.Add(1)
		id := fmt.Sprintf("%s%06d", prefix, i)
		in := &prpv1.ExecutionInput{
			Provider: &prpv1.Provider{Kind: "codex"},
			Binding:  &prpv1.Binding{CompanyId: "bench", AgentId: "agent-1"},
			Task:     &prpv1.Task{Prompt: "benchmark turn " + id},
			Session: &prpv1.Session{NormalizedSessionId: "session-" + id,
				Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
		}
		_, created, err := b.st.SubmitRun(ctx, id, in)
		if err == nil && !created {
			err = fmt.Errorf("run %s already existed", id)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("submitting runs: %w", err)
	}
	return nil
}

// settle refreshes planner statistics and flushes dirty pages so that a
// checkpoint is less likely to land inside a measurement. It runs after
// seeding and again after warm-up: plans made while a table was still empty
// (executor.events before the first batch) would otherwise measure stale
// statistics rather than the statements; autovacuum would only catch up
// after the bench. CHECKPOINT needs privileges a TETHER_DATABASE_URL user may
// lack; that is fine.
func (b *bench) settle(ctx context.Context) {
	_, _ = b.raw.Exec(ctx, `ANALYZE executor.runs, executor.coordinators, executor.events, tether_bench.coordinators, tether_bench.events`)
	_, _ = b.raw.Exec(ctx, `CHECKPOINT`)
}

// timedFigure warms both sides up, then alternates timed slices of each.
func (b *bench) timedFigure(ctx context.Context, tether, raw func(context.Context) (int, error)) (t, r measurement, err error) {
	if _, err := timed(ctx, b.cfg.warmup, tether); err != nil {
		return t, r, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := timed(ctx, b.cfg.warmup, raw); err != nil {
		return t, r, fmt.Errorf("warm-up: %w", err)
	}
	b.settle(ctx)
	slice := b.cfg.duration / time.Duration(b.cfg.slices)
	return alternate(b.cfg.slices,
		func(int) (measurement, error) { return timed(ctx, slice, tether) },
		func(int) (measurement, error) { return timed(ctx, slice, raw) })
}

// alternate runs slices of tether and raw, the first side switching each
// slice, and sums them.
func alternate(slices int, tether, raw func(slice int) (measurement, error)) (t, r measurement, err error) {
	for i := range slices {
		steps := []struct {
			fn  func(int) (measurement, error)
			acc *measurement
		}{{tether, &t}, {raw, &r}}
		if i%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, s := range steps {
			m, err := s.fn(i)
			if err != nil {
				return t, r, err
			}
			s.acc.add(m)
		}
	}
	return t, r, nil
}

// timed repeats op back to back for d.
func timed(ctx context.Context, d time.Duration, op func(context.Context) (int, error)) (measurement, error) {
	var m measurement
	start := time.Now()
	for time.Since(start) < d {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		n, err := op(ctx)
		if err != nil {
			return m, err
		}
		m.ops += int64(n)
	}
	m.elapsed = time.Since(start)
	return m, nil
}

// parallel runs op n times in total over workers goroutines; worker w passes
// owner(w). It stops at the first error.
func parallel(ctx context.Context, workers, n int, owner func(w int) string, op func(context.Context, string) error) (measurement, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			name := owner(w)
			for next.Add(1) <= int64(n) {
				if err := op(ctx, name); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	m := measurement{ops: int64(n), elapsed: time.Since(start)}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return m, firstErr
}
