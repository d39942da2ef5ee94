package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// takeoverTime is SPEC P3: kill -9 of the executor driving a live turn →
// the run's next event, delivered by the other replica's WatchRun. The
// killed replica is restarted after each run, so each kill finds two. With
// sameHost the survivor takes over at once on proof of the driver's death
// (target ≤ 2 s); without, it waits for the lease to expire (≤ TTL + 1 s).
// With sigterm the driver is stopped with SIGTERM instead and hands its
// lease back (SPEC F5; target ≤ 1 s).
func takeoverTime(ctx context.Context, st *stack.Stack, dsn string, ttl time.Duration, sameHost, sigterm bool, n int) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	names := []string{"executor", "executor-2"}
	clients := map[string]executorv1.ExecutorServiceClient{}
	for _, name := range names {
		conn, err := grpcx.Dial(st.Addr(name), "")
		if err != nil {
			return err
		}
		defer conn.Close()
		clients[name] = executorv1.NewExecutorServiceClient(conn)
	}
	var lat []time.Duration
	for i := range n {
		d, err := takeoverOnce(ctx, st, pool, names, clients, i, sigterm)
		if err != nil {
			return err
		}
		lat = append(lat, d)
	}
	printTakeovers(lat, ttl, sameHost, sigterm)
	return nil
}

// takeoverOnce submits run i, waits for its turn to stream, stops the
// executor driving it and returns the time until the survivor delivers the
// run's next event; it restarts the stopped executor once the run ended.
func takeoverOnce(ctx context.Context, st *stack.Stack, pool *pgxpool.Pool, names []string, clients map[string]executorv1.ExecutorServiceClient, i int, sigterm bool) (time.Duration, error) {
	id := fmt.Sprintf("takeover-%d", i)
	if err := submitLive(ctx, clients["executor"], id, i); err != nil {
		return 0, err
	}
	var owner string
	if err := pool.QueryRow(ctx, `SELECT lease_owner FROM executor.coordinators WHERE run_id = $1`, id).Scan(&owner); err != nil {
		return 0, err
	}
	survivor := names[0]
	if owner == names[0] {
		survivor = names[1]
	} else if owner != names[1] {
		return 0, fmt.Errorf("run %s is driven by %q", id, owner)
	}
	t0 := time.Now()
	proc := st.Proc(owner)
	if sigterm {
		go proc.Stop(30 * time.Second)
	} else {
		proc.Kill()
	}
	// Everything persisted is in; the next event comes from the survivor.
	var count uint64
	if err := pool.QueryRow(ctx, `SELECT event_count FROM executor.runs WHERE run_id = $1`, id).Scan(&count); err != nil {
		return 0, err
	}
	next, err := clients[survivor].WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id, AfterSeq: count})
	if err != nil {
		return 0, err
	}
	if _, err := next.Recv(); err != nil {
		return 0, fmt.Errorf("run %s after the kill of %s: %w", id, owner, err)
	}
	d := time.Since(t0)
	for {
		m, err := next.Recv()
		if err != nil {
			return 0, fmt.Errorf("run %s after the takeover: %w", id, err)
		}
		if m.GetEvent().GetEventType() == "run.terminal" {
			if s := m.GetEvent().GetPayload().AsMap()["runTerminalState"]; s != "succeeded" {
				return 0, fmt.Errorf("run %s ended %v after the takeover", id, s)
			}
			break
		}
	}
	<-proc.Done()
	if _, err := st.Start(ctx, owner); err != nil {
		return 0, err
	}
	return d, nil
}

// submitLive submits takeover run id (the i-th) and waits until its turn
// streams, driven by one of the two executors.
func submitLive(ctx context.Context, client executorv1.ExecutorServiceClient, id string, i int) error {
	in, err := cli.InputSpec{Prompt: fmt.Sprintf("[slow] takeover %d", i), Company: "bench", Agent: "bench",
		Session: "takeover-bench", Lifecycle: "warm"}.Input()
	if err != nil {
		return err
	}
	if _, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in}); err != nil {
		return err
	}
	stream, err := client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id})
	if err != nil {
		return err
	}
	for live := false; !live; {
		m, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("run %s: no live turn: %w", id, err)
		}
		live = m.GetEvent().GetEventType() == "item.delta"
	}
	return nil
}

// printTakeovers prints the takeover latencies against their target.
func printTakeovers(lat []time.Duration, ttl time.Duration, sameHost, sigterm bool) {
	p50, p99 := pct(lat, 50), pct(lat, 99)
	limit, mode := 2*time.Second, "same_host"
	what := "kill -9"
	switch {
	case sigterm:
		limit, mode, what = time.Second, "sigterm_hand_back", "SIGTERM"
	case !sameHost:
		limit, mode = ttl+time.Second, "lease_expiry"
	}
	ok := p99 <= limit
	fmt.Printf("\n%-44s %10s %10s %10s %s\n", "figure", "p50", "p99", "target", "met")
	fmt.Printf("%-44s %10s %10s %10s %s\n", fmt.Sprintf("takeover after %s, %s (%d, TTL %s)", what, mode, len(lat), ttl),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), "≤"+limit.String(), markOf(ok))
	fmt.Printf("BENCH takeover_%s kills=%d ttl_s=%.0f p50_ms=%.1f p99_ms=%.1f target_ms=%.0f met=%t\n",
		mode, len(lat), ttl.Seconds(), ms(p50), ms(p99), ms(limit), ok)
}
