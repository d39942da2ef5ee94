package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// seedExpiredSQL stores $1 runs <prefix>1…<prefix>$1 of company bench,
// created at $4 and ended two days ago, in 10 session scopes (each scope's
// newest stays: the purge keeps it, and so the partition of $4 is pinned
// and these runs go row by row), with their coordinators (completed,
// attempt 1), and $2 events each.
const seedExpiredSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, state, created_at, ended_at, event_count)
  SELECT $3 || g, 'bench', 'old', $3 || 'scope-' || (g % 10), 'LIFECYCLE_MODE_WARM', '\x'::bytea, 'bench', 'succeeded',
         $4, now() - interval '2 days', $2
    FROM generate_series(1, $1::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, phase, attempt)
SELECT run_id, '', session_scope, submit_seq, 'completed', 1 FROM r`

// seedExpiredEventsSQL stores $2 events of each of runs <prefix>1…$1 in
// one statement.
const seedExpiredEventsSQL = `
INSERT INTO executor.events (run_id, run_created_at, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, writer_attempt)
SELECT $4 || (g / $2 + 1), $5, g % $2 + 1, 'seed', g % $2 + 1, 'seed-' || g, 'item.delta', '\x00'::bytea, $3, 1
  FROM generate_series(0, $1::int * $2::int - 1) g`

// seedExpired stores n expired runs of perRun events each, created at
// created, named prefix<i>.
func (b *bench) seedExpired(ctx context.Context, prefix string, n, perRun int, created time.Time, sample []byte) error {
	if _, err := b.raw.Exec(ctx, seedExpiredSQL, n, perRun, prefix, created); err != nil {
		return fmt.Errorf("seeding expired runs: %w", err)
	}
	if _, err := b.raw.Exec(ctx, seedExpiredEventsSQL, n, perRun, sample, prefix, created); err != nil {
		return fmt.Errorf("seeding expired events: %w", err)
	}
	return nil
}

// partitionEvents partitions the bench's events table as `executor
// migrate -partition-events` does (SPEC L2), its first weekly partition
// twelve weeks back when no event is stored yet (else the step's default:
// what is stored stays in the legacy partition).
func (b *bench) partitionEvents(ctx context.Context) error {
	var stored bool
	if err := b.raw.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM executor.events)`).Scan(&stored); err != nil {
		return err
	}
	o := store.PartitionOptions{Logf: func(f string, args ...any) { logf("partition-events: "+f, args...) }}
	if !stored {
		o.Cutoff = time.Now().Add(-12 * store.PartitionWeek)
	}
	return b.st.PartitionEvents(ctx, o)
}

// withPurge runs fn while one retention purge pass (the executor's, at its
// default pace) runs beside it, and returns what the pass deleted.
func (b *bench) withPurge(ctx context.Context, fn func() (measurement, error)) (measurement, store.PurgeCounts, error) {
	p := &retention.Purger{Store: b.st, Owner: "bench-purger"}
	if _, err := b.st.TakeJobLease(ctx, retention.Job, p.Owner, time.Hour); err != nil {
		return measurement{}, store.PurgeCounts{}, err
	}
	pctx, stop := context.WithCancel(ctx)
	type result struct {
		c   store.PurgeCounts
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := p.Pass(pctx)
		done <- result{c, err}
	}()
	m, err := fn()
	stop()
	r := <-done
	if r.err != nil && pctx.Err() == nil && err == nil {
		err = fmt.Errorf("purge: %w", r.err)
	}
	return m, r.c, err
}

// waitSampler samples, every 10 ms, what the appending backends (the fast
// append statement) wait on, whether an autovacuum worker runs and on
// what, and counts the checkpoints meanwhile.
type waitSampler struct {
	stopped chan struct{}
	done    chan string
}

func (b *bench) sampleWaits(ctx context.Context) *waitSampler {
	w := &waitSampler{stopped: make(chan struct{}), done: make(chan string, 1)}
	var cp0, buf0 int64
	_ = b.raw.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter`).Scan(&cp0, &buf0)
	go func() {
		waits := map[string]int{}
		vacuums := map[string]int{}
		samples, appending := 0, 0
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stopped:
				var cp1, buf1 int64
				_ = b.raw.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter`).Scan(&cp1, &buf1)
				var parts []string
				for k, n := range waits {
					parts = append(parts, fmt.Sprintf("%s=%.0f%%", k, 100*float64(n)/float64(max(appending, 1))))
				}
				sort.Strings(parts)
				var vac []string
				for k, n := range vacuums {
					vac = append(vac, fmt.Sprintf("%s=%.0f%%", k, 100*float64(n)/float64(max(samples, 1))))
				}
				sort.Strings(vac)
				w.done <- fmt.Sprintf("append_waits=%s autovacuum=%s checkpoints=%d checkpoint_buffers=%d samples=%d",
					strings.Join(parts, ","), strings.Join(append(vac, "none"), ","), cp1-cp0, buf1-buf0, samples)
				return
			case <-t.C:
			}
			rows, err := b.raw.Query(ctx, `
SELECT CASE WHEN a.backend_type = 'autovacuum worker' THEN 'vacuum' ELSE 'append' END,
       CASE WHEN a.backend_type = 'autovacuum worker' THEN coalesce(v.relid::regclass::text, 'analyze')
            ELSE coalesce(a.wait_event_type || ':' || a.wait_event, 'CPU') END
  FROM pg_stat_activity a LEFT JOIN pg_stat_progress_vacuum v ON v.pid = a.pid
 WHERE a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle'
   AND (a.backend_type = 'autovacuum worker' OR (a.state = 'active' AND a.query LIKE '%WITH fence AS%'))`)
			if err != nil {
				continue
			}
			samples++
			for rows.Next() {
				var kind, what string
				if rows.Scan(&kind, &what) == nil {
					if kind == "vacuum" {
						vacuums[what]++
					} else {
						waits[what]++
						appending++
					}
				}
			}
			rows.Close()
		}
	}()
	return w
}

func (w *waitSampler) stop() string {
	close(w.stopped)
	return <-w.done
}

// purgeImpact measures the hot path — event appends of a held run and
// claims of queued runs — with and without the retention purge deleting
// expired runs beside it (SPEC L1: at most 10 % slower), in alternating
// slices, and prints the ratios.
func (b *bench) purgeImpact(ctx context.Context) ([]curve, error) {
	appendOp, claimOp, err := b.purgeImpactOps(ctx)
	if err != nil {
		return nil, err
	}
	// The seeds' own aftermath (autovacuum of half a million fresh rows)
	// would otherwise land on whichever side is measured first.
	if _, err := b.raw.Exec(ctx, `VACUUM (ANALYZE) executor.runs, executor.coordinators, executor.events`); err != nil {
		return nil, err
	}
	b.settle(ctx)
	if _, err := timed(ctx, b.cfg.warmup, appendOp); err != nil {
		return nil, err
	}
	if _, err := timed(ctx, b.cfg.warmup, claimOp); err != nil {
		return nil, err
	}
	pr := &purgeBeside{p: &retention.Purger{Store: b.st, Owner: "bench-purger"}}
	pr.p.Batched = pr.add
	if _, err := b.st.TakeJobLease(ctx, retention.Job, pr.p.Owner, time.Hour); err != nil {
		return nil, err
	}
	// Per figure: -purge-cycles cycles of half a duration without and half
	// a duration with one purge pass running (long enough for several of
	// its duty cycles: a batch, then a sleep nine times as long), the
	// order swapped every cycle, so that the drift of a shared machine
	// falls on both sides alike.
	var order []bool
	for c := range max(b.cfg.purgeCycles, 1) {
		order = append(order, c%2 == 1, c%2 == 0)
	}
	app, appP, err := pr.alternate(ctx, order, b.cfg.duration/2, appendOp)
	if err != nil {
		return nil, fmt.Errorf("purge_impact append: %w", err)
	}
	clm, clmP, err := pr.alternate(ctx, order, b.cfg.duration/2, claimOp)
	if err != nil {
		return nil, fmt.Errorf("purge_impact claim: %w", err)
	}
	left := 0
	if err := b.raw.QueryRow(ctx, `SELECT count(*) FROM executor.runs WHERE run_id LIKE 'old-%'`).Scan(&left); err != nil {
		return nil, err
	}
	purged := pr.counts()
	logf("purge_impact: the purge deleted %d runs and %d events while measured (%d expired runs left)", purged.Runs, purged.Events, left-10)
	for _, f := range []struct {
		name          string
		unit          string
		without, with measurement
	}{{"event_append", "events/s", app, appP}, {"lease_claim", "claims/s", clm, clmP}} {
		ratio := f.with.rate() / f.without.rate()
		mark := "✓"
		if ratio < 0.9 {
			mark = "✗"
		}
		line := fmt.Sprintf("purge_impact %s (%s): without purge %s, with a purge running %s: %.2f× (target ≥ 0.90) %s",
			f.name, f.unit, num(f.without.rate()), num(f.with.rate()), ratio, mark)
		fmt.Fprintln(os.Stdout, line)
		b.absolute = append(b.absolute, line, fmt.Sprintf("BENCH purge_impact_%s without=%.1f with=%.1f ratio=%.3f target=0.90 met=%t purged_runs=%d purged_events=%d unit=%s",
			f.name, f.without.rate(), f.with.rate(), ratio, ratio >= 0.9, purged.Runs, purged.Events, f.unit))
	}
	return nil, nil
}

// purgeImpactOps seeds the purge's work (expired runs three weeks old: in
// a partition their scopes' newest runs pin, so they go row by row;
// dropping a whole partition costs next to nothing to measure) and
// returns the two measured operations: the appender (one held run,
// batches of -batch events) and the claimers (queued runs, each the head
// of its own scope).
func (b *bench) purgeImpactOps(ctx context.Context) (appendOp, claimOp func(context.Context) (int, error), _ error) {
	const expiredRuns, eventsPerRun = 1000, 500
	payload := payloadOf(b.cfg.payload)
	sample, err := proto.Marshal(&prpv1.Event{EventType: "item.delta", Payload: payload})
	if err != nil {
		return nil, nil, err
	}
	if err := b.partitionEvents(ctx); err != nil {
		return nil, nil, err
	}
	start := time.Now()
	if err := b.seedExpired(ctx, "old-", expiredRuns, eventsPerRun, time.Now().Add(-3*store.PartitionWeek), sample); err != nil {
		return nil, nil, err
	}
	logf("purge_impact: seeded %d expired runs with %d events in %s", expiredRuns, expiredRuns*eventsPerRun, time.Since(start).Round(time.Millisecond))
	if err := b.st.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour}, "bench"); err != nil {
		return nil, nil, err
	}
	if _, err := b.st.Submit(ctx, "purge-append", benchInput("purge-append")); err != nil {
		return nil, nil, err
	}
	claim, err := b.claim(ctx, "bench-purge-append", leaseTTL)
	if err != nil || claim == nil || claim.RunID != "purge-append" {
		return nil, nil, fmt.Errorf("claiming purge-append: %v %v", claim, err)
	}
	var seq uint64
	appendOp = func(ctx context.Context) (int, error) {
		evs := make([]*prpv1.Event, b.cfg.batch)
		for i := range evs {
			seq++
			evs[i] = &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "bench-purge", SourceSeq: seq,
				SourceEventId: fmt.Sprintf("purge_%016d", seq), SourceKind: "runner", RunId: "purge-append",
				EventType: "item.delta", SchemaVersion: 1, Priority: 1, Payload: payload}
		}
		r, err := b.st.AppendEvents(ctx, claim.Fence, evs)
		return r.Inserted, err
	}
	const queued = 100000
	scopes := make([]string, queued)
	for i := range scopes {
		scopes[i] = fmt.Sprintf("purge-claim-scope-%d", i)
	}
	if err := b.seedRuns(ctx, "purge-claim-", 1, queued, scopes); err != nil {
		return nil, nil, err
	}
	claimOp = func(ctx context.Context) (int, error) {
		c, err := b.claim(ctx, "bench-purge-claimer", leaseTTL)
		if err == nil && c == nil {
			err = errDry
		}
		return 1, err
	}
	return appendOp, claimOp, nil
}

// purgeBeside runs purge passes beside a measurement and counts what they
// deleted.
type purgeBeside struct {
	p      *retention.Purger
	mu     sync.Mutex
	purged store.PurgeCounts
}

func (pr *purgeBeside) add(c store.PurgeCounts) {
	pr.mu.Lock()
	pr.purged.Add(c)
	pr.mu.Unlock()
}

func (pr *purgeBeside) counts() store.PurgeCounts {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.purged
}

// with runs fn while a purge pass runs beside it.
func (pr *purgeBeside) with(ctx context.Context, fn func() (measurement, error)) (measurement, error) {
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := pr.p.Pass(pctx)
		done <- err
	}()
	m, err := fn()
	stop()
	if perr := <-done; perr != nil && pctx.Err() == nil {
		return m, fmt.Errorf("purge: %w", perr)
	}
	return m, err
}

// alternate measures op for half a duration per entry of order, with a
// purge pass beside it where order says so.
func (pr *purgeBeside) alternate(ctx context.Context, order []bool, half time.Duration, op func(context.Context) (int, error)) (without, with measurement, _ error) {
	for _, w := range order {
		var (
			m   measurement
			err error
		)
		if w {
			m, err = pr.with(ctx, func() (measurement, error) { return timed(ctx, half, op) })
			with.add(m)
		} else {
			m, err = timed(ctx, half, op)
			without.add(m)
		}
		if err != nil {
			return without, with, err
		}
	}
	return without, with, nil
}
