package main

// Unary figures (SPEC P1): the executor's API at -unary-callers concurrent
// callers over one loopback gRPC connection, each against the baseline that
// bounds it, both sides in alternating slices.
//
// The baseline of both is a bare grpc-go server in a process of its own (this
// binary, re-executed) whose handlers do the same SQL work with pgx and
// nothing else (rawExecutor), called the same way:
//
//   - unary_getrun: GetRun of a stored run (one indexed read of the run and
//     its coordinator) against the raw handler's read of the same row.
//     Target ≥ 70 % of its QPS, p99 ≤ 2×.
//   - unary_submit: SubmitRun of new runs in one warm session (a durable
//     commit of the run and its coordinator, then the read back) against the
//     raw handler inserting the same rows (same input bytes) into copies of
//     the tables in one transaction. Target ≥ 70 % of its rate, p99 ≤ 2×.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// rawServerEnv makes this binary serve the raw unary baseline instead of
// measuring: it connects to the database named by the variable's value,
// prints its address and serves until stdin closes.
const rawServerEnv = "TETHER_BENCH_RAW_UNARY_SERVER"

// rawExecutor is the fair baseline of the executor's unary API (SPEC P1):
// a bare grpc-go server (no interceptors) whose handlers do the same SQL
// work as the executor's, written directly with pgx. GetRun reads the same
// single row (the run joined with its coordinator, the same columns, the
// input decoded); SubmitRun inserts the same two rows (run and coordinator)
// into the baseline copies of the tables in one transaction.
type rawExecutor struct {
	executorv1.UnimplementedExecutorServiceServer
	pool *pgxpool.Pool
}

// rawGetRunSQL is the executor's run read (the run by the id its company
// chose, joined with its coordinator), column for column.
const rawGetRunSQL = `SELECT r.client_run_id, CASE WHEN r.state IN ('succeeded', 'failed', 'cancelled') THEN r.state WHEN c.phase = 'observed' THEN 'running' ELSE 'queued' END, c.phase, c.attempt, coalesce(c.lease_owner, ''), c.lease_expires_at,
	r.input, r.result, coalesce(r.failure_code, ''), coalesce(r.failure_message, ''), r.event_count,
	coalesce(r.runner_instance_id, ''), r.runner_process, r.provider_process,
	r.created_at, r.updated_at, c.started_at, r.ended_at, r.submit_seq,
	r.result_metadata -> 'nativeCancellation', r.recovery, coalesce(r.plan, ''),
	r.usage_input_tokens, r.usage_cached_input_tokens, r.usage_output_tokens, r.cost_usd::float8,
	coalesce(r.queued_reason, ''), coalesce(r.queued_message, ''), coalesce(r.submitted_by, ''), r.run_id, r.company_id
FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
WHERE r.client_run_id = $1`

func (x rawExecutor) GetRun(ctx context.Context, req *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	var (
		run                                    executorv1.Run
		state, failCode, failMsg, key, company string
		leaseExp, startedAt, endedAt           *time.Time
		createdAt, updatedAt                   time.Time
		input, result, runnerProc, providerPrc []byte
		seq                                    int64
		cancel, recovery                       []byte
		usageIn, usageCached, usageOut         *int64
		costUSD                                *float64
		queuedReason, queuedMsg                string
	)
	err := x.pool.QueryRow(ctx, rawGetRunSQL, req.GetRunId()).Scan(&run.RunId, &state, &run.Phase, &run.Attempt, &run.LeaseOwner, &leaseExp,
		&input, &result, &failCode, &failMsg, &run.EventCount, &run.RunnerInstanceId, &runnerProc, &providerPrc,
		&createdAt, &updatedAt, &startedAt, &endedAt, &seq, &cancel, &recovery, &run.Plan,
		&usageIn, &usageCached, &usageOut, &costUSD, &queuedReason, &queuedMsg, &run.SubmittedBy, &key, &company)
	if err != nil {
		return nil, err
	}
	run.Input = &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(input, run.Input); err != nil {
		return nil, err
	}
	// The answer tether gives from the same columns (store.scanRun): the
	// state, the failure or queued reason, the timestamps.
	run.State = rawStates[state]
	if failCode != "" {
		run.Failure = &executorv1.Failure{Code: failCode, Message: failMsg}
	}
	if queuedReason != "" && state == "queued" {
		run.QueuedReason = &executorv1.Failure{Code: queuedReason, Message: queuedMsg}
	}
	run.CreatedAt, run.UpdatedAt = timestamppb.New(createdAt), timestamppb.New(updatedAt)
	for _, t := range []struct {
		dst **timestamppb.Timestamp
		src *time.Time
	}{{&run.LeaseExpiresAt, leaseExp}, {&run.StartedAt, startedAt}, {&run.EndedAt, endedAt}} {
		if t.src != nil {
			*t.dst = timestamppb.New(*t.src)
		}
	}
	return &executorv1.GetRunResponse{Run: &run}, nil
}

