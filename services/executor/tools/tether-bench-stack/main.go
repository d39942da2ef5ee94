// Command tether-bench-stack measures what tether adds to a warm turn: the
// same turn driven (a) through the whole stack — SubmitRun → executor →
// runnergw → runnerd → fake codex app-server → events persisted → WatchRun
// delivers run.terminal — and (b) directly against the fake provider over
// its stdio JSON-RPC (turn/start → turn/completed), in the same run, on one
// warm session / thread each. It prints p50 and p99 of each and the ratio,
// plus SubmitRun → turn.started (PERFORMANCE.md, SPEC P4: ≤ 2× end to end;
// turn.started p50 ≤ 8 ms on a warm session). -cancels measures SPEC P2
// instead (cancel.go), -sessions the memory of idle warm sessions,
// -throughput the fleet's short runs/s and CPU per run (throughput.go),
// -fairness company B's SubmitRun → turn.started while company A saturates
// the executor's slots with 0 to 100,000 runs queued (SPEC Q3,
// fairness.go).
//
// Both sides drive the same turn: the same prompt, a fake started with the
// same flags (those the stack's gateway gives it), and threads of the same
// length; and their turns alternate (direct, then stack, per turn), so both
// see the same machine — the database, the stack's idle processes and
// whatever else runs on it — each after the same settle pause, so neither
// pays for the other's trailing work (acknowledgements, state saves).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"

	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tether-bench-stack:", err)
		os.Exit(1)
	}
}

// benchFlags are tether-bench-stack's flags.
type benchFlags struct {
	binDir, sessions                            string
	turns, warm, takeovers, cancels, throughput int
	gateways, p5Sessions, anchorN, idleTurns    int
	pgStatements                                int
	keep, trace, sameHost, sigterm, idleControl bool
	settle, ttl, idleCheckpointAfter            time.Duration
	sizes                                       []int // parsed -sessions
	// -fairness (fairness.go)
	fairness, fairPrompt     string
	fairSizes                []int // parsed -fairness
	fairSamples, fairSlots   int
	fairInterval, fairSettle time.Duration
	fairSlowDelta, fairIdle  time.Duration
}

