package main

// -curves: how tether's costs grow with its work. Each curve measures one
// cost at a few sizes of the thing it may grow with and prints the values,
// then the ratio of the value at the largest size to the value at the
// smallest (1.0 is flat; a linear cost grows with the size ratio):
//
//   - claim_attempt: p50 and p99 of one ClaimNext that finds nothing due,
//     with 10 busy sessions and 1k/10k/100k runs queued behind them.
//   - fair_share: company B's submit → claim p50 and p99 while company A
//     has 0/1k/10k/100k due runs queued, with simulated in-process drivers
//     (fairness.go): the claim in isolation. The same curve through the
//     whole stack, to turn.started, is tether-bench-stack -fairness.
//   - watch_delivery: p99 from the start of AppendEvents of one event to its
//     arrival at each of 1/100/1,000 WatchRun streams of the run, served by
//     a real executor process (-executor); that process's CPU per event and
//     the database transactions per second while the watchers sit idle.
//   - event_append: events/s of AppendEvents (batches of -batch) with 0 and
//     -append-rows rows already in executor.events.
//   - lease_renewal: time of one RenewLeases of 100/1k/10k held leases.
//
// Blocked runs, prior events and held leases are seeded with set-based
// INSERTs (the bench's own SQL, as the raw baselines are), so the curves
// take a few minutes, not the hours SubmitRun would. Output per curve:
//
//	curve <name> (<unit>) vs <x>: <x1>: <v1>  <x2>: <v2> …  largest/smallest <ratio>× [target ≤ <t>× ✓|✗]
//	BENCH curve_<name> <x>=<x1>,<x2>,… values=<v1>,<v2>,… ratio=<largest/smallest> target=<t> met=<bool> unit=<unit>

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// curve is one measured cost at increasing sizes.
type curve struct {
	name, unit, x string
	xs            []int
	values        []float64
	target        float64 // maximum largest/smallest; 0: none
}

func (c curve) ratio() float64 {
	if len(c.values) == 0 || c.values[0] == 0 {
		return 0
	}
	return c.values[len(c.values)-1] / c.values[0]
}

func (c curve) met() bool { return c.target == 0 || c.ratio() <= c.target }

func (c curve) print(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "curve %s (%s) vs %s:", c.name, c.unit, c.x)
	for i, x := range c.xs {
		fmt.Fprintf(&b, "  %s: %s", thousands(float64(x)), num(c.values[i]))
	}
	fmt.Fprintf(&b, "  largest/smallest %.2f×", c.ratio())
	if c.target > 0 {
		mark := "✓"
		if !c.met() {
			mark = "✗"
		}
		fmt.Fprintf(&b, " (target ≤ %.0f×) %s", c.target, mark)
	}
	fmt.Fprintln(w, b.String())
}

