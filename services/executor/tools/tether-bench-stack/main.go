// Command tether-bench-stack measures what tether adds to a warm turn: the
// same turn driven (a) through the whole stack — SubmitRun → executor →
// runnergw → runnerd → fake codex app-server → events persisted → WatchRun
// delivers run.terminal — and (b) directly against the fake provider over
// its stdio JSON-RPC (turn/start → turn/completed), in the same run, on one
// warm session / thread each. It prints p50 and p99 of each and the ratio,
// plus SubmitRun → turn.started (PERFORMANCE.md, SPEC P4: ≤ 2× end to end;
// turn.started p50 ≤ 8 ms on a warm session). -cancels measures SPEC P2
// instead (cancel.go), -sessions the memory of idle warm sessions,
// -throughput the fleet's short runs/s and CPU per run (throughput.go).
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

func run() error {
	self, _ := os.Executable()
	binDir := flag.String("bin-dir", filepath.Dir(self), "directory with the tether binaries")
	turns := flag.Int("turns", 100, "measured turns per side")
	warm := flag.Int("warmup", 5, "warm-up turns per side")
	keep := flag.Bool("keep", false, "keep the temporary directory (logs)")
	trace := flag.Bool("trace", false, "print the timeline of the last turn")
	settle := flag.Duration("settle", 10*time.Millisecond, "pause before each turn of either side")
	sessions := flag.String("sessions", "", "instead of the warm turn: RSS/PSS per idle warm session at these session counts (e.g. 10,50)")
	takeovers := flag.Int("takeovers", 0, "instead of the warm turn: kill -9 of the driving executor → the run's next event from the other replica, this many times (SPEC P3)")
	sameHost := flag.Bool("same-host-takeover", true, "-takeovers: the executors take over on proof of death on this host (else after lease expiry)")
	ttl := flag.Duration("lease-ttl", 3*time.Second, "-takeovers: the executors' lease TTL")
	sigterm := flag.Bool("sigterm", false, "-takeovers: SIGTERM the driving executor instead of kill -9 (it hands its lease back; target ≤ 1 s)")
	cancels := flag.Int("cancels", 0, "instead of the warm turn: CancelRun → provider interrupt acknowledged over this many live turns (SPEC P2)")
	throughput := flag.Int("throughput", 0, "instead of the warm turn: this many short warm runs over -p5-sessions sessions, runs/s and CPU per run of each process kind (SPEC P5)")
	gateways := flag.Int("gateways", 1, "-throughput: runner gateways (as on separate hosts, registered with the executor)")
	p5Sessions := flag.Int("p5-sessions", 12, "-throughput: warm sessions the runs are spread over")
	anchorN := flag.Int("anchors", 100, "warm turn: samples of each raw anchor (fdatasync, atomic replace, commit, gRPC ping-pong) before and after the turns")
	idleTurns := flag.Int("idle-turns", 5, "after the warm turn: turns each after 2 × -idle-checkpoint-after idle with the backup verifier on, each idle period checkpointed online (SPEC P6); 0: none")
	idleCheckpointAfter := flag.Duration("idle-checkpoint-after", time.Second, "the executor's -checkpoint-after in the warm-turn run (no measured warm turn idles that long)")
	idleControl := flag.Bool("idle-control", false, "-idle-turns without checkpoints (-checkpoint-after 0): the same idle periods, to tell idleness from checkpointing")
	flag.Parse()
	if *gateways < 1 {
		return fmt.Errorf("-gateways: want ≥ 1, got %d", *gateways)
	}
	var sizes []int
	if *sessions != "" {
		for f := range strings.SplitSeq(*sessions, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
				return fmt.Errorf("-sessions: want increasing counts ≥ 1, got %q", *sessions)
			}
			sizes = append(sizes, n)
		}
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tether-bench-stack-")
	if err != nil {
		return err
	}
	defer func() {
		if *keep {
			fmt.Println("kept", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	fakeArgs := []string{"--delta-delay-ms", "0"}

	ds, err := startDirect(filepath.Join(*binDir, "fake-codex-app-server"), filepath.Join(dir, "direct"), fakeArgs)
	if err != nil {
		return fmt.Errorf("direct: %w", err)
	}
	defer ds.close()

	cluster, err := pgtest.Start(ctx, pgtest.WithDurable())
	if err != nil {
		return err
	}
	defer cluster.Close()
	if err := cluster.CreateDatabase(ctx, "tether"); err != nil {
		return err
	}
	opts := stack.Options{BinDir: *binDir, Dir: filepath.Join(dir, "stack"), DatabaseURL: cluster.DSN("tether"), FakeArgs: fakeArgs}
	// The warm turn traces every synced write of the stack's processes
	// (pkg/synctrace): the executor and the gateway inherit the variable,
	// runnerd gets it from the gateway, the provider by its flag.
	traceDir := ""
	if len(sizes) == 0 && *takeovers == 0 && *throughput == 0 {
		traceDir = filepath.Join(dir, "synctrace")
		if err := os.MkdirAll(traceDir, 0o700); err != nil {
			return err
		}
		opts.Env = append(opts.Env, synctrace.EnvVar+"="+traceDir)
		opts.FakeArgs = append(append([]string(nil), fakeArgs...), "--sync-trace", traceDir)
		if *idleTurns > 0 {
			// Production's checkpoint policy (a verifier and
			// -checkpoint-after), for the turns after idle periods.
			if !*idleControl {
				opts.CheckpointAfter = *idleCheckpointAfter
			}
			opts.ExecutorArgs = append(opts.ExecutorArgs, "-idle-sweep-interval", "100ms")
		}
	}
	if *takeovers > 0 {
		opts.LeaseTTL = *ttl
		opts.ExecutorArgs = []string{"-same-host-takeover=" + strconv.FormatBool(*sameHost)}
	}
	st, err := stack.New(opts)
	if err != nil {
		return err
	}
	defer st.Stop()
	if *throughput > 0 && *gateways > 1 {
		st.SetExtraArgs("runnergw", st.RegistryArgs("executor")...)
		for g := 2; g <= *gateways; g++ {
			if err := st.AddGateway(gatewayName(g), st.RegistryArgs("executor")...); err != nil {
				return err
			}
		}
	}
	if err := st.StartAll(ctx); err != nil {
		return err
	}
	for g := 2; *throughput > 0 && g <= *gateways; g++ {
		if _, err := st.Start(ctx, gatewayName(g)); err != nil {
			return err
		}
	}
	if *takeovers > 0 {
		if err := st.AddExecutor("executor-2"); err != nil {
			return err
		}
		if _, err := st.Start(ctx, "executor-2"); err != nil {
			return err
		}
		return takeoverTime(ctx, st, cluster.DSN("tether"), *ttl, *sameHost, *sigterm, *takeovers)
	}
	conn, err := grpcx.Dial(st.Addr("executor"), "")
	if err != nil {
		return err
	}
	defer conn.Close()
	client := executorv1.NewExecutorServiceClient(conn)
	if len(sizes) > 0 {
		return sessionsCurve(ctx, client, st.Proc("runnergw").Pid(), sizes)
	}
	if *cancels > 0 {
		return cancelLatency(ctx, client, *warm, *cancels, traceDir)
	}
	if *throughput > 0 {
		return fleetThroughput(ctx, st, client, cluster.Dir(), *gateways, *p5Sessions, *throughput)
	}
	ops, err := openAnchors(ctx, filepath.Join(dir, "anchors"), cluster.DSN("tether"))
	if err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	defer ops.close()
	var raw anchors
	if err := ops.measure(ctx, &raw, *anchorN); err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	var direct, directStarted, e2e, started []time.Duration
	var windows []turnWindow
	var lastT0 time.Time
	var lastID string
	for i := 0; i < *warm+*turns; i++ {
		prompt := fmt.Sprintf("turn %d", i)
		time.Sleep(*settle)
		ds0, d, err := ds.turn(prompt)
		if err != nil {
			return fmt.Errorf("direct: %w", err)
		}
		if i >= *warm {
			direct = append(direct, d)
			directStarted = append(directStarted, ds0)
		}
		in, err := cli.InputSpec{Prompt: prompt, Company: "bench", Agent: "bench", Session: "bench", Lifecycle: "warm"}.Input()
		if err != nil {
			return err
		}
		id := fmt.Sprintf("bench-%d", i)
		time.Sleep(*settle)
		t0 := time.Now()
		lastT0, lastID = t0, id
		if _, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in}); err != nil {
			return err
		}
		stream, err := client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id})
		if err != nil {
			return err
		}
		var tStarted, tEnd time.Duration
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			switch m.GetEvent().GetEventType() {
			case "turn.started":
				tStarted = time.Since(t0)
			case "run.terminal":
				tEnd = time.Since(t0)
				if s := m.GetEvent().GetPayload().AsMap()["runTerminalState"]; s != "succeeded" {
					return fmt.Errorf("run %s ended %v", id, s)
				}
			}
		}
		if i >= *warm {
			e2e = append(e2e, tEnd)
			started = append(started, tStarted)
			windows = append(windows, turnWindow{t0: t0, started: t0.Add(tStarted), end: t0.Add(tEnd)})
		}
	}
	if err := ops.measure(ctx, &raw, *anchorN); err != nil {
		return fmt.Errorf("anchors: %w", err)
	}
	if *trace {
		pool, err := pgxpool.New(ctx, cluster.DSN("tether"))
		if err != nil {
			return err
		}
		rows, err := pool.Query(ctx, `SELECT seq, event_type, created_at FROM executor.events WHERE run_id = $1 ORDER BY seq`, lastID)
		if err != nil {
			return err
		}
		var claimed, startedAt time.Time
		_ = pool.QueryRow(ctx, `SELECT started_at FROM executor.coordinators WHERE run_id = $1`, lastID).Scan(&startedAt)
		claimed = startedAt
		fmt.Printf("trace %s: claimed at +%s\n", lastID, claimed.Sub(lastT0))
		for rows.Next() {
			var seq int64
			var typ string
			var at time.Time
			if err := rows.Scan(&seq, &typ, &at); err != nil {
				return err
			}
			fmt.Printf("  %3d %-24s persisted at +%s\n", seq, typ, at.Sub(lastT0))
		}
		rows.Close()
		pool.Close()
	}
	dp50, dp99 := pct(direct, 50), pct(direct, 99)
	sp50, sp99 := pct(e2e, 50), pct(e2e, 99)
	tp50 := pct(started, 50)
	ratio := float64(sp50) / float64(dp50)
	fmt.Printf("\n%-28s %12s %12s %12s %10s %6s\n", "figure", "tether p50", "tether p99", "direct p50", "ratio", "target")
	fmt.Printf("%-28s %12s %12s %12s %9.2fx %6s %s\n", "warm turn end to end", sp50, sp99, dp50, ratio, "≤2x", markOf(ratio <= 2))
	fmt.Printf("%-28s %12s %12s %12s %10s %6s %s\n", "SubmitRun → turn.started", tp50, pct(started, 99), "-", "-", "≤8ms", markOf(tp50 <= 8*time.Millisecond))
	fmt.Printf("BENCH warm_turn tether_p50_ms=%.3f tether_p99_ms=%.3f direct_p50_ms=%.3f direct_p99_ms=%.3f ratio=%.3f target=2.00 met=%t\n",
		ms(sp50), ms(sp99), ms(dp50), ms(dp99), ratio, ratio <= 2)
	fmt.Printf("BENCH submit_to_turn_started p50_ms=%.3f p99_ms=%.3f target_ms=8 met=%t\n", ms(tp50), ms(pct(started, 99)), tp50 <= 8*time.Millisecond)
	raw.print()
	writes, err := reportSynced(traceDir, windows, raw)
	if err != nil {
		return err
	}
	floor{direct: pct(directStarted, 50), writes: writes, commit: pct(raw.commit, 50), hops: pathHops, pingPong: pct(raw.pingPong, 50)}.print(tp50)
	if *idleTurns > 0 {
		return turnsAfterIdle(ctx, client, *idleTurns, *idleCheckpointAfter, sp50, traceDir, raw, !*idleControl)
	}
	return nil
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
	if _, err := d.call("initialize", map[string]any{"clientInfo": map[string]any{"name": "bench", "version": "1"}}); err != nil {
		d.close()
		return nil, err
	}
	res, err := d.call("thread/start", map[string]any{"cwd": home})
	if err != nil {
		d.close()
		return nil, err
	}
	d.thread, _ = res["thread"].(map[string]any)["id"].(string)
	return d, nil
}

