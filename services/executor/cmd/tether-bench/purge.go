package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// seedExpiredSQL stores $1 runs old-1…old-$1 of company bench that ended
// two days ago, in 10 session scopes (each scope's newest stays: the purge
// keeps it), with their coordinators (completed, attempt 1).
const seedExpiredSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, state, ended_at, event_count)
  SELECT 'old-' || g, 'bench', 'old', 'old-scope-' || (g % 10), 'LIFECYCLE_MODE_WARM', '\x'::bytea, 'bench', 'succeeded',
         now() - interval '2 days', $2
    FROM generate_series(1, $1::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, phase, attempt)
SELECT run_id, '', session_scope, submit_seq, 'completed', 1 FROM r`

// seedExpiredEventsSQL stores $2 events of each of runs old-1…old-$1 in
// one statement.
const seedExpiredEventsSQL = `
INSERT INTO executor.events (run_id, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, writer_attempt)
SELECT 'old-' || (g / $2 + 1), g % $2 + 1, 'seed', g % $2 + 1, 'seed-' || g, 'item.delta', '\x00'::bytea, $3, 1
  FROM generate_series(0, $1::int * $2::int - 1) g`

// purgeImpact measures the hot path — event appends of a held run and
// claims of queued runs — with and without the retention purge deleting
// expired runs beside it (SPEC L1: at most 10 % slower), in alternating
// slices, and prints the ratios.
func (b *bench) purgeImpact(ctx context.Context) ([]curve, error) {
	const expiredRuns, eventsPerRun = 1000, 500
	payload := payloadOf(b.cfg.payload)
	sample, err := proto.Marshal(&prpv1.Event{EventType: "item.delta", Payload: payload})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := b.raw.Exec(ctx, seedExpiredSQL, expiredRuns, eventsPerRun); err != nil {
		return nil, fmt.Errorf("seeding expired runs: %w", err)
	}
	if _, err := b.raw.Exec(ctx, seedExpiredEventsSQL, expiredRuns, eventsPerRun, sample); err != nil {
		return nil, fmt.Errorf("seeding expired events: %w", err)
	}
	logf("purge_impact: seeded %d expired runs with %d events in %s", expiredRuns, expiredRuns*eventsPerRun, time.Since(start).Round(time.Millisecond))
	if err := b.st.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour}, "bench"); err != nil {
		return nil, err
	}
	// The appender: one held run, batches of -batch events.
	if _, err := b.st.Submit(ctx, "purge-append", benchInput("purge-append")); err != nil {
		return nil, err
	}
	claim, err := b.claim(ctx, "bench-purge-append", leaseTTL)
	if err != nil || claim == nil || claim.RunID != "purge-append" {
		return nil, fmt.Errorf("claiming purge-append: %v %v", claim, err)
	}
	var seq uint64
	appendOp := func(ctx context.Context) (int, error) {
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
	// The claimers: queued runs, each the head of its own scope.
	const queued = 100000
	scopes := make([]string, queued)
	for i := range scopes {
		scopes[i] = fmt.Sprintf("purge-claim-scope-%d", i)
	}
	if err := b.seedRuns(ctx, "purge-claim-", 1, queued, scopes); err != nil {
		return nil, err
	}
	claimOp := func(ctx context.Context) (int, error) {
		c, err := b.claim(ctx, "bench-purge-claimer", leaseTTL)
		if err == nil && c == nil {
			err = errDry
		}
		return 1, err
	}
	b.settle(ctx)
	if _, err := timed(ctx, b.cfg.warmup, appendOp); err != nil {
		return nil, err
	}
	if _, err := timed(ctx, b.cfg.warmup, claimOp); err != nil {
		return nil, err
	}

	var (
		mu     sync.Mutex
		purged store.PurgeCounts
	)
	p := &retention.Purger{Store: b.st, Owner: "bench-purger", Batched: func(c store.PurgeCounts) {
		mu.Lock()
		purged.Add(c)
		mu.Unlock()
	}}
	if _, err := b.st.TakeJobLease(ctx, retention.Job, p.Owner, time.Hour); err != nil {
		return nil, err
	}
	// withPurge runs fn while a purge pass runs beside it.
	withPurge := func(fn func() (measurement, error)) (measurement, error) {
		pctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := p.Pass(pctx)
			done <- err
		}()
		m, err := fn()
		stop()
		if perr := <-done; perr != nil && pctx.Err() == nil {
			return m, fmt.Errorf("purge: %w", perr)
		}
		return m, err
	}
	// Per figure: half a duration without, a whole duration with one purge
	// pass running (long enough for its duty cycle: a batch, then a sleep
	// nine times as long), half a duration without again.
	half := b.cfg.duration / 2
	var app, appP, clm, clmP measurement
	measure := func(op func(context.Context) (int, error), acc, accP *measurement) error {
		for _, with := range []bool{false, true, false} {
			var (
				m   measurement
				err error
			)
			if with {
				m, err = withPurge(func() (measurement, error) { return timed(ctx, 2*half, op) })
				accP.add(m)
			} else {
				m, err = timed(ctx, half, op)
				acc.add(m)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := measure(appendOp, &app, &appP); err != nil {
		return nil, fmt.Errorf("purge_impact append: %w", err)
	}
	if err := measure(claimOp, &clm, &clmP); err != nil {
		return nil, fmt.Errorf("purge_impact claim: %w", err)
	}
	left := 0
	if err := b.raw.QueryRow(ctx, `SELECT count(*) FROM executor.runs WHERE run_id LIKE 'old-%'`).Scan(&left); err != nil {
		return nil, err
	}
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