func (c curve) bench(w io.Writer) {
	xs := make([]string, len(c.xs))
	vs := make([]string, len(c.values))
	for i := range c.xs {
		xs[i], vs[i] = strconv.Itoa(c.xs[i]), strconv.FormatFloat(c.values[i], 'f', 3, 64)
	}
	fmt.Fprintf(w, "BENCH curve_%s %s=%s values=%s ratio=%.3f target=%.2f met=%t unit=%s\n",
		c.name, c.x, strings.Join(xs, ","), strings.Join(vs, ","), c.ratio(), c.target, c.met(), c.unit)
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return thousands(v)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// percentile of ds (p in 0..100).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// curves runs every curve and prints them.
func (b *bench) curves(ctx context.Context) error {
	var out []curve
	steps := []struct {
		name string
		fn   func(context.Context) ([]curve, error)
	}{
		{"claim_attempt", b.claimCurve},
		{"fair_share", b.fairnessCurve},
		{"lease_renewal", b.renewalCurve},
		{"event_append", b.appendCurve},
		{"watch_delivery", b.watchCurve},
		{"purge_impact", b.purgeImpact},
	}
	for _, s := range steps {
		if !b.cfg.curveSet[s.name] {
			continue
		}
		cs, err := s.fn(ctx)
		if err != nil {
			return fmt.Errorf("curve %s: %w", s.name, err)
		}
		for _, c := range cs {
			c.print(os.Stdout) // as each is measured
		}
		out = append(out, cs...)
	}
	fmt.Println()
	for _, c := range out {
		c.print(os.Stdout)
	}
	fmt.Println()
	for _, c := range out {
		c.bench(os.Stdout)
	}
	for _, l := range b.absolute {
		fmt.Println(l)
	}
	return nil
}

// benchInput is the input of every seeded run.
func benchInput(session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "bench", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "benchmark turn"},
		Session: &prpv1.Session{NormalizedSessionId: session,
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

// seedRunsSQL queues runs prefix<from>…prefix<to>, run g in session
// scopes[g % len(scopes)], each with its coordinator (the submission path's
// triggers run as for Submit).
const seedRunsSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
  SELECT $1 || g, 'bench', 'bench', ($4::text[])[g % cardinality($4::text[]) + 1], 'LIFECYCLE_MODE_WARM', $5, 'bench'
    FROM generate_series($2::int, $3::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq)
SELECT run_id, '', session_scope, submit_seq FROM r ORDER BY submit_seq`

// seedRuns queues runs prefix<from>…prefix<to> in the given scopes, in
// chunks of 10,000.
func (b *bench) seedRuns(ctx context.Context, prefix string, from, to int, scopes []string) error {
	raw, err := proto.Marshal(benchInput("bench"))
	if err != nil {
		return err
	}
	for lo := from; lo <= to; lo += 10000 {
		if _, err := b.raw.Exec(ctx, seedRunsSQL, prefix, lo, min(lo+9999, to), scopes, raw); err != nil {
			return err
		}
	}
	return nil
}

// claimCurve: empty claim attempts with a blocked backlog.
func (b *bench) claimCurve(ctx context.Context) ([]curve, error) {
	const busy = 10
	p50 := curve{name: "claim_attempt_p50", unit: "ms", x: "blocked_runs", target: 2}
	p99 := curve{name: "claim_attempt_p99", unit: "ms", x: "blocked_runs"}
	scopes := make([]string, busy)
	for i := range busy {
		id := fmt.Sprintf("busy-%d", i)
		in := benchInput(id)
		if _, err := b.st.Submit(ctx, id, in); err != nil {
			return nil, err
		}
		scopes[i] = scope.OfRun(id, in)
	}
	for range busy {
		c, err := b.claim(ctx, "bench-busy", leaseTTL)
		if err != nil {
			return nil, err
		}
		if c == nil || !strings.HasPrefix(c.RunID, "busy-") {
			return nil, fmt.Errorf("claimed %v, want a busy-* run", c)
		}
	}
	seeded := 0
	for _, n := range b.cfg.backlogs {
		if err := b.seedRuns(ctx, "blocked-", seeded+1, n, scopes); err != nil {
			return nil, err
		}
		seeded = n
		b.settle(ctx)
		var lat []time.Duration
		for i := range b.cfg.attempts + b.cfg.attempts/10 {
			t0 := time.Now()
			c, err := b.claim(ctx, "bench-claimer", leaseTTL)
			d := time.Since(t0)
			if err != nil {
				return nil, err
			}
			if c != nil {
				return nil, fmt.Errorf("claimed %s behind a busy session", c.RunID)
			}
			if i >= b.cfg.attempts/10 { // the first tenth warms up
				lat = append(lat, d)
			}
		}
		logf("claim_attempt: %d blocked runs: p50 %.3f ms, p99 %.3f ms (%d attempts)",
			n, ms(percentile(lat, 50)), ms(percentile(lat, 99)), len(lat))
		p50.xs, p50.values = append(p50.xs, n), append(p50.values, ms(percentile(lat, 50)))
		p99.xs, p99.values = append(p99.xs, n), append(p99.values, ms(percentile(lat, 99)))
	}
	return []curve{p50, p99}, nil
}

// seedLeasesSQL makes runs prefix<from>…prefix<to>, each its own session,
// observed under owner with attempt 1.
const seedLeasesSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
  SELECT $1 || g, 'bench', 'bench', $1 || g, 'LIFECYCLE_MODE_WARM', '\x'::bytea, 'bench'
    FROM generate_series($2::int, $3::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, phase, attempt, lease_owner, lease_expires_at)
SELECT run_id, '', session_scope, submit_seq, 'observed', 1, $4, now() + interval '1 hour' FROM r`

// renewalCurve: one RenewLeases of all held leases.
func (b *bench) renewalCurve(ctx context.Context) ([]curve, error) {
	const owner = "bench-curve-renewer"
	c := curve{name: "lease_renewal_tick", unit: "ms", x: "leases"}
	held := 0
	var leases []store.Lease
	for _, n := range b.cfg.leaseSizes {
		if _, err := b.raw.Exec(ctx, seedLeasesSQL, "lease-", held+1, n, owner); err != nil {
			return nil, err
		}
		for i := held + 1; i <= n; i++ {
			leases = append(leases, store.Lease{RunID: "lease-" + strconv.Itoa(i), Attempt: 1})
		}
		held = n
		b.settle(ctx)
		var lat []time.Duration
		for i := range b.cfg.ticks + 5 {
			t0 := time.Now()
			renewed, err := b.st.RenewLeases(ctx, owner, leases, leaseTTL)
			d := time.Since(t0)
			if err != nil {
				return nil, err
			}
			if len(renewed) != n {
				return nil, fmt.Errorf("renewed %d of %d leases", len(renewed), n)
			}
			if i >= 5 {
				lat = append(lat, d)
			}
		}
		logf("lease_renewal_tick: %d leases: p50 %.3f ms", n, ms(percentile(lat, 50)))
		c.xs, c.values = append(c.xs, n), append(c.values, ms(percentile(lat, 50)))
	}
	return []curve{c}, nil
}

// seedPriorRunsSQL makes runs prior-<from>…prior-<to>, each its own
// session (so each is its session's newest: retention keeps it), observed
// under nobody (never claimable), created $3 minus 1…10 weeks (by run
// number): history spread over ten weekly partitions (SPEC L2).
const seedPriorRunsSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, created_at)
  SELECT 'prior-' || g, 'bench', 'bench', 'prior-' || g, 'LIFECYCLE_MODE_WARM', '\x'::bytea, 'bench', $3::timestamptz - (g % 10 + 1) * interval '1 week'
    FROM generate_series($1::int, $2::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, phase, attempt, lease_owner, lease_expires_at)
SELECT run_id, '', session_scope, submit_seq, 'observed', 1, 'bench-nobody', now() + interval '1 hour' FROM r`

// seedPriorEventsSQL stores events $1…$2-1 of the prior runs, event g
// being event g%10000+1 of run prior-<g/10000>, in one statement, each
// with its run's creation time (seedPriorRunsSQL's rule, same $4).
const seedPriorEventsSQL = `
INSERT INTO executor.events (run_id, run_created_at, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event, writer_attempt)
SELECT 'prior-' || (g / 10000), $4::timestamptz - ((g / 10000) % 10 + 1) * interval '1 week',
       g % 10000 + 1, 'seed', g % 10000 + 1, 'seed-' || g, 'item.delta', '\x00'::bytea, $3, 1
  FROM generate_series($1::bigint, $2::bigint - 1) g`

// appendCurve: AppendEvents throughput with prior rows in the table, each
// size measured without and with a retention purge running beside it
// (SPEC L2). The events table is partitioned by run creation week (what
// `executor migrate -partition-events` makes): the prior rows are ten
// weeks of history, the measured run is this week's. Each size also
// reports what the appending backends waited on and what else the server
// did meanwhile (autovacuum, checkpoints), sampled every 10 ms.
func (b *bench) appendCurve(ctx context.Context) ([]curve, error) {
	c := curve{name: "event_append", unit: "events/s", x: "prior_rows"}
	cp := curve{name: "event_append_with_purge", unit: "events/s", x: "prior_rows"}
	if !b.cfg.appendTable {
		if err := b.partitionEvents(ctx); err != nil {
			return nil, err
		}
	}
	in := benchInput("append-curve")
	if _, err := b.st.Submit(ctx, "append-curve", in); err != nil {
		return nil, err
	}
	claim, err := b.claim(ctx, "bench-append", leaseTTL)
	if err != nil || claim == nil || claim.RunID != "append-curve" {
		return nil, fmt.Errorf("claiming append-curve: %v %v", claim, err)
	}
	payload := payloadOf(b.cfg.payload)
	sample, err := proto.Marshal(&prpv1.Event{EventType: "item.delta", Payload: payload})
	if err != nil {
		return nil, err
	}
	if err := b.st.SetRetention(ctx, store.RetentionPolicy{Company: store.DefaultCompany, RunRetention: time.Hour}, "bench"); err != nil {
		return nil, err
	}
	// Every prior run exists from the start (their events come size by
	// size): a week of history without runs would be an expired partition,
	// which the purge drops.
	history := time.Now()
	if top := slices.Max(b.cfg.appendRows); top > 0 {
		if _, err := b.raw.Exec(ctx, seedPriorRunsSQL, 0, (top-1)/10000, history); err != nil {
			return nil, err
		}
	}
	var seq uint64
	var prior int64
	for i, rows := range b.cfg.appendRows {
		if add := int64(rows) - prior; add > 0 {
			if err := b.seedPriorEvents(ctx, prior, rows, sample, history, b.appendOpOf(&seq, claim.Fence, payload)); err != nil {
				return nil, err
			}
		}
		prior = max(prior, int64(rows))
		// Work for the purge: 200 expired runs of 500 events, three weeks
		// old, in a partition pinned by prior runs (row-wise deletes, the
		// purge's costly path).
		expired := b.cfg.appendExpiredRuns
		if expired <= 0 {
			expired = 200
		}
		if err := b.seedExpired(ctx, fmt.Sprintf("exp%d-", i), expired, 500, history.Add(-3*store.PartitionWeek), sample); err != nil {
			return nil, err
		}
		b.settle(ctx)
		op := b.appendOpOf(&seq, claim.Fence, payload)
		if _, err := timed(ctx, b.cfg.warmup, op); err != nil {
			return nil, err
		}
		w := b.sampleWaits(ctx)
		without, with, purged, err := b.appendWithoutAndWithPurge(ctx, op)
		if err != nil {
			return nil, err
		}
		waits := w.stop()
		logf("event_append: %d prior rows: %.0f events/s without a purge, %.0f with one running (it deleted %d runs, %d events); %s",
			rows, without.rate(), with.rate(), purged.Runs, purged.Events, waits)
		b.absolute = append(b.absolute, fmt.Sprintf("BENCH event_append_waits prior_rows=%d %s", rows, waits))
		c.xs, c.values = append(c.xs, rows), append(c.values, without.rate())
		cp.xs, cp.values = append(cp.xs, rows), append(cp.values, with.rate())
	}
	return []curve{c, cp}, nil
}

// seedPriorEvents adds the prior events up to rows (from prior): they
// belong to other runs, 10,000 each, held by nobody (observed runs: never
// claimable, never purged), stored by one INSERT … SELECT generate_series
// (the statement triggers check them once). op is the curve's append.
func (b *bench) seedPriorEvents(ctx context.Context, prior int64, rows int, sample []byte, history time.Time, op func(context.Context) (int, error)) error {
	add := int64(rows) - prior
	logf("event_append: seeding %d prior events", add)
	start := time.Now()
	if _, err := b.raw.Exec(ctx, seedPriorEventsSQL, prior, int64(rows), sample, history); err != nil {
		return err
	}
	logf("event_append: seeded %d prior events in %s", add, time.Since(start).Round(time.Millisecond))
	b.absolute = append(b.absolute, fmt.Sprintf("BENCH event_append_seed rows=%d seconds=%.1f", add, time.Since(start).Seconds()))
	// Right after the seed, then after vacuuming it. Rows that
	// arrive one statement of millions at a time are vacuumed
	// after it, not as they come: until then appends share the
	// disk with autovacuum reading and rewriting every page of
	// the seed (hint bits, visibility map, full-page images after
	// a checkpoint), which the first figure shows; the curve's
	// figure is the second.
	if err := b.freshAppend(ctx, rows, op); err != nil {
		return err
	}
	start = time.Now()
	if _, err := b.raw.Exec(ctx, `VACUUM (ANALYZE) executor.events`); err != nil {
		return err
	}
	logf("event_append: vacuumed the seeded rows in %s", time.Since(start).Round(time.Millisecond))
	b.absolute = append(b.absolute, fmt.Sprintf("BENCH event_append_seed_vacuum rows=%d seconds=%.1f", add, time.Since(start).Seconds()))
	return nil
}

// appendWithoutAndWithPurge measures op a quarter of -duration without a
// purge, half with one running beside it, and a quarter without again.
func (b *bench) appendWithoutAndWithPurge(ctx context.Context, op func(context.Context) (int, error)) (without, with measurement, purged store.PurgeCounts, _ error) {
	for _, purge := range []bool{false, true, false} {
		if !purge {
			m, err := timed(ctx, b.cfg.duration/4, op)
			if err != nil {
				return without, with, purged, err
			}
			without.add(m)
			continue
		}
		m, pc, err := b.withPurge(ctx, func() (measurement, error) { return timed(ctx, b.cfg.duration/2, op) })
		if err != nil {
			return without, with, purged, err
		}
		with.add(m)
		purged.Add(pc)
	}
	return without, with, purged, nil
}

// appendOp is one AppendEvents of -batch events of the append curve's run.
func (b *bench) appendOpOf(seq *uint64, f store.Fence, payload *structpb.Struct) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		evs := make([]*prpv1.Event, b.cfg.batch)
		for i := range evs {
			*seq++
			evs[i] = &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "bench-append", SourceSeq: *seq,
				SourceEventId: fmt.Sprintf("append_%016d", *seq), SourceKind: "runner", RunId: f.RunID,
				EventType: "item.delta", SchemaVersion: 1, Priority: 1, Payload: payload}
		}
		r, err := b.st.AppendEvents(ctx, f, evs)
		if err != nil {
			return 0, err
		}
		return r.Inserted, nil
	}
}

// freshAppend measures appends right after a seed, before it is vacuumed.
func (b *bench) freshAppend(ctx context.Context, rows int, op func(context.Context) (int, error)) error {
	b.settle(ctx)
	w := b.sampleWaits(ctx)
	m, err := timed(ctx, b.cfg.duration/4, op)
	waits := w.stop()
	if err != nil {
		return err
	}
	logf("event_append: %d prior rows, right after the seed (not vacuumed yet): %.0f events/s; %s", rows, m.rate(), waits)
	b.absolute = append(b.absolute, fmt.Sprintf("BENCH event_append_unvacuumed prior_rows=%d rate=%.1f %s", rows, m.rate(), waits))
	return nil
}

// watchCurve: WatchRun fan-out from a real executor process.
func (b *bench) watchCurve(ctx context.Context) ([]curve, error) {
	p99 := curve{name: "watch_delivery_p99", unit: "ms", x: "watchers"}
	cpu := curve{name: "watch_executor_cpu", unit: "pct_core", x: "watchers"}
	idle := curve{name: "watch_idle_db_xacts", unit: "xact/s", x: "watchers"}
	if _, err := b.st.Submit(ctx, "watch-curve", benchInput("watch-curve")); err != nil {
		return nil, err
	}
	claim, err := b.claim(ctx, "bench-watch", leaseTTL)
	if err != nil || claim == nil || claim.RunID != "watch-curve" {
		return nil, fmt.Errorf("claiming watch-curve: %v %v", claim, err)
	}
	exe, err := startExecutor(ctx, b.cfg.executor, b.dsn)
	if err != nil {
		return nil, err
	}
	defer exe.stop()
	conns := map[int]io.Closer{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	maxSeq := len(b.cfg.watchers)*(b.cfg.watchEvents+1) + 1
	rig := &watchRig{b: b, fence: claim.Fence, exe: exe, maxSeq: maxSeq, base: time.Now(), got: make([]atomic.Int32, maxSeq+1)}
	for _, n := range b.cfg.watchers {
		if err := rig.addStreams(wctx, conns, n); err != nil {
			return nil, err
		}
		// Every stream is live once it has an event appended now.
		if _, s, err := rig.appendOne(ctx); err != nil {
			return nil, err
		} else if err := rig.waitAll(s); err != nil {
			return nil, err
		}
		xps, idleCPU, err := rig.idle(ctx)
		if err != nil {
			return nil, err
		}
		l, err := rig.live(ctx)
		if err != nil {
			return nil, err
		}
		logf("watch_delivery: %d watchers: p50 %.3f ms, p99 %.3f ms (AppendEvents itself: p50 %.3f ms, p99 %.3f ms; an event's last watcher: p50 %.3f ms; since AppendEvents returned: p50 %.3f ms, p99 %.3f ms); executor CPU %.1f %% of a core at one event per %s (the bench, with its %s receivers: %.1f %%); idle: %.1f xact/s, executor CPU %.1f %%",
			n, ms(percentile(l.lat, 50)), ms(percentile(l.lat, 99)), ms(percentile(rig.commit, 50)), ms(percentile(rig.commit, 99)), ms(percentile(l.slowest, 50)), ms(percentile(l.after, 50)), ms(percentile(l.after, 99)), l.cpu, b.cfg.watchPace, b.cfg.watchClient, l.recv, xps, idleCPU)
		p99.xs, p99.values = append(p99.xs, n), append(p99.values, ms(percentile(l.lat, 99)))
		cpu.xs, cpu.values = append(cpu.xs, n), append(cpu.values, l.cpu)
		idle.xs, idle.values = append(idle.xs, n), append(idle.values, xps)
	}
	last := p99.values[len(p99.values)-1]
	logf("watch_delivery: p99 at %d watchers %.3f ms (target ≤ 15 ms: %t)", p99.xs[len(p99.xs)-1], last, last <= 15)
	b.absolute = append(b.absolute, fmt.Sprintf("BENCH watch_delivery_p99_at_max watchers=%d p99_ms=%.3f target_ms=15 met=%t",
		p99.xs[len(p99.xs)-1], last, last <= 15))
	return []curve{p99, cpu, idle}, nil
}

// watchRig is the watch curve's run and its streams. Each stream's reader
// writes the arrival of seq s (time since base) into its own slot, then
// counts it in got[s]: no lock among readers.
type watchRig struct {
	b        *bench
	fence    store.Fence
	exe      *executorProc
	maxSeq   int
	base     time.Time
	got      []atomic.Int32
	arrivals [][]time.Duration // per stream, by seq
	streams  int
	seq      uint64
	commit   []time.Duration // AppendEvents' own time, per live event
}

// appendOne appends the run's next event; it returns when AppendEvents
// started and the event's seq.
func (w *watchRig) appendOne(ctx context.Context) (time.Time, uint64, error) {
	w.seq++
	t0 := time.Now()
	defer func() { w.commit = append(w.commit, time.Since(t0)) }()
	_, err := w.b.st.AppendEvents(ctx, w.fence, []*prpv1.Event{{Schema: "tether.prp.event.v1",
		SourceInstanceId: "bench-watch", SourceSeq: w.seq, SourceEventId: fmt.Sprintf("watch_%016d", w.seq),
		SourceKind: "runner", RunId: "watch-curve", EventType: "item.delta", SchemaVersion: 1, Priority: 1,
		Payload: payloadOf(w.b.cfg.payload)}})
	return t0, w.seq, err
}

// waitAll waits until every stream has s.
func (w *watchRig) waitAll(s uint64) error {
	deadline := time.Now().Add(time.Minute)
	n := 0
	for time.Now().Before(deadline) {
		if n = int(w.got[s].Load()); n >= w.streams {
			return nil
		}
		time.Sleep(200 * time.Microsecond)
	}
	return fmt.Errorf("event %d reached %d of %d watchers in a minute", s, n, w.streams)
}

// addStreams opens watches until there are n (100 streams per
// connection).
func (w *watchRig) addStreams(ctx context.Context, conns map[int]io.Closer, n int) error {
	for ; w.streams < n; w.streams++ {
		at := make([]time.Duration, w.maxSeq+1)
		w.arrivals = append(w.arrivals, at)
		onSeq := func(s uint64) {
			if s <= uint64(w.maxSeq) {
				at[s] = time.Since(w.base)
				w.got[s].Add(1)
			}
		}
		if err := w.b.openWatch(ctx, conns, w.streams/100, w.exe.addr, w.seq, onSeq); err != nil {
			return err
		}
	}
	return nil
}

// idle measures the database's transactions per second and the
// executor's CPU (percent of a core) while the watches idle. A backend
// reports its transactions to pg_stat_database up to 10 s after them when
// it goes idle: that is waited out first, so the watches' start (GetRun,
// replay) is not counted as idle.
func (w *watchRig) idle(ctx context.Context) (xps, cpuPct float64, _ error) {
	b := w.b
	time.Sleep(b.cfg.idleSettle)
	x0, err := xacts(ctx, b.raw)
	if err != nil {
		return 0, 0, err
	}
	c0 := w.exe.cpu()
	t0 := time.Now()
	time.Sleep(b.cfg.idle)
	x1, err := xacts(ctx, b.raw)
	if err != nil {
		return 0, 0, err
	}
	idleCPU := w.exe.cpu() - c0
	idleSecs := time.Since(t0).Seconds()
	return float64(x1-x0) / idleSecs, 100 * idleCPU.Seconds() / idleSecs, nil
}

// liveWatch is one size's live measurement: every arrival since
// AppendEvents started (lat) and since it returned (after), each event's
// last arrival (slowest), and the executor's and this process's CPU.
type liveWatch struct {
	lat, after, slowest []time.Duration
	cpu, recv           float64
}

// live appends -watch-events events, one at a time, paced, and measures
// their delivery to every stream.
func (w *watchRig) live(ctx context.Context) (*liveWatch, error) {
	b := w.b
	l := &liveWatch{}
	w.commit = w.commit[:0]
	c1, r1, w1 := w.exe.cpu(), procCPU(os.Getpid()), time.Now()
	for i := range b.cfg.watchEvents {
		if wait := time.Until(w1.Add(time.Duration(i) * b.cfg.watchPace)); wait > 0 {
			time.Sleep(wait)
		}
		t0, s, err := w.appendOne(ctx)
		if err != nil {
			return nil, err
		}
		if err := w.waitAll(s); err != nil {
			return nil, err
		}
		var last time.Duration
		committed := w.commit[len(w.commit)-1]
		for _, at := range w.arrivals[:w.streams] {
			d := at[s] - t0.Sub(w.base)
			l.lat, last = append(l.lat, d), max(last, d)
			l.after = append(l.after, d-committed)
		}
		l.slowest = append(l.slowest, last)
	}
	l.cpu = 100 * float64(w.exe.cpu()-c1) / float64(time.Since(w1))
	l.recv = 100 * float64(procCPU(os.Getpid())-r1) / float64(time.Since(w1))
	return l, nil
}

// openWatch opens one WatchRun stream of the watch curve's run after seq on
// connection ci (dialled on first use) with the -watch-client receiver;
// onSeq gets each response's seq as it arrives.
func (b *bench) openWatch(ctx context.Context, conns map[int]io.Closer, ci int, addr string, after uint64, onSeq func(uint64)) error {
	if b.cfg.watchClient == "h2" {
		if conns[ci] == nil {
			c, err := dialH2(addr)
			if err != nil {
				return err
			}
			conns[ci] = c
		}
		return conns[ci].(*h2Conn).watch("watch-curve", after, onSeq)
	}
	if conns[ci] == nil {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		conns[ci] = c
	}
	s, err := executorv1.NewExecutorServiceClient(conns[ci].(*grpc.ClientConn)).WatchRun(ctx,
		&executorv1.WatchRunRequest{RunId: "watch-curve", AfterSeq: after}, grpc.ForceCodec(seqOnlyCodec{}))
	if err != nil {
		return err
	}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			onSeq(m.GetSeq())
		}
	}()
	return nil
}

// seqOnlyCodec decodes only the seq of a WatchRunResponse (field 1), so
// the bench's 1,000 client streams cost little CPU beside the executor's;
// requests are encoded as usual.
type seqOnlyCodec struct{}

func (seqOnlyCodec) Name() string { return "proto" }

func (seqOnlyCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (seqOnlyCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*executorv1.WatchRunResponse)
	if !ok {
		return proto.Unmarshal(data, v.(proto.Message))
	}
	seq, err := seqOf(data)
	m.Seq = seq
	return err
}

// xacts is the database's committed transactions so far.
func xacts(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	// The statistics snapshot is per transaction: clear it to see fresh counts.
	if _, err := pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return 0, err
	}
	err := pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// executorProc is an executor process serving WatchRun.
type executorProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// startExecutor starts bin at a free loopback port on dsn and waits until it
// answers.
func startExecutor(ctx context.Context, bin, dsn string) (*executorProc, error) {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		bin = filepath.Join(filepath.Dir(self), "executor")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("the watch curve needs the executor binary (-executor; make build): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	// The executor signs gateway grants with a key it requires; no gateway
	// is called here.
	keys, err := os.MkdirTemp("", "tether-bench-keys-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(keys) // read at start, before this returns
	key := filepath.Join(keys, "grant.key")
	if _, err := grant.WriteKeyPair(key, filepath.Join(keys, "grant.pub")); err != nil {
		return nil, err
	}
	metrics := "" // TETHER_BENCH_EXECUTOR_PPROF=host:port serves the executor's profiles there
	if a := os.Getenv("TETHER_BENCH_EXECUTOR_PPROF"); a != "" {
		metrics = a
	}
	cmd := exec.Command(bin, "-grpc-addr", addr, "-metrics-addr", metrics, "-pprof="+strconv.FormatBool(metrics != ""), "-database-url", dsn,
		"-idle-sweep-interval", "0", "-gateway-addr", "127.0.0.1:1", "-grant-key-file", key, "-log-format", "json")
	cmd.Env = append(os.Environ(), "TETHER_DATABASE_URL=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := procgroup.Start(cmd); err != nil {
		return nil, err
	}
	p := &executorProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	var tail []string
	var tailMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			tailMu.Lock()
			tail = append(tail[max(len(tail)-9, 0):], sc.Text())
			tailMu.Unlock()
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = executorv1.NewExecutorServiceClient(c).GetRun(cctx, &executorv1.GetRunRequest{RunId: "readiness-probe"})
			cancel()
			c.Close()
			if status.Code(err) == codes.NotFound { // answering from its database
				return p, nil
			}
		}
		select {
		case <-p.done:
			tailMu.Lock()
			defer tailMu.Unlock()
			return nil, fmt.Errorf("the executor exited: %s", strings.Join(tail, "\n"))
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, errors.New("the executor did not answer within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpu is the process's user+system CPU time so far.
func (p *executorProc) cpu() time.Duration { return procCPU(p.cmd.Process.Pid) }

// procCPU is process pid's user+system CPU time so far.
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the whole line.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func (p *executorProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		procgroup.Kill(p.cmd.Process.Pid)
		<-p.done
	}
}