var rawStates = map[string]executorv1.RunState{
	"queued": executorv1.RunState_RUN_STATE_QUEUED, "running": executorv1.RunState_RUN_STATE_RUNNING,
	"succeeded": executorv1.RunState_RUN_STATE_SUCCEEDED, "failed": executorv1.RunState_RUN_STATE_FAILED,
	"cancelled": executorv1.RunState_RUN_STATE_CANCELLED,
}

// rawSubmitSQL inserts the rows SubmitRun inserts (run and coordinator,
// the same columns: the submitter is recorded too) into the baseline
// tables in one statement, one transaction, and returns what the answer
// carries.
const rawSubmitSQL = `
WITH ins AS (
  INSERT INTO tether_bench.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest, issue_id, agent_id, submitted_by, client_run_id)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $1)
  RETURNING run_id, session_scope, submit_seq, created_at, updated_at),
co AS (
  INSERT INTO tether_bench.coordinators (run_id, binding_digest, session_scope, submit_seq, company_id)
  SELECT run_id, $10, session_scope, submit_seq, $2 FROM ins
  RETURNING phase, attempt)
SELECT ins.created_at, ins.updated_at, co.phase, co.attempt FROM ins, co`

func (x rawExecutor) SubmitRun(ctx context.Context, req *executorv1.SubmitRunRequest) (*executorv1.SubmitRunResponse, error) {
	in := req.GetInput()
	digest, raw, err := store.InputDigest(in)
	if err != nil {
		return nil, err
	}
	// The submitter, as the executor names a loopback caller without
	// credentials.
	by := "dev:addr:"
	if p, ok := peer.FromContext(ctx); ok {
		by += p.Addr.String()
	}
	run := &executorv1.Run{RunId: req.GetRunId(), Input: in, State: executorv1.RunState_RUN_STATE_QUEUED, SubmittedBy: by}
	var created, updated time.Time
	if err := x.pool.QueryRow(ctx, rawSubmitSQL, req.GetRunId(), in.GetBinding().GetCompanyId(), in.GetSession().GetNormalizedSessionId(),
		scope.OfRun(req.GetRunId(), in), in.GetSession().GetLifecycle().GetMode().String(), raw, digest,
		in.GetBinding().GetIssueId(), in.GetBinding().GetAgentId(), store.BindingDigest(in), by).Scan(&created, &updated, &run.Phase, &run.Attempt); err != nil {
		return nil, err
	}
	run.CreatedAt, run.UpdatedAt = timestamppb.New(created), timestamppb.New(updated)
	return &executorv1.SubmitRunResponse{Created: true, Run: run}, nil
}

// serveRaw is the baseline process's main.
func serveRaw(dsn string) error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// The executor's pool size (-database-max-conns' default: 4 per core,
	// at least 8), not pgx's default (as many as cores, at least 4).
	cfg.MaxConns = int32(max(8, 4*runtime.NumCPU()))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	executorv1.RegisterExecutorServiceServer(s, rawExecutor{pool: pool})
	fmt.Println(l.Addr().String())
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the bench ends
		s.Stop()
	}()
	return s.Serve(l)
}