func parseFlags() (*benchFlags, error) {
	f := &benchFlags{}
	self, _ := os.Executable()
	flag.StringVar(&f.binDir, "bin-dir", filepath.Dir(self), "directory with the tether binaries")
	flag.IntVar(&f.turns, "turns", 100, "measured turns per side")
	flag.IntVar(&f.warm, "warmup", 5, "warm-up turns per side")
	flag.BoolVar(&f.keep, "keep", false, "keep the temporary directory (logs)")
	flag.BoolVar(&f.trace, "trace", false, "print the timeline of the last turn")
	flag.DurationVar(&f.settle, "settle", 10*time.Millisecond, "pause before each turn of either side")
	flag.StringVar(&f.sessions, "sessions", "", "instead of the warm turn: RSS/PSS per idle warm session at these session counts (e.g. 10,50)")
	flag.IntVar(&f.takeovers, "takeovers", 0, "instead of the warm turn: kill -9 of the driving executor → the run's next event from the other replica, this many times (SPEC P3)")
	flag.BoolVar(&f.sameHost, "same-host-takeover", true, "-takeovers: the executors take over on proof of death on this host (else after lease expiry)")
	flag.DurationVar(&f.ttl, "lease-ttl", 3*time.Second, "-takeovers: the executors' lease TTL")
	flag.BoolVar(&f.sigterm, "sigterm", false, "-takeovers: SIGTERM the driving executor instead of kill -9 (it hands its lease back; target ≤ 1 s)")
	flag.IntVar(&f.cancels, "cancels", 0, "instead of the warm turn: CancelRun → provider interrupt acknowledged over this many live turns (SPEC P2)")
	flag.IntVar(&f.throughput, "throughput", 0, "instead of the warm turn: this many short warm runs over -p5-sessions sessions, runs/s and CPU per run of each process kind (SPEC P5)")
	flag.IntVar(&f.gateways, "gateways", 1, "-throughput: runner gateways (as on separate hosts, registered with the executor)")
	flag.IntVar(&f.p5Sessions, "p5-sessions", 12, "-throughput: warm sessions the runs are spread over")
	flag.IntVar(&f.anchorN, "anchors", 100, "warm turn: samples of each raw anchor (fdatasync, atomic replace, commit, gRPC ping-pong) before and after the turns")
	flag.IntVar(&f.idleTurns, "idle-turns", 5, "after the warm turn: turns each after 2 × -idle-checkpoint-after idle with the backup verifier on, each idle period checkpointed online (SPEC P6); 0: none")
	flag.DurationVar(&f.idleCheckpointAfter, "idle-checkpoint-after", time.Second, "the executor's -checkpoint-after in the warm-turn run (no measured warm turn idles that long)")
	flag.BoolVar(&f.idleControl, "idle-control", false, "-idle-turns without checkpoints (-checkpoint-after 0): the same idle periods, to tell idleness from checkpointing")
	flag.StringVar(&f.fairness, "fairness", "", "instead of the warm turn: company B's SubmitRun → turn.started while company A has these numbers of runs queued (e.g. 0,1000,10000,100000) and keeps -fair-slots runs in flight (SPEC Q3, fairness.go)")
	flag.IntVar(&f.fairSamples, "fair-samples", 100, "-fairness: runs of company B measured at each size of A's backlog")
	flag.IntVar(&f.fairSlots, "fair-slots", 4, "-fairness: the executor's -max-active-runs, all of them kept busy by company A")
	flag.DurationVar(&f.fairInterval, "fair-interval", 50*time.Millisecond, "-fairness: pause between the end of one run of B and the submission of the next")
	flag.DurationVar(&f.fairSlowDelta, "fair-slow-delta", 20*time.Millisecond, "-fairness: the fake's pause before each delta of a [slow] reply (A's turns)")
	flag.DurationVar(&f.fairIdle, "fair-runner-idle", 0, "-fairness: the gateway's -idle-timeout (0: the gateway's default); per-turn runners stop when their run settles, so it matters only to a lost close")
	flag.DurationVar(&f.fairSettle, "fair-settle", 2*time.Second, "-fairness: pause after seeding A's backlog, before B's runs")
	flag.StringVar(&f.fairPrompt, "fair-a-prompt", "[slow] a", "-fairness: the prompt of company A's runs (the fake answers one containing [slow] in 10 deltas, -fair-slow-delta apart)")
	flag.IntVar(&f.pgStatements, "pg-statements", 0, "warm turn: load pg_stat_statements into the bench's cluster and print the N statements that took the most execution time per stack turn (pgstatements.go)")
	flag.Parse()
	if f.gateways < 1 {
		return nil, fmt.Errorf("-gateways: want ≥ 1, got %d", f.gateways)
	}
	if f.sessions != "" {
		for s := range strings.SplitSeq(f.sessions, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || (len(f.sizes) > 0 && n <= f.sizes[len(f.sizes)-1]) {
				return nil, fmt.Errorf("-sessions: want increasing counts ≥ 1, got %q", f.sessions)
			}
			f.sizes = append(f.sizes, n)
		}
	}
	if f.fairness != "" {
		var err error
		if f.fairSizes, err = parseSizes(f.fairness); err != nil {
			return nil, fmt.Errorf("-fairness: %w", err)
		}
		if f.fairSlots < 1 || f.fairSamples < 1 {
			return nil, fmt.Errorf("-fair-slots and -fair-samples: want ≥ 1")
		}
	}
	return f, nil
}

