package main

// -fairness 0,1000,10000,100000 (SPEC Q3 through the whole stack): company
// B's SubmitRun → turn.started while company A has 0, 1,000, 10,000 and
// 100,000 runs queued, every one of them heading its own session scope
// (all due: the worst case for B; before Q3 the claim was FIFO over due
// heads and B's run waited behind all of A's).
//
// What is held equal, so that the figure means "B's latency does not depend
// on A's backlog" and not "a busy box is slower than an idle one":
//
//   - The fleet is saturated by A at every point. The executor drives at
//     most -fair-slots runs at once (its -max-active-runs), and A keeps that
//     many runs in flight at every size of its backlog, 0 included: a
//     feeder polls A's runs in flight (a few rows of
//     coordinators_company_running_idx, every 10 ms) and submits one new
//     run of A (SubmitRun, through the API) for each that ended. With a
//     backlog that keeps the queue at its size; without one it refills the
//     freed slot. A's runs are cold per-turn sessions (runnerd and the fake
//     provider start for each, and stop once the run settled: the
//     executor's session.close, answered): the fleet's CPU is spent the
//     same way at 0 and at 100,000. The gateway keeps its default idle
//     timeout unless -fair-runner-idle sets one (until 2026-12-07 the
//     close after the terminal was mostly lost and the bench set 3 s, so
//     that hundreds of lingering runners did not slow each later point).
//   - B competes for slots: its run finds them all taken by A and waits for
//     the next to free; the fair-share claim must then pick B's one due run
//     among A's 100,000 due heads (B's virtual time is behind A's, so B's
//     run takes the first or second freed slot). At 0 it competes with A's
//     refill instead (submitted up to one poll after the slot freed, so the
//     baseline slightly favours B: the ratio is the conservative one).
//   - B runs one warm session (its runnerd and provider stay up): each of
//     its runs is a warm turn submitted -fair-interval after the previous
//     one ended. Its latency is so the wait for a slot (on average half the
//     interval at which A's runs end, printed as the floor), the claim, and
//     the warm turn's start.
//
// A's backlog is seeded in SQL (1,000 rows a statement): copies of a run
// SubmitRun stored for A, with only the run id, its client id and the
// session (each run of A is in a session of its own, named as the run, so
// each heads its scope), the session scope and the input (the template's
// with that session, and its digest) changed; the row triggers keep scope heads and
// company_state as a submission does. The backlog only grows between
// points (the feeder keeps it constant within one), and it is counted
// before each point, outside the measurement.

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/store"
)

const (
	fairA, fairB = "fair-a", "fair-b"
	// fairPoll is how often the feeder looks for A's ended runs.
	fairPoll = 10 * time.Millisecond
)

// fairSeedSQL queues copies of A's template run $1: run ids $2, each in
// its own session $3 with session scope $4, input $5 and its digest $6. The
// columns are those SubmitRun writes (store.submitSQL), the template's
// except the run's key, its client id, its session and its input.
const fairSeedSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest,
                             issue_id, agent_id, trace_parent, submitted_by, client_run_id)
  SELECT ids.run_id, t.company_id, ids.session, ids.scope, t.lifecycle, ids.input, ids.digest,
         t.issue_id, t.agent_id, t.trace_parent, t.submitted_by, ids.run_id
    FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[]) WITH ORDINALITY AS ids(run_id, session, scope, input, digest, n)
    CROSS JOIN (SELECT * FROM executor.runs WHERE run_id = $1) t
   ORDER BY ids.n
  RETURNING run_id, session_scope, submit_seq, company_id)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, company_id)
