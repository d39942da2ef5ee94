package main

// Unary figures (SPEC P1): the executor's API at -unary-callers concurrent
// callers over one loopback gRPC connection, each against the baseline that
// bounds it, both sides in alternating slices.
//
//   - unary_getrun: GetRun of a stored run (one indexed read) against an
//     empty grpc-go unary handler in a process of its own (this binary,
//     re-executed), called the same way. Target ≥ 70 % of its QPS, p99 ≤ 2×.
//   - unary_submit: SubmitRun of new runs in one warm session (a durable
//     commit of the run and its coordinator, then the read back) against raw
//     pgx inserts of the same rows (same input bytes) into copies of the
//     tables by as many clients, one autocommitted statement each. Target
//     ≥ 70 % of its rate, p99 ≤ 2×.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// emptyServerEnv makes this binary serve the empty unary baseline instead of
// measuring: it prints its address and serves until stdin closes.
const emptyServerEnv = "TETHER_BENCH_EMPTY_UNARY_SERVER"

// emptyExecutor answers GetRun with an empty response and nothing else.
type emptyExecutor struct {
	executorv1.UnimplementedExecutorServiceServer
}

func (emptyExecutor) GetRun(context.Context, *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	return &executorv1.GetRunResponse{}, nil
}

// serveEmpty is the baseline process's main.
func serveEmpty() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	executorv1.RegisterExecutorServiceServer(s, emptyExecutor{})
	fmt.Println(l.Addr().String())
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the bench ends
		s.Stop()
	}()
	return s.Serve(l)
}

// startEmpty starts the baseline process and returns its address and stop.
func startEmpty() (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), emptyServerEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { stdin.Close(); _ = cmd.Wait() }
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("the empty unary server: %w", err)
	}
	return addr[:len(addr)-1], stop, nil
}

// latencies is a measurement with each operation's latency.
type latencies struct {
	measurement
	each []time.Duration
}

func (l *latencies) add(o latencies) {
	l.measurement.add(o.measurement)
	l.each = append(l.each, o.each...)
}

