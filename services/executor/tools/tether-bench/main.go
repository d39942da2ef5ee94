// Command tether-bench measures the executor's hot SQL paths against raw
// PostgreSQL baselines measured in the same run, on the same server, as
// /work/shared/PERFORMANCE.md asks: every figure is printed next to its raw
// baseline and the ratio tether/raw. A missed target is reported (✗), never
// an error: the command exits 0 unless something fails.
//
// It runs against an ephemeral PostgreSQL with fsync, synchronous_commit and
// full_page_writes on (pgtest.WithDurable), or, when TETHER_DATABASE_URL is
// set, in a scratch database it creates on that server (CREATEDB needed) and
// drops afterwards. The executor schema comes from store.MigrateDB; the raw
// baselines use tables in a separate schema, tether_bench, created
// LIKE the executor's tables (same columns, defaults and indexes; no foreign
// keys), with the same row counts. The baseline SQL lives here on purpose:
// it is a yardstick, not product SQL.
//
// Figures (tether and raw alternate in slices, each side first in turn, so
// drift of the shared machine hits both alike):
//
//   - lease_claim (claims/s): -claims queued runs, each in its own session
//     so session ordering does not serialise claims, are claimed by -workers
//     concurrent workers with store.ClaimNext. Raw: the single-statement
//     UPDATE … WHERE run_id = (SELECT … ORDER BY next_attempt_at LIMIT 1
//     FOR UPDATE SKIP LOCKED) RETURNING … over an equally filled copy of
//     executor.coordinators, same worker count. Target ≥ 70 %.
//   - lease_renewal (lease renewals/s): one executor holds -leases leases and
//     renews all of them per tick, back to back, with store.RenewLeases (one
//     fenced statement). Raw: one UPDATE … FROM unnest($ids) renewing the
//     same number of leases, unfenced. Target ≥ 90 %.
//   - event_persistence (events/s): a driver holding a fenced claim appends
//     batches of -batch events with -payload-byte payloads through
//     store.AppendEvents (fence check, dedupe, insert, event count, notify;
//     one transaction per batch). Raw: one autocommitted multi-row
//     INSERT … SELECT … FROM unnest(…) of same-sized rows into a copy of
//     executor.events. Target ≥ 60 %.
//
// -figures runs some of them (in the order given; a figure run alone sees
// smaller tables than in the full run, where lease_claim's runs stay in
// both coordinators tables); -cpuprofile writes this process's CPU profile
// (both sides, and the seeding) for go tool pprof.
//
// -curves measures the scale curves instead (see curves.go): how claim
// attempts, renewals, appends and WatchRun fan-out grow with blocked runs,
// leases, table size and watchers.
//
// Each figure warms both sides up briefly first. Output: an aligned table,
// then one line per figure for machines:
//
//	BENCH <figure> tether=<ops/s> raw=<ops/s> ratio=<tether/raw> target=<min ratio> met=<bool> unit=<unit>
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

type config struct {
	claims, claimWarmup int
	workers             int
	leases              int
	batch, payload      int
	duration, warmup    time.Duration
	slices              int
	figures             string
	cpuProfile          string
	unaryCallers        int
	purgeCycles         int

	// -curves
	curves                         bool
	curveSet                       map[string]bool
	backlogs, leaseSizes, watchers []int
	fairSlots, fairSamples         int
	fairTurn, fairInterval         time.Duration
	appendRows                     []int
	appendTable                    bool
	appendExpiredRuns              int // event_append: expired runs (500 events each) seeded per size for the purge; 0: 200
	attempts, ticks, watchEvents   int
	watchPace, idle, idleSettle    time.Duration
	executor                       string
	watchClient                    string

	// unaryClaimed, when set (tests), receives how many runs of the unary
	// figures the executor under measurement claimed (none: see heldHead).
	unaryClaimed *int
}

// intList is a comma-separated list of sizes.
type intList struct{ p *[]int }

func (l intList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, v := range *l.p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l intList) Set(v string) error {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a size", f)
		}
		out = append(out, n)
	}
	if !slices.IsSorted(out) || len(out) == 0 {
		return errors.New("sizes must be given in increasing order")
	}
	*l.p = out
	return nil
}