func (d *directSession) close() { _ = d.stdin.Close(); _ = d.cmd.Wait() }

func (d *directSession) call(method string, params any) (map[string]any, error) {
	d.id++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": d.id, "method": method, "params": params})
	if _, err := d.stdin.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	for {
		line, err := d.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if m["method"] == "turn/started" && d.onStarted != nil {
			d.onStarted()
		}
		if v, ok := m["id"].(float64); ok && int(v) == d.id && m["method"] == nil {
			if e, ok := m["error"]; ok {
				return nil, fmt.Errorf("%s: %v", method, e)
			}
			res, _ := m["result"].(map[string]any)
			return res, nil
		}
	}
}

// turn runs one turn: turn/start sent → turn/started and turn/completed
// read (turn/started may come before turn/start's answer).
func (d *directSession) turn(prompt string) (started, completed time.Duration, err error) {
	t0 := time.Now()
	d.onStarted = func() { started = time.Since(t0) }
	defer func() { d.onStarted = nil }()
	if _, err := d.call("turn/start", map[string]any{"threadId": d.thread, "input": []any{map[string]any{"type": "text", "text": prompt}}}); err != nil {
		return 0, 0, err
	}
	for {
		line, err := d.r.ReadBytes('\n')
		if err != nil {
			return 0, 0, err
		}
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch m["method"] {
		case "turn/started":
			d.onStarted()
		case "turn/completed":
			return started, time.Since(t0), nil
		}
	}
}