// run is flags → the direct fake and the stack → the measurement -flags
// chose (the warm turn by default).
func run() error {
	f, err := parseFlags()
	if err != nil {
		return err
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tether-bench-stack-")
	if err != nil {
		return err
	}
	defer func() {
		if f.keep {
			fmt.Println("kept", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	fakeArgs := []string{"--delta-delay-ms", "0"}
	ds, err := startDirect(filepath.Join(f.binDir, "fake-codex-app-server"), filepath.Join(dir, "direct"), fakeArgs)
	if err != nil {
		return fmt.Errorf("direct: %w", err)
	}
	defer ds.close()
	pgOpts := []pgtest.Option{pgtest.WithDurable()}
	if f.pgStatements > 0 {
		pgOpts = append(pgOpts, pgStatementsOptions()...)
	}
	cluster, err := pgtest.Start(ctx, pgOpts...)
	if err != nil {
		return err
	}
	defer cluster.Close()
	if err := cluster.CreateDatabase(ctx, "tether"); err != nil {
		return err
	}
	st, traceDir, err := startStack(ctx, f, dir, cluster.DSN("tether"), fakeArgs)
	if err != nil {
		return err
	}
	defer st.Stop()
	if f.takeovers > 0 {
		return takeovers(ctx, f, st, cluster.DSN("tether"))
	}
	return measure(ctx, f, st, ds, cluster, dir, traceDir)
}

// startStack starts the stack the measurement needs: with synced writes
// traced for the warm turn (the executor and the gateway inherit the
// variable, runnerd gets it from the gateway, the provider by its flag),
// more gateways for -throughput, the takeover lease for -takeovers.
func startStack(ctx context.Context, f *benchFlags, dir, dsn string, fakeArgs []string) (*stack.Stack, string, error) {
	opts := stack.Options{BinDir: f.binDir, Dir: filepath.Join(dir, "stack"), DatabaseURL: dsn, FakeArgs: fakeArgs}
	traceDir := ""
	if len(f.sizes) == 0 && f.takeovers == 0 && f.throughput == 0 && f.fairness == "" {
		traceDir = filepath.Join(dir, "synctrace")
		if err := os.MkdirAll(traceDir, 0o700); err != nil {
			return nil, "", err
		}
		opts.Env = append(opts.Env, synctrace.EnvVar+"="+traceDir)
		opts.FakeArgs = append(append([]string(nil), fakeArgs...), "--sync-trace", traceDir)
		if f.idleTurns > 0 {
			// Production's checkpoint policy (a verifier and
			// -checkpoint-after), for the turns after idle periods.
			if !f.idleControl {
				opts.CheckpointAfter = f.idleCheckpointAfter
			}
			opts.ExecutorArgs = append(opts.ExecutorArgs, "-idle-sweep-interval", "100ms")
		}
	}
	if f.fairness != "" {
		opts.ExecutorArgs = append(opts.ExecutorArgs, "-max-active-runs", strconv.Itoa(f.fairSlots))
		opts.FakeArgs = append(append([]string(nil), fakeArgs...), "--slow-delta-delay-ms", strconv.FormatInt(f.fairSlowDelta.Milliseconds(), 10))
		if f.fairIdle > 0 {
			opts.GatewayArgs = append(opts.GatewayArgs, "-idle-timeout", f.fairIdle.String())
		}
	}
	if f.takeovers > 0 {
		opts.LeaseTTL = f.ttl
		opts.ExecutorArgs = []string{"-same-host-takeover=" + strconv.FormatBool(f.sameHost)}
	}
	st, err := stack.New(opts)
	if err != nil {
		return nil, "", err
	}
	if err := startGateways(ctx, f, st); err != nil {
		st.Stop()
		return nil, "", err
	}
	return st, traceDir, nil
}

// startGateways starts the stack, with -gateways registered gateways for
// -throughput.
func startGateways(ctx context.Context, f *benchFlags, st *stack.Stack) error {
	if f.throughput > 0 && f.gateways > 1 {
		st.SetExtraArgs("runnergw", st.RegistryArgs("executor")...)
		for g := 2; g <= f.gateways; g++ {
			if err := st.AddGateway(gatewayName(g), st.RegistryArgs("executor")...); err != nil {
				return err
			}
		}
	}
	if err := st.StartAll(ctx); err != nil {
		return err
	}
	for g := 2; f.throughput > 0 && g <= f.gateways; g++ {
		if _, err := st.Start(ctx, gatewayName(g)); err != nil {
			return err
		}
	}
	return nil
}

// takeovers measures SPEC P3 with a second executor.
func takeovers(ctx context.Context, f *benchFlags, st *stack.Stack, dsn string) error {
	if err := st.AddExecutor("executor-2"); err != nil {
		return err
	}
	if _, err := st.Start(ctx, "executor-2"); err != nil {
		return err
	}
	return takeoverTime(ctx, st, dsn, f.ttl, f.sameHost, f.sigterm, f.takeovers)
}

// measure runs the measurement -flags chose on the started stack.
func measure(ctx context.Context, f *benchFlags, st *stack.Stack, ds *directSession, cluster *pgtest.Cluster, dir, traceDir string) error {
	conn, err := grpcx.Dial(st.Addr("executor"), "")
	if err != nil {
		return err
	}
	defer conn.Close()
	client := executorv1.NewExecutorServiceClient(conn)
	if len(f.sizes) > 0 {
		return sessionsCurve(ctx, client, st.Proc("runnergw").Pid(), f.sizes)
	}
	if f.cancels > 0 {
		return cancelLatency(ctx, client, f.warm, f.cancels, traceDir)
	}
	if f.fairness != "" {
		return fairness(ctx, f, client, cluster.DSN("tether"))
	}
	if f.throughput > 0 {
		return fleetThroughput(ctx, st, client, cluster.Dir(), f.gateways, f.p5Sessions, f.throughput)
	}
	ops, err := openAnchors(ctx, filepath.Join(dir, "anchors"), cluster.DSN("tether"))
	if err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	defer ops.close()
	var raw anchors
	if err := ops.measure(ctx, &raw, f.anchorN); err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	var stmts *pgStatements
	if f.pgStatements > 0 {
		if stmts, err = openPgStatements(ctx, cluster.DSN("tether")); err != nil {
			return err
		}
		defer stmts.close()
		if err := stmts.reset(ctx); err != nil {
			return err
		}
	}
	w, err := warmTurns(ctx, f, ds, client)
	if err != nil {
		return err
	}
	if stmts != nil {
		if err := stmts.print(ctx, f.warm+f.turns, f.pgStatements); err != nil {
			return err
		}
	}
	if err := ops.measure(ctx, &raw, f.anchorN); err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	if f.trace {
		if err := printTrace(ctx, cluster.DSN("tether"), w.lastID, w.lastT0); err != nil {
			return err
		}
	}
	sp50, err := w.report(raw, traceDir)
	if err != nil {
		return err
	}
	if f.idleTurns > 0 {
		return turnsAfterIdle(ctx, client, f.idleTurns, f.idleCheckpointAfter, sp50, traceDir, raw, !f.idleControl)
	}
	return nil
}

// warmResults are the warm turns' measurements, each side's after the
// warm-up.
type warmResults struct {
	direct, directStarted, e2e, started []time.Duration
	windows                             []turnWindow
	lastT0                              time.Time
	lastID                              string
}

// warmTurns drives the warm turns, alternating: the direct fake's turn,
// then the stack's.
func warmTurns(ctx context.Context, f *benchFlags, ds *directSession, client executorv1.ExecutorServiceClient) (*warmResults, error) {
	w := &warmResults{}
	for i := 0; i < f.warm+f.turns; i++ {
		prompt := fmt.Sprintf("turn %d", i)
		time.Sleep(f.settle)
		ds0, d, err := ds.turn(prompt)
		if err != nil {
			return nil, fmt.Errorf("direct: %w", err)
		}
		if i >= f.warm {
			w.direct = append(w.direct, d)
			w.directStarted = append(w.directStarted, ds0)
		}
		in, err := cli.InputSpec{Prompt: prompt, Company: "bench", Agent: "bench", Session: "bench", Lifecycle: "warm"}.Input()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("bench-%d", i)
		time.Sleep(f.settle)
		t0 := time.Now()
		w.lastT0, w.lastID = t0, id
		tStarted, tEnd, err := stackTurn(ctx, client, t0, id, in)
		if err != nil {
			return nil, err
		}
		if i >= f.warm {
			w.e2e = append(w.e2e, tEnd)
			w.started = append(w.started, tStarted)
			w.windows = append(w.windows, turnWindow{t0: t0, started: t0.Add(tStarted), end: t0.Add(tEnd)})
		}
	}
	return w, nil
}

// stackTurn submits run id (at t0) on the warm session and watches it to
// its end; it returns the times from t0 to turn.started and to
// run.terminal.
func stackTurn(ctx context.Context, client executorv1.ExecutorServiceClient, t0 time.Time, id string, in *prpv1.ExecutionInput) (tStarted, tEnd time.Duration, _ error) {
	if _, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in}); err != nil {
		return 0, 0, err
	}
	stream, err := client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id})
	if err != nil {
		return 0, 0, err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return tStarted, tEnd, nil
		}
		if err != nil {
			return 0, 0, err
		}
		switch m.GetEvent().GetEventType() {
		case prp.EventTurnStarted:
			tStarted = time.Since(t0)
		case "run.terminal":
			tEnd = time.Since(t0)
			if s := m.GetEvent().GetPayload().AsMap()["runTerminalState"]; s != "succeeded" {
				return 0, 0, fmt.Errorf("run %s ended %v", id, s)
			}
		}
	}
}