func main() {
	if dsn := os.Getenv(rawServerEnv); dsn != "" {
		if err := serveRaw(dsn); err != nil {
			fmt.Fprintln(os.Stderr, "tether-bench (raw unary server):", err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	flag.IntVar(&cfg.claims, "claims", 2000, "lease_claim: queued runs claimed per side (measured)")
	flag.IntVar(&cfg.claimWarmup, "claim-warmup", 200, "lease_claim: claims per side before measuring")
	flag.IntVar(&cfg.workers, "workers", 8, "lease_claim: concurrent claiming workers per side")
	flag.IntVar(&cfg.leases, "leases", 500, "lease_renewal: leases held and renewed per tick")
	flag.IntVar(&cfg.batch, "batch", 64, "event_persistence: events per batch")
	flag.IntVar(&cfg.payload, "payload", 256, "event_persistence: payload bytes per event")
	flag.DurationVar(&cfg.duration, "duration", 4*time.Second, "measured time per side for the timed figures")
	flag.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "warm-up time per side for the timed figures")
	flag.IntVar(&cfg.slices, "slices", 8, "alternating tether/raw slices per figure")
	flag.StringVar(&cfg.figures, "figures", "lease_claim,lease_renewal,event_persistence,unary_getrun,unary_submit", "comma-separated figures to run, in this order")
	flag.IntVar(&cfg.unaryCallers, "unary-callers", 32, "unary_getrun, unary_submit: concurrent callers per side")
	flag.IntVar(&cfg.purgeCycles, "purge-cycles", 4, "-curves purge_impact: alternations of half a -duration without and half with a purge running, per figure")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the measured figures, both sides; or the curves) to this file")
	flag.BoolVar(&cfg.curves, "curves", false, "measure the scale curves instead of the figures (see curves.go)")
	curveList := flag.String("curve", "claim_attempt,fair_share,lease_renewal,event_append,watch_delivery,purge_impact", "-curves: which curves, comma-separated")
	cfg.backlogs, cfg.leaseSizes, cfg.watchers, cfg.appendRows = []int{1000, 10000, 100000}, []int{100, 1000, 10000}, []int{1, 100, 1000}, []int{0, 1000000, 10000000}
	flag.Var(intList{&cfg.backlogs}, "backlogs", "claim_attempt: runs blocked behind 10 busy sessions")
	flag.IntVar(&cfg.attempts, "attempts", 300, "claim_attempt: measured attempts per size")
	flag.IntVar(&cfg.fairSlots, "fair-slots", 8, "fair_share: drivers claiming runs (the fleet's slots)")
	flag.DurationVar(&cfg.fairTurn, "fair-turn", 20*time.Millisecond, "fair_share: how long a driver holds each run")
	flag.IntVar(&cfg.fairSamples, "fair-samples", 200, "fair_share: runs of company B measured per size of A's backlog (-backlogs, and 0)")
	flag.DurationVar(&cfg.fairInterval, "fair-interval", 10*time.Millisecond, "fair_share: one run of company B submitted per this interval")
	flag.Var(intList{&cfg.leaseSizes}, "lease-sizes", "lease_renewal: leases renewed per tick")
	flag.IntVar(&cfg.ticks, "ticks", 50, "lease_renewal: measured ticks per size")
	flag.Var(intList{&cfg.appendRows}, "append-rows", "event_append: rows already in executor.events")
	flag.BoolVar(&cfg.appendTable, "append-unpartitioned", false, "event_append: keep executor.events one table (the layout before `executor migrate -partition-events`) instead of partitioning it by run creation week")
	flag.Var(intList{&cfg.watchers}, "watchers", "watch_delivery: WatchRun streams of one run")
	flag.IntVar(&cfg.watchEvents, "watch-events", 60, "watch_delivery: events delivered per size")
	flag.DurationVar(&cfg.watchPace, "watch-pace", 50*time.Millisecond, "watch_delivery: one event per this interval")
	flag.DurationVar(&cfg.idle, "watch-idle", 2*time.Second, "watch_delivery: idle time measured per size")
	flag.DurationVar(&cfg.idleSettle, "watch-idle-settle", 11*time.Second, "watch_delivery: wait before the idle measurement (PostgreSQL reports an idle backend's transactions within 10 s)")
	flag.StringVar(&cfg.watchClient, "watch-client", "h2", "watch_delivery: the receivers, h2 (bare HTTP/2 connections, one goroutine each: the executor's cost alone) or grpc (grpc-go streams: the receivers' cost too)")
	flag.StringVar(&cfg.executor, "executor", "", "watch_delivery, unary_getrun, unary_submit: the executor binary (default: next to this one)")
	flag.Parse()
	cfg.curveSet = map[string]bool{}
	for name := range strings.SplitSeq(*curveList, ",") {
		cfg.curveSet[strings.TrimSpace(name)] = true
	}
	if cfg.claims < cfg.slices || cfg.workers < 1 || cfg.leases < 1 || cfg.batch < 1 || cfg.slices < 1 {
		fmt.Fprintln(os.Stderr, "tether-bench: -claims must be ≥ -slices, and -workers, -leases, -batch, -slices ≥ 1")
		os.Exit(2)
	}
	if cfg.watchClient != "h2" && cfg.watchClient != "grpc" {
		fmt.Fprintln(os.Stderr, "tether-bench: -watch-client is h2 or grpc")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) (err error) {
	poolCfg, cleanup, err := database(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// Enough connections that neither side queues on the pool.
	poolCfg.MaxConns = int32(max(2*cfg.workers, cfg.unaryCallers, 4))
	if err := migrate(ctx, poolCfg); err != nil {
		return err
	}
	tetherPool, err := pgxpool.NewWithConfig(ctx, poolCfg.Copy())
	if err != nil {
		return err
	}
	defer tetherPool.Close()
	rawPool, err := pgxpool.NewWithConfig(ctx, poolCfg.Copy())
	if err != nil {
		return err
	}
	defer rawPool.Close()
	st := store.New(tetherPool, runrules.New())
	if err := printServer(ctx, rawPool, cfg); err != nil {
		return err
	}
	if _, err := rawPool.Exec(ctx, rawSchemaSQL); err != nil {
		return fmt.Errorf("creating the raw baseline tables: %w", err)
	}

	b := &bench{cfg: cfg, st: st, claim: claimFunc(st), raw: rawPool, dsn: scratchDSN(poolCfg)}
	defer func() {
		if b.exe != nil {
			b.exe.stop()
		}
	}()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.curves {
		return b.curves(ctx)
	}
	return b.figures(ctx)
}

// migrate applies the executor's migrations to the scratch database.
func migrate(ctx context.Context, poolCfg *pgxpool.Config) error {
	db := stdlib.OpenDB(*poolCfg.ConnConfig.Copy())
	err := store.MigrateDB(ctx, db)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}

// scratchDSN is the URL of the scratch database poolCfg connects to.
func scratchDSN(poolCfg *pgxpool.Config) string {
	dsn := poolCfg.ConnString()
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		u.Path = "/" + poolCfg.ConnConfig.Database // the scratch database
		dsn = u.String()
	}
	return dsn
}

// figures measures the figures of -figures, in order, and reports them.
func (b *bench) figures(ctx context.Context) error {
	cfg := b.cfg
	figures := map[string]func(context.Context) (result, error){
		"lease_claim": b.leaseClaim, "lease_renewal": b.leaseRenewal, "event_persistence": b.eventPersistence,
		"unary_getrun": b.unaryGetRun, "unary_submit": b.unarySubmit,
	}
	var chosen []func(context.Context) (result, error)
	for name := range strings.SplitSeq(cfg.figures, ",") {
		fig, ok := figures[strings.TrimSpace(name)]
		if !ok {
			return fmt.Errorf("-figures: no figure %q (lease_claim, lease_renewal, event_persistence, unary_getrun, unary_submit)", name)
		}
		chosen = append(chosen, fig)
	}
	var results []result
	for _, fig := range chosen {
		r, err := fig(ctx)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	report(os.Stdout, results)
	return nil
}

// database returns the pool configuration of an empty database to measure in
// and a cleanup that removes it.
func database(ctx context.Context) (*pgxpool.Config, func() error, error) {
	if url := os.Getenv("TETHER_DATABASE_URL"); url != "" {
		return scratchDatabase(ctx, url)
	}
	logf("starting an ephemeral durable PostgreSQL (fsync on)")
	cluster, err := pgtest.Start(ctx, pgtest.WithDurable())
	if err != nil {
		return nil, nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	if err := cluster.CreateDatabase(ctx, "tether_bench"); err != nil {
		cluster.Close()
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(cluster.DSN("tether_bench"))
	if err != nil {
		cluster.Close()
		return nil, nil, err
	}
	logf("PostgreSQL on 127.0.0.1:%d (ephemeral)", cluster.Port())
	return cfg, cluster.Close, nil
}

// scratchDatabase creates a throwaway database on the server of url, so the
// claim figure never touches runs of a real database.
func scratchDatabase(ctx context.Context, url string) (*pgxpool.Config, func() error, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("TETHER_DATABASE_URL: %w", err)
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "tether_bench_" + hex.EncodeToString(suffix)
	admin := func(ctx context.Context, sql string) error {
		conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql)
		return err
	}
	ident := pgx.Identifier{name}.Sanitize()
	if err := admin(ctx, "CREATE DATABASE "+ident); err != nil {
		return nil, nil, fmt.Errorf("creating scratch database %s on TETHER_DATABASE_URL's server (needs CREATEDB): %w", name, err)
	}
	logf("measuring in scratch database %s on %s:%d", name, cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	scratch := cfg.Copy()
	scratch.ConnConfig.Database = name
	cleanup := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := admin(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("dropping scratch database %s: %w", name, err)
		}
		return nil
	}
	return scratch, cleanup, nil
}

func printServer(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	var version, fsync, syncCommit, fpw string
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
	current_setting('synchronous_commit'), current_setting('full_page_writes')`).Scan(&version, &fsync, &syncCommit, &fpw)
	if err != nil {
		return err
	}
	logf("PostgreSQL %s: fsync=%s synchronous_commit=%s full_page_writes=%s; %d CPUs, GOMAXPROCS=%d, %s",
		version, fsync, syncCommit, fpw, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	logf("plan: claims=%d (+%d warm-up) workers=%d; leases=%d; events batch=%d payload=%d B; %s per side in %d slices",
		cfg.claims, cfg.claimWarmup, cfg.workers, cfg.leases, cfg.batch, cfg.payload, cfg.duration, cfg.slices)
	if fsync != "on" || syncCommit == "off" {
		logf("warning: the server does not flush commits; figures are not durable ones")
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Printf("bench: "+format+"\n", args...)
}

var errDry = errors.New("the queue ran dry before the claim count was reached")