// startRaw starts the baseline process and returns its address and stop.
func (b *bench) startRaw() (string, int, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), rawServerEnv+"="+b.dsn)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", 0, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop := func() { stdin.Close(); _ = cmd.Wait() }
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("the raw unary server: %w", err)
	}
	return addr[:len(addr)-1], cmd.Process.Pid, stop, nil
}

// sameAnswerSize calls each side once and prints the size of its answer:
// the baseline answers what tether does, so the two stay within a few
// bytes (what differs: the run's key, its timestamps, fields tether fills
// that the baseline leaves out).
func sameAnswerSize(ctx context.Context, name string, tether, raw func() (proto.Message, error)) error {
	t, err := tether()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	r, err := raw()
	if err != nil {
		return fmt.Errorf("%s (raw): %w", name, err)
	}
	logf("%s: answer %d B, raw %d B", name, proto.Size(t), proto.Size(r))
	return nil
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
//
// Besides the rates it prints the CPU each side's server process spent
// per call (tetherPID, rawPID) and the database server's (all its
// processes, when it runs on this machine) per call of each side.
func (b *bench) unaryFigure(ctx context.Context, name, unit string, tetherPID, rawPID int, tether, raw func(ctx context.Context, slice, caller, i int) error) (result, error) {
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
	var tCPU, rCPU, tDB, rDB time.Duration
	pm := b.postmaster(ctx)
	slice := b.cfg.duration / time.Duration(b.cfg.slices)
	side := func(op func(ctx context.Context, slice, caller, i int) error, acc *latencies, pid int, cpu, db *time.Duration) func(int) (measurement, error) {
		return func(s int) (measurement, error) {
			c0, d0 := processCPU(pid), childrenCPU(pm)
			l, err := closedLoop(ctx, slice, b.cfg.unaryCallers, func(ctx context.Context, c, i int) error { return op(ctx, s, c, i) })
			*cpu += processCPU(pid) - c0
			if pm != 0 {
				*db += childrenCPU(pm) - d0
			}
			acc.add(l)
			return l.measurement, err
		}
	}
	tm, rm, err := alternate(b.cfg.slices, side(tether, &t, tetherPID, &tCPU, &tDB), side(raw, &r, rawPID, &rCPU, &rDB))
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	res.tether, res.raw = tm, rm
	res.tetherP99, res.rawP99 = pct(t.each, 99), pct(r.each, 99)
	logf("%s: %d callers: tether %.0f/s p50 %.3f ms p99 %.3f ms; raw %.0f/s p50 %.3f ms p99 %.3f ms",
		name, b.cfg.unaryCallers, tm.rate(), ms(pct(t.each, 50)), ms(res.tetherP99), rm.rate(), ms(pct(r.each, 50)), ms(res.rawP99))
	perCall := func(d time.Duration, n int64) float64 { return float64(d.Microseconds()) / float64(max(n, 1)) }
	logf("%s: CPU per call: server tether %.0f µs, raw %.0f µs; database tether %.0f µs, raw %.0f µs (load %s)",
		name, perCall(tCPU, t.ops), perCall(rCPU, r.ops), perCall(tDB, t.ops), perCall(rDB, r.ops), loadAvg())
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
	// The run read is held by this process (a lease it does not renew, for
	// the figure's length): the executor's dispatcher would otherwise claim
	// it and retry it against the absent gateway while the figure runs.
	if err := b.heldHead(ctx, "p1-getrun", benchInput("p1-getrun")); err != nil {
		return result{}, err
	}
	addr, rawPID, stop, err := b.startRaw()
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
	if err := sameAnswerSize(ctx, "unary_getrun",
		func() (proto.Message, error) { return tether.GetRun(ctx, req) },
		func() (proto.Message, error) { return raw.GetRun(ctx, req) }); err != nil {
		return result{}, err
	}
	res, err := b.unaryFigure(ctx, "unary_getrun", "calls/s", exe.cmd.Process.Pid, rawPID,
		func(ctx context.Context, _, _, _ int) error { _, err := tether.GetRun(ctx, req); return err },
		func(ctx context.Context, _, _, _ int) error { _, err := raw.GetRun(ctx, req); return err })
	if err == nil {
		err = b.claimedByExecutor(ctx, "unary_getrun")
	}
	return res, err
}

// heldHead stores run id and claims it for this process
// (holderOwner, a lease of store.MaxLeaseTTL that is neither renewed nor driven):
// its session's later runs queue behind it and the executor under
// measurement never claims it.
func (b *bench) heldHead(ctx context.Context, id string, in *prpv1.ExecutionInput) error {
	// Stored and claimed in one transaction: the executor's dispatcher
	// never sees it unclaimed.
	_, c, _, err := b.st.SubmitClaim(ctx, id, in, holderOwner, store.MaxLeaseTTL, dispatch.SelfController(), nil)
	if err == nil && c == nil {
		err = fmt.Errorf("%s was not claimed at submission", id)
	}
	return err
}

// holderOwner holds the session heads of the unary figures.
const holderOwner = "bench-holder"

// claimedByExecutor counts the unary figures' runs (p1-…) that anyone but
// holderOwner claimed: the executor's dispatcher driving (and retrying
// against the absent gateway) what the figure should only submit or read.
// It is printed after each unary figure, and is 0.
func (b *bench) claimedByExecutor(ctx context.Context, name string) error {
	var n int
	if err := b.raw.QueryRow(ctx, `SELECT count(*) FROM executor.coordinators
 WHERE run_id LIKE 'p1-%' AND attempt > 0 AND lease_owner IS DISTINCT FROM $1`, holderOwner).Scan(&n); err != nil {
		return err
	}
	logf("%s: runs the executor claimed: %d", name, n)
	if b.cfg.unaryClaimed != nil {
		*b.cfg.unaryClaimed += n
	}
	return nil
}

// unarySubmit is P1's SubmitRun figure. Each caller submits to a warm
// session of its own whose head run this process holds (heldHead), so
// every submission queues behind it, as a turn submitted while its session
// is busy does: the figure is the submission path, not dispatch. (Until
// 2026-12-07 the first run of each session was claimed by the executor at
// submit, and its driver retried against the absent gateway for the whole
// figure: 32 runs failing and backing off inside the executor's CPU per
// call.) The baseline is the raw server's SubmitRun: the same rows
// inserted in one transaction.
func (b *bench) unarySubmit(ctx context.Context) (result, error) {
	exe, err := b.executorProcess(ctx)
	if err != nil {
		return result{}, err
	}
	addr, rawPID, stop, err := b.startRaw()
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
	inputs := make([]*prpv1.ExecutionInput, b.cfg.unaryCallers)
	for c := range inputs {
		inputs[c] = benchInput(fmt.Sprintf("p1-submit-%d", c))
		if err := b.heldHead(ctx, fmt.Sprintf("p1-head-%d", c), inputs[c]); err != nil {
			return result{}, err
		}
	}
	submit := func(client executorv1.ExecutorServiceClient, side string) func(ctx context.Context, s, c, i int) error {
		return func(ctx context.Context, s, c, i int) error {
			_, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("p1-%s-%d-%d-%d", side, s, c, i), Input: inputs[c]})
			return err
		}
	}
	probe := func(client executorv1.ExecutorServiceClient, side string) func() (proto.Message, error) {
		// A run queued behind the held head of caller 0's session, as
		// the measured ones are.
		return func() (proto.Message, error) {
			return client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "p1-size-" + side, Input: inputs[0]})
		}
	}
	if err := sameAnswerSize(ctx, "unary_submit", probe(tether, "t"), probe(raw, "r")); err != nil {
		return result{}, err
	}
	res, err := b.unaryFigure(ctx, "unary_submit", "runs/s", exe.cmd.Process.Pid, rawPID, submit(tether, "t"), submit(raw, "r"))
	if err == nil {
		err = b.claimedByExecutor(ctx, "unary_submit")
	}
	return res, err
}