// printTrace prints the timeline of run id (its claim and its persisted
// events) relative to t0, its submission.
func printTrace(ctx context.Context, dsn, id string, t0 time.Time) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT seq, event_type, created_at FROM executor.events WHERE run_id = $1 ORDER BY seq`, id)
	if err != nil {
		return err
	}
	defer rows.Close()
	var claimed time.Time
	_ = pool.QueryRow(ctx, `SELECT started_at FROM executor.coordinators WHERE run_id = $1`, id).Scan(&claimed)
	fmt.Printf("trace %s: claimed at +%s\n", id, claimed.Sub(t0))
	for rows.Next() {
		var seq int64
		var typ string
		var at time.Time
		if err := rows.Scan(&seq, &typ, &at); err != nil {
			return err
		}
		fmt.Printf("  %3d %-24s persisted at +%s\n", seq, typ, at.Sub(t0))
	}
	return nil
}

// report prints the warm-turn figures, the raw anchors, the synced writes
// and the floor; it returns the stack's p50.
func (w *warmResults) report(raw anchors, traceDir string) (time.Duration, error) {
	dp50, dp99 := pct(w.direct, 50), pct(w.direct, 99)
	sp50, sp99 := pct(w.e2e, 50), pct(w.e2e, 99)
	tp50 := pct(w.started, 50)
	ratio := float64(sp50) / float64(dp50)
	fmt.Printf("\n%-28s %12s %12s %12s %10s %6s\n", "figure", "tether p50", "tether p99", "direct p50", "ratio", "target")
	fmt.Printf("%-28s %12s %12s %12s %9.2fx %6s %s\n", "warm turn end to end", sp50, sp99, dp50, ratio, "≤2x", markOf(ratio <= 2))
	fmt.Printf("%-28s %12s %12s %12s %10s %6s %s\n", "SubmitRun → turn.started", tp50, pct(w.started, 99), "-", "-", "≤8ms", markOf(tp50 <= 8*time.Millisecond))
	fmt.Printf("BENCH warm_turn tether_p50_ms=%.3f tether_p99_ms=%.3f direct_p50_ms=%.3f direct_p99_ms=%.3f ratio=%.3f target=2.00 met=%t\n",
		ms(sp50), ms(sp99), ms(dp50), ms(dp99), ratio, ratio <= 2)
	fmt.Printf("BENCH submit_to_turn_started p50_ms=%.3f p99_ms=%.3f target_ms=8 met=%t\n", ms(tp50), ms(pct(w.started, 99)), tp50 <= 8*time.Millisecond)
	raw.print()
	writes, err := reportSynced(traceDir, w.windows, raw)
	if err != nil {
		return 0, err
	}
	floor{direct: pct(w.directStarted, 50), writes: writes, commit: pct(raw.commit, 50), hops: pathHops, pingPong: pct(raw.pingPong, 50)}.print(tp50)
	return sp50, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// directSession drives the fake app-server over stdio: one process, one
// thread, turn/start → turn/completed per turn.
type directSession struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	r      *bufio.Reader
	id     int
	thread string
	// onStarted, during a turn, takes the time of its turn/started.
	onStarted func()
}

// startDirect starts the fake with the flags the stack's gateway gives it
// (see stack.Options) plus extra, and opens a thread.
func startDirect(bin, home string, extra []string) (*directSession, error) {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	args := append([]string{"--state-file-in-codex-home", "--durable-turn-ids", "--record-process-start",
		"--call-log", filepath.Join(home, "fake-codex-calls.log")}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "CODEX_HOME=" + home}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &directSession{cmd: cmd, stdin: stdin, r: bufio.NewReaderSize(stdout, 1<<20)}
	if _, err := d.call("initialize", initializeParams{ClientInfo: clientInfo{Name: "bench", Version: "1"}}); err != nil {
		d.close()
		return nil, err
	}
	res, err := d.call("thread/start", threadStartParams{Cwd: home})
	if err != nil {
		d.close()
		return nil, err
	}
	var started threadStartResult
	_ = json.Unmarshal(res, &started)
	d.thread = started.Thread.ID
	return d, nil
}

// The codex app-server messages the direct session exchanges (the codex
// driver's codexwire package is internal to runnerd).
type (
	rpcRequest struct {
		JSONRPC string `json:"jsonrpc"`
		ID      int    `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}
	// rpcInbound is a response (id, result or error) or a notification
	// (method).
	rpcInbound struct {
		ID     *int            `json:"id"`
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	clientInfo struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	initializeParams struct {
		ClientInfo clientInfo `json:"clientInfo"`
	}
	threadStartParams struct {
		Cwd string `json:"cwd"`
	}
	threadStartResult struct {
		Thread struct {
			ID string `json:"id"`
		} `json:"thread"`
	}
	textInput struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	turnStartParams struct {
		ThreadID string      `json:"threadId"`
		Input    []textInput `json:"input"`
	}
)