SELECT r.run_id, tc.binding_digest, r.session_scope, r.submit_seq, r.company_id
  FROM r CROSS JOIN (SELECT binding_digest FROM executor.coordinators WHERE run_id = $1) tc
 ORDER BY r.submit_seq`

// fairQueuedSQL counts a company's due heads (its backlog).
const fairQueuedSQL = `SELECT count(*) FROM executor.coordinators
 WHERE company_id = $1 AND scope_head AND phase IN ('queued', 'retryable_failure')`

// fairRunningSQL lists a company's runs in flight.
const fairRunningSQL = `SELECT run_id FROM executor.coordinators WHERE company_id = $1 AND phase = 'observed'`

// fairSplitSQL splits B's runs of a point at their claim, on the
// database's clock.
const fairSplitSQL = `
SELECT extract(epoch FROM c.started_at - r.created_at) * 1000, extract(epoch FROM e.created_at - c.started_at) * 1000
  FROM executor.runs r
  JOIN executor.coordinators c ON c.run_id = r.run_id
  JOIN LATERAL (SELECT min(e.created_at) AS created_at FROM executor.events e
                 WHERE e.run_id = r.run_id AND e.event_type = 'turn.started') e ON true
 WHERE r.company_id = $1 AND r.run_id LIKE $2`

// parseSizes reads increasing backlog sizes ≥ 0 ("0,1000,10000").
func parseSizes(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || (len(out) > 0 && n <= out[len(out)-1]) {
			return nil, fmt.Errorf("want increasing counts ≥ 0, got %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// ended returns the runs of before that are not in now (A's runs in flight
// at two polls: those that ended, or went back to the queue, in between).
func ended(before, now []string) []string {
	in := make(map[string]bool, len(now))
	for _, id := range now {
		in[id] = true
	}
	var out []string
	for _, id := range before {
		if !in[id] {
			out = append(out, id)
		}
	}
	return out
}

// fairPoint is one size of A's backlog and what was measured at it.
type fairPoint struct {
	size     int // A's backlog asked for
	queued   int // A's due heads counted before the point
	lat      []time.Duration
	aEnded   int     // A's runs that ended while B's runs were measured
	inFlight float64 // A's runs in flight, mean over the feeder's polls
	elapsed  time.Duration
	load     string // /proc/loadavg at the end of the point
	// B's submit → claim and claim → turn.started persisted (ms, the
	// database's clock: runs.created_at, coordinators.started_at,
	// events.created_at): the wait for a slot and the claim, then the start.
	toClaim, toStarted []time.Duration
}

// slotEvery is the mean interval at which A's runs ended (a slot freed).
func (p fairPoint) slotEvery() time.Duration {
	if p.aEnded == 0 {
		return 0
	}
	return p.elapsed / time.Duration(p.aEnded)
}

// fairness runs the curve on a stack whose executor drives -fair-slots runs
// at most.
func fairness(ctx context.Context, f *benchFlags, client executorv1.ExecutorServiceClient, dsn string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// B's warm session: its runnerd and provider start here, not in a
	// measured run.
	if err := fairTurn(ctx, client, fairB+"-open", nil); err != nil {
		return fmt.Errorf("opening B's session: %w", err)
	}
	aIn, err := cli.InputSpec{Prompt: f.fairPrompt, Company: fairA, Agent: "bench", Session: fairA, Lifecycle: "per_turn"}.Input()
	if err != nil {
		return err
	}
	fd := &fairFeeder{client: client, pool: pool, in: aIn, ready: make(chan struct{})}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	feedErr := make(chan error, 1)
	go func() { feedErr <- fd.run(fctx, f.fairSlots) }()
	template := fd.first(ctx)
	if template == "" {
		return fmt.Errorf("company A's first run was not submitted: %w", <-feedErr)
	}
	var points []fairPoint
	seeded := 0
	for _, n := range f.fairSizes {
		var queued int
		if err := pool.QueryRow(ctx, fairQueuedSQL, fairA).Scan(&queued); err != nil {
			return err
		}
		stopKeep := keepWarm(ctx, client, fmt.Sprintf("%s-keep-%d", fairB, n))
		if add := n - queued; add > 0 {
			t0 := time.Now()
			if err := seedFair(ctx, pool, template, seeded, add); err != nil {
				return fmt.Errorf("seeding A's backlog: %w", err)
			}
			seeded += add
			fmt.Printf("fairness: seeded %d runs of A in %s\n", add, time.Since(t0).Round(time.Millisecond))
			_, _ = pool.Exec(ctx, `ANALYZE executor.runs, executor.coordinators`)
			if err := pool.QueryRow(ctx, fairQueuedSQL, fairA).Scan(&queued); err != nil {
				return err
			}
		}
		time.Sleep(f.fairSettle)
		if err := stopKeep(); err != nil {
			return fmt.Errorf("keeping B's session warm: %w", err)
		}
		p, err := fairRound(ctx, f, client, fd, fmt.Sprintf("%s-%d", fairB, n))
		if err != nil {
			return err
		}
		p.size, p.queued = n, queued
		select {
		case err := <-feedErr:
			return fmt.Errorf("company A's feeder: %w", err)
		default:
		}
		fmt.Printf("fairness: A has %d runs queued (counted %d; %.1f in flight of %d slots; a slot freed every %s): B's SubmitRun → turn.started p50 %s p99 %s (%d runs of B; load %s); "+
			"submit → claim p50 %s p99 %s, claim → turn.started persisted p50 %s p99 %s\n",
			p.size, p.queued, p.inFlight, f.fairSlots, p.slotEvery().Round(time.Millisecond), pct(p.lat, 50).Round(10*time.Microsecond),
			pct(p.lat, 99).Round(10*time.Microsecond), len(p.lat), p.load,
			pct(p.toClaim, 50).Round(10*time.Microsecond), pct(p.toClaim, 99).Round(10*time.Microsecond),
			pct(p.toStarted, 50).Round(10*time.Microsecond), pct(p.toStarted, 99).Round(10*time.Microsecond))
		points = append(points, p)
	}
	stop()
	reportFairness(os.Stdout, f.fairSlots, points)
	return nil
}

// fairRound measures f.fairSamples runs of B, one after another, each
// submitted -fair-interval after the previous one ended.
func fairRound(ctx context.Context, f *benchFlags, client executorv1.ExecutorServiceClient, fd *fairFeeder, prefix string) (fairPoint, error) {
	var p fairPoint
	// One turn first, not measured: B's runner may have idled out while
	// A's backlog was seeded (with a short -fair-runner-idle).
	if err := fairTurn(ctx, client, prefix+"-warm", nil); err != nil {
		return p, err
	}
	fd.resetStats()
	if os.Getenv("TETHER_FAIR_PGACT") != "" {
		actx, stopAct := context.WithCancel(ctx)
		defer stopAct()
		go sampleActivity(actx, fd.pool, prefix)
	}
	t0 := time.Now()
	for i := range f.fairSamples {
		time.Sleep(f.fairInterval)
		var started time.Duration
		if err := fairTurn(ctx, client, fmt.Sprintf("%s-%d", prefix, i), &started); err != nil {
			return p, err
		}
		p.lat = append(p.lat, started)
	}
	p.elapsed = time.Since(t0)
	p.aEnded, p.inFlight = fd.stats()
	rows, err := fd.pool.Query(ctx, fairSplitSQL, fairB, prefix+"-%")
	if err != nil {
		return p, err
	}
	defer rows.Close()
	for rows.Next() {
		var claim, start float64
		if err := rows.Scan(&claim, &start); err != nil {
			return p, err
		}
		p.toClaim = append(p.toClaim, time.Duration(claim*float64(time.Millisecond)))
		p.toStarted = append(p.toStarted, time.Duration(start*float64(time.Millisecond)))
	}
	if err := rows.Err(); err != nil {
		return p, err
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		p.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return p, nil
}

// keepWarm runs unmeasured turns of B's session, one every 500 ms, until
// the returned stop is called (it waits for the turn in progress): B's
// runner would otherwise idle out (with a short -fair-runner-idle) while
// A's backlog is seeded.
func keepWarm(ctx context.Context, client executorv1.ExecutorServiceClient, prefix string) (stop func() error) {
	quit := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(500 * time.Millisecond):
			}
			if err := fairTurn(ctx, client, fmt.Sprintf("%s-%d", prefix, i), nil); err != nil {
				done <- err
				return
			}
		}
	}()
	return func() error {
		close(quit)
		return <-done
	}
}

// fairTurn runs one turn of B's warm session to its end; started, when
// set, gets SubmitRun → turn.started.
func fairTurn(ctx context.Context, client executorv1.ExecutorServiceClient, id string, started *time.Duration) error {
	return runTurn(ctx, client, id, cli.InputSpec{Prompt: "hello " + id, Company: fairB, Agent: "bench", Session: fairB,
		Lifecycle: "warm", IdleTimeoutSeconds: 3600}, started)
}

// seedFair queues add more runs of A (ids fair-a-seed-<from+1>…, each in
// a session of the same name), copies of the template run as SubmitRun
// stored it, 1,000 a statement.
func seedFair(ctx context.Context, pool *pgxpool.Pool, template string, from, add int) error {
	var raw []byte
	if err := pool.QueryRow(ctx, `SELECT input FROM executor.runs WHERE run_id = $1`, template).Scan(&raw); err != nil {
		return fmt.Errorf("template %s: %w", template, err)
	}
	in := &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, in); err != nil {
		return err
	}
	for lo := from + 1; lo <= from+add; lo += 1000 {
		hi := min(lo+999, from+add)
		var ids, sessions, scopes, digests []string
		var inputs [][]byte
		for i := lo; i <= hi; i++ {
			id := fmt.Sprintf("%s-seed-%d", fairA, i)
			in.Session.NormalizedSessionId = id
			digest, b, err := store.InputDigest(in)
			if err != nil {
				return err
			}
			ids, sessions, scopes = append(ids, id), append(sessions, id), append(scopes, scope.OfRun(id, in))
			inputs, digests = append(inputs, b), append(digests, digest)
		}
		tag, err := pool.Exec(ctx, fairSeedSQL, template, ids, sessions, scopes, inputs, digests)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != int64(len(ids)) {
			return fmt.Errorf("seeded %d of %d runs (template %s)", tag.RowsAffected(), len(ids), template)
		}
	}
	return nil
}

// fairFeeder keeps company A's runs in flight: it fills the slots, then
// submits one run of A for each of A's runs that leaves flight.
type fairFeeder struct {
	client executorv1.ExecutorServiceClient
	pool   *pgxpool.Pool
	in     *prpv1.ExecutionInput
	next   atomic.Int64
	once   sync.Once
	ready  chan struct{}
	tmpl   string

	mu              sync.Mutex
	endedN, polls   int
	inFlightSamples int
}

func (fd *fairFeeder) submit(ctx context.Context) error {
	id := fmt.Sprintf("%s-%d", fairA, fd.next.Add(1))
	in := proto.Clone(fd.in).(*prpv1.ExecutionInput)
	in.Session.NormalizedSessionId = id
	if _, err := fd.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in}); err != nil {
		return fmt.Errorf("submitting %s: %w", id, err)
	}
	fd.once.Do(func() { fd.tmpl = id; close(fd.ready) })
	return nil
}

// first waits for A's first submitted run (the seeding template); "" when
// the feeder failed first.
func (fd *fairFeeder) first(ctx context.Context) string {
	select {
	case <-fd.ready:
		return fd.tmpl
	case <-ctx.Done():
		return ""
	case <-time.After(30 * time.Second):
		return ""
	}
}

func (fd *fairFeeder) resetStats() {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	fd.endedN, fd.polls, fd.inFlightSamples = 0, 0, 0
}

// stats returns A's runs that ended and the mean in flight since the last
// reset.
func (fd *fairFeeder) stats() (int, float64) {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if fd.polls == 0 {
		return fd.endedN, 0
	}
	return fd.endedN, float64(fd.inFlightSamples) / float64(fd.polls)
}

// run fills slots with runs of A, then refills until ctx ends.
func (fd *fairFeeder) run(ctx context.Context, slots int) error {
	for range slots {
		if err := fd.submit(ctx); err != nil {
			return err
		}
	}
	var before []string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(fairPoll):
		}
		var now []string
		rows, err := fd.pool.Query(ctx, fairRunningSQL, fairA)
		if err == nil {
			for rows.Next() {
				var id string
				if err = rows.Scan(&id); err != nil {
					break
				}
				now = append(now, id)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		gone := ended(before, now)
		before = now
		fd.mu.Lock()
		fd.endedN += len(gone)
		fd.polls++
		fd.inFlightSamples += len(now)
		fd.mu.Unlock()
		for range gone {
			if err := fd.submit(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}

	}
}

// reportFairness prints the curve: B's p50 and p99 at each backlog, and
// the ratio of p99 at the largest to p99 at the smallest (target ≤ 2×).
func reportFairness(w io.Writer, slots int, points []fairPoint) {
	if len(points) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%-34s %10s %10s %10s %12s %s\n", "fairness (through the stack)", "A queued", "B p50", "B p99", "slot freed", "A in flight")
	for _, p := range points {
		fmt.Fprintf(w, "%-34s %10d %10s %10s %12s %.1f of %d\n", "B: SubmitRun → turn.started", p.size,
			pct(p.lat, 50).Round(10*time.Microsecond), pct(p.lat, 99).Round(10*time.Microsecond), p.slotEvery().Round(time.Millisecond), p.inFlight, slots)
	}
	first, last := points[0], points[len(points)-1]
	ratio := 0.0
	if p := pct(first.lat, 99); p > 0 {
		ratio = float64(pct(last.lat, 99)) / float64(p)
	}
	fmt.Fprintf(w, "%-34s %.2f× (p99 at %d / at %d; target ≤ 2×) %s\n", "ratio", ratio, last.size, first.size, markOf(ratio <= 2))
	// From the smallest backlog on, B competes with A's due runs for each
	// freed slot (it takes the first or the second); at 0 with A's refills
	// only: what grows from there is the backlog's own cost.
	backlog := ""
	if len(points) > 2 && first.size == 0 {
		if p := pct(points[1].lat, 99); p > 0 {
			r := float64(pct(last.lat, 99)) / float64(p)
			fmt.Fprintf(w, "%-34s %.2f× (p99 at %d / at %d)\n", "ratio, the backlog's own", r, last.size, points[1].size)
			backlog = fmt.Sprintf(" backlog_ratio=%.3f", r)
		}
	}
	xs := make([]string, len(points))
	p50s := make([]string, len(points))
	p99s := make([]string, len(points))
	for i, p := range points {
		xs[i] = strconv.Itoa(p.size)
		p50s[i] = strconv.FormatFloat(ms(pct(p.lat, 50)), 'f', 3, 64)
		p99s[i] = strconv.FormatFloat(ms(pct(p.lat, 99)), 'f', 3, 64)
	}
	r50 := 0.0
	if p := pct(first.lat, 50); p > 0 {
		r50 = float64(pct(last.lat, 50)) / float64(p)
	}
	fmt.Fprintf(w, "BENCH curve_fair_share_stack_b_turn_started_p50 a_queued=%s values=%s ratio=%.3f target=0.00 met=true unit=ms\n",
		strings.Join(xs, ","), strings.Join(p50s, ","), r50)
	fmt.Fprintf(w, "BENCH curve_fair_share_stack_b_turn_started_p99 a_queued=%s values=%s ratio=%.3f target=2.00 met=%t unit=ms slots=%d samples=%d%s\n",
		strings.Join(xs, ","), strings.Join(p99s, ","), ratio, ratio <= 2, slots, len(last.lat), backlog)
}

// sampleActivity (TETHER_FAIR_PGACT=1, a diagnosis) tallies the active
// statements of the cluster every 20 ms and prints the most seen at the
// end of the point.
func sampleActivity(ctx context.Context, pool *pgxpool.Pool, label string) {
	tally := map[string]int{}
	n := 0
	defer func() {
		type kv struct {
			q string
			c int
		}
		var all []kv
		for q, c := range tally {
			all = append(all, kv{q, c})
		}
		slices.SortFunc(all, func(a, b kv) int { return b.c - a.c })
		fmt.Printf("pg activity %s (%d samples):\n", label, n)
		for _, e := range all[:min(8, len(all))] {
			fmt.Printf("  %5d  %s\n", e.c, e.q)
		}
	}()
	for ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		rows, err := pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 110) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
		if err != nil {
			return
		}
		n++
		for rows.Next() {
			var q string
			if rows.Scan(&q) == nil {
				tally[q]++
			}
		}
		rows.Close()
	}
}