// closedLoop runs op back to back on callers goroutines for d.
func closedLoop(ctx context.Context, d time.Duration, callers int, op func(ctx context.Context, caller, i int) error) (latencies, error) {
	var (
		mu       sync.Mutex
		out      latencies
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			var each []time.Duration
			var err error
			for i := 0; time.Since(start) < d && ctx.Err() == nil; i++ {
				t0 := time.Now()
				if err = op(ctx, c, i); err != nil {
					break
				}
				each = append(each, time.Since(t0))
			}
			mu.Lock()
			out.each = append(out.each, each...)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	out.ops, out.elapsed = int64(len(out.each)), time.Since(start)
	return out, firstErr
}

// unaryFigure warms both sides, alternates slices and checks the p99s.
func (b *bench) unaryFigure(ctx context.Context, name, unit string, tether, raw func(ctx context.Context, slice, caller, i int) error) (result, error) {
	res := result{name: name, unit: unit, target: 0.70, p99Limit: 2}
	warm := func(op func(ctx context.Context, slice, caller, i int) error) error {
		_, err := closedLoop(ctx, b.cfg.warmup, b.cfg.unaryCallers, func(ctx context.Context, c, i int) error { return op(ctx, -1, c, i) })
		return err
	}
	if err := warm(tether); err != nil {
		return res, fmt.Errorf("%s warm-up: %w", name, err)
	}
	if err := warm(raw); err != nil {
		return res, fmt.Errorf("%s warm-up (raw): %w", name, err)
	}
	b.settle(ctx)
	var t, r latencies
	slice := b.cfg.duration / time.Duration(b.cfg.slices)
	side := func(op func(ctx context.Context, slice, caller, i int) error, acc *latencies) func(int) (measurement, error) {
		return func(s int) (measurement, error) {
			l, err := closedLoop(ctx, slice, b.cfg.unaryCallers, func(ctx context.Context, c, i int) error { return op(ctx, s, c, i) })
			acc.add(l)
			return l.measurement, err
		}
	}
	tm, rm, err := alternate(b.cfg.slices, side(tether, &t), side(raw, &r))
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	res.tether, res.raw = tm, rm
	res.tetherP99, res.rawP99 = pct(t.each, 99), pct(r.each, 99)
	logf("%s: %d callers: tether %.0f/s p50 %.3f ms p99 %.3f ms; raw %.0f/s p50 %.3f ms p99 %.3f ms",
		name, b.cfg.unaryCallers, tm.rate(), ms(pct(t.each, 50)), ms(res.tetherP99), rm.rate(), ms(pct(r.each, 50)), ms(res.rawP99))
	return res, nil
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentile(s, p)
}

// executorProcess starts the executor the unary figures call, once.
func (b *bench) executorProcess(ctx context.Context) (*executorProc, error) {
	if b.exe == nil {
		exe, err := startExecutor(ctx, b.cfg.executor, b.dsn)
		if err != nil {
			return nil, err
		}
		b.exe = exe
	}
	return b.exe, nil
}

func dialLoopback(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// unaryGetRun is P1's GetRun figure.
func (b *bench) unaryGetRun(ctx context.Context) (result, error) {
	exe, err := b.executorProcess(ctx)
	if err != nil {
		return result{}, err
	}
	if _, err := b.st.Submit(ctx, "p1-getrun", benchInput("p1-getrun")); err != nil {
		return result{}, err
	}
	addr, stop, err := startEmpty()
	if err != nil {
		return result{}, err
	}
	defer stop()
	tc, err := dialLoopback(exe.addr)
	if err != nil {
		return result{}, err
	}
	defer tc.Close()
	rc, err := dialLoopback(addr)
	if err != nil {
		return result{}, err
	}
	defer rc.Close()
	tether, raw := executorv1.NewExecutorServiceClient(tc), executorv1.NewExecutorServiceClient(rc)
	req := &executorv1.GetRunRequest{RunId: "p1-getrun"}
	return b.unaryFigure(ctx, "unary_getrun", "calls/s",
		func(ctx context.Context, _, _, _ int) error { _, err := tether.GetRun(ctx, req); return err },
		func(ctx context.Context, _, _, _ int) error { _, err := raw.GetRun(ctx, req); return err })
}

// rawSubmitSQL inserts the rows SubmitRun inserts (run and coordinator) into
// the baseline tables in one autocommitted statement.
const rawSubmitSQL = `
WITH ins AS (
  INSERT INTO tether_bench.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, issue_id, agent_id)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO tether_bench.coordinators (run_id, binding_digest, session_scope, submit_seq)
SELECT run_id, $10, session_scope, submit_seq FROM ins`

// unarySubmit is P1's SubmitRun figure. Each caller submits to a warm
// session of its own: the first run of each is claimed (and its attempt fails
// fast at the absent gateway, to retry later); the rest queue behind it, so
// the figure is the submission path, not dispatch.
func (b *bench) unarySubmit(ctx context.Context) (result, error) {
	exe, err := b.executorProcess(ctx)
	if err != nil {
		return result{}, err
	}
	tc, err := dialLoopback(exe.addr)
	if err != nil {
		return result{}, err
	}
	defer tc.Close()
	tether := executorv1.NewExecutorServiceClient(tc)
	type caller struct {
		in          *prpv1.ExecutionInput
		digest, raw any
	}
	callers := make([]caller, b.cfg.unaryCallers)
	for c := range callers {
		in := benchInput(fmt.Sprintf("p1-submit-%d", c))
		digest, raw, err := store.InputDigest(in)
		if err != nil {
			return result{}, err
		}
		callers[c] = caller{in: in, digest: digest, raw: raw}
	}
	id := func(side string, slice, caller, i int) string {
		return fmt.Sprintf("p1-%s-%d-%d-%d", side, slice, caller, i)
	}
	return b.unaryFigure(ctx, "unary_submit", "runs/s",
		func(ctx context.Context, s, c, i int) error {
			_, err := tether.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id("t", s, c, i), Input: callers[c].in})
			return err
		},
		func(ctx context.Context, s, c, i int) error {
			runID, in := id("r", s, c, i), callers[c].in
			_, err := b.raw.Exec(ctx, rawSubmitSQL, runID, in.GetBinding().GetCompanyId(), in.GetSession().GetNormalizedSessionId(),
				scope.OfRun(runID, in), in.GetSession().GetLifecycle().GetMode().String(), callers[c].raw, callers[c].digest,
				in.GetBinding().GetIssueId(), in.GetBinding().GetAgentId(), store.BindingDigest(in))
			return err
		})
}