func (d *directSession) close() { _ = d.stdin.Close(); _ = d.cmd.Wait() }

func (d *directSession) call(method string, params any) (json.RawMessage, error) {
	d.id++
	b, _ := json.Marshal(rpcRequest{JSONRPC: "2.0", ID: d.id, Method: method, Params: params})
	if _, err := d.stdin.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	for {
		line, err := d.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var m rpcInbound
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if m.Method == "turn/started" && d.onStarted != nil {
			d.onStarted()
		}
		if m.ID != nil && *m.ID == d.id && m.Method == "" {
			if len(m.Error) > 0 {
				return nil, fmt.Errorf("%s: %s", method, m.Error)
			}
			return m.Result, nil
		}
	}
}

// turn runs one turn: turn/start sent → turn/started and turn/completed
// read (turn/started may come before turn/start's answer).
func (d *directSession) turn(prompt string) (started, completed time.Duration, err error) {
	t0 := time.Now()
	d.onStarted = func() { started = time.Since(t0) }
	defer func() { d.onStarted = nil }()
	if _, err := d.call("turn/start", turnStartParams{ThreadID: d.thread, Input: []textInput{{Type: "text", Text: prompt}}}); err != nil {
		return 0, 0, err
	}
	for {
		line, err := d.r.ReadBytes('\n')
		if err != nil {
			return 0, 0, err
		}
		var m rpcInbound
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch m.Method {
		case "turn/started":
			d.onStarted()
		case "turn/completed":
			return started, time.Since(t0), nil
		}
	}
}
