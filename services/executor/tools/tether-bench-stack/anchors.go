package main

// Raw anchors (SPEC P4, PERFORMANCE.md): what the machine's primitives cost
// in this very run, so that a warm turn's figures are judged against the
// floor they could reach here, not against a number taken on another day or
// another box. Measured before and after the turns (half each, so drift of
// the shared machine shows in both), each operation back to back from one
// client:
//
//   - fdatasync of a small append to a file in the stack's directory (what
//     runnerd's intent journal and outbox do);
//   - an atomic file replace as the services do it (pkg/atomicfile: write a
//     temporary file, fsync it, rename it over the old one, fsync the
//     directory);
//   - a one-row PostgreSQL commit from one client on the bench's own cluster
//     (an autocommitted INSERT: fsync and synchronous_commit on);
//   - a loopback gRPC unary ping-pong from one client (grpc-go's health
//     Check against a server in this process).
//
// The floor of SubmitRun → turn.started is the direct turn's turn/start →
// turn/started (the provider's own part, its saves included) + the synced
// writes on the stack's critical path × the commit p50 + the process hops on
// the path × the ping-pong p50. The hops are the pairs of adjacent processes
// the request crosses out and back: caller ↔ executor, executor ↔ gateway,
// gateway ↔ runnerd (runnerd ↔ provider is inside the direct figure).

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-run/tether/pkg/atomicfile"
)

// pathHops are the process hops on SubmitRun → turn.started besides the
// provider's stdio (see above).
const pathHops = 3

// anchors are the raw operations' latencies, each sample kept.
type anchors struct {
	fdatasync, replace, commit, pingPong []time.Duration
}

// anchorOps is one round of the four raw operations, n times each.
type anchorOps struct {
	dir  string
	conn *pgx.Conn
	hc   healthpb.HealthClient
	stop func()
}

func openAnchors(ctx context.Context, dir, dsn string) (*anchorOps, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.bench_anchor (id bigserial PRIMARY KEY, v text NOT NULL)`); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(l) }()
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		conn.Close(ctx)
		return nil, err
	}
	return &anchorOps{dir: dir, conn: conn, hc: healthpb.NewHealthClient(cc), stop: func() {
		cc.Close()
		srv.Stop()
		conn.Close(context.Background())
	}}, nil
}

func (o *anchorOps) close() { o.stop() }

// measure appends n samples of each operation to a.
func (o *anchorOps) measure(ctx context.Context, a *anchors, n int) error {
	f, err := os.OpenFile(filepath.Join(o.dir, "append.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	line := []byte(strings.Repeat("x", 255) + "\n")
	data := []byte(strings.Repeat("y", 1024))
	if _, err := o.hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil { // connect first
		return err
	}
	for range n {
		t0 := time.Now()
		if _, err := f.Write(line); err != nil {
			return err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return err
		}
		a.fdatasync = append(a.fdatasync, time.Since(t0))

		t0 = time.Now()
		if err := atomicfile.Write(o.dir, "state.json", data, 0o600); err != nil {
			return err
		}
		a.replace = append(a.replace, time.Since(t0))

		t0 = time.Now()
		if _, err := o.conn.Exec(ctx, `INSERT INTO public.bench_anchor (v) VALUES ($1)`, "anchor"); err != nil {
			return err
		}
		a.commit = append(a.commit, time.Since(t0))

		t0 = time.Now()
		if _, err := o.hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			return err
		}
		a.pingPong = append(a.pingPong, time.Since(t0))
	}
	return nil
}

// print prints the anchors' p50 and p99 with a BENCH line each.
func (a anchors) print() {
	fmt.Printf("\nraw anchors, this run (%d samples each, one client, before and after the turns):\n", len(a.commit))
	for _, x := range []struct {
		name, what string
		ds         []time.Duration
	}{
		{"fdatasync_append", "fdatasync of a 256 B append", a.fdatasync},
		{"atomic_replace", "atomic file replace (write, fsync, rename, fsync dir)", a.replace},
		{"pg_commit", "PostgreSQL one-row commit, one client", a.commit},
		{"grpc_ping_pong", "loopback gRPC unary ping-pong, one client", a.pingPong},
	} {
		fmt.Printf("  %-56s p50 %8s  p99 %8s\n", x.what, round(pct(x.ds, 50)), round(pct(x.ds, 99)))
		fmt.Printf("BENCH anchor_%s p50_ms=%.3f p99_ms=%.3f\n", x.name, ms(pct(x.ds, 50)), ms(pct(x.ds, 99)))
	}
}

// anchorOf is the raw operation that bounds a traced site: a PostgreSQL
// commit for the executor's writes, a small fdatasync for runnerd's
// journals, an atomic replace for whole-file states; "" for a step.
func (a anchors) anchorOf(process, site string, step bool) (string, time.Duration) {
	switch {
	case step:
		return "", 0
	case strings.HasPrefix(site, "executor."):
		return "pg commit", pct(a.commit, 50)
	case site == "runnerd.intents" || site == "runnerd.outbox":
		return "fdatasync", pct(a.fdatasync, 50)
	case strings.HasPrefix(site, "atomic") || site == "provider.save":
		return "atomic replace", pct(a.replace, 50)
	}
	return "", 0
}

// floor is SubmitRun → turn.started's floor (see above).
type floor struct {
	direct           time.Duration // direct turn/start → turn/started p50
	writes           int           // synced writes on the critical path to turn.started
	commit, pingPong time.Duration
	hops             int
}

func (f floor) total() time.Duration {
	return f.direct + time.Duration(f.writes)*f.commit + time.Duration(f.hops)*f.pingPong
}

func (f floor) print(started time.Duration) {
	ratio := float64(started) / float64(f.total())
	fmt.Printf("\nfloor of SubmitRun → turn.started = direct turn/start → turn/started %s + %d synced writes × commit %s + %d hops × ping-pong %s = %s\n",
		round(f.direct), f.writes, round(f.commit), f.hops, round(f.pingPong), round(f.total()))
	fmt.Printf("SubmitRun → turn.started p50 %s = %.2f× its floor (target ≤ 2×) %s\n", round(started), ratio, markOf(ratio <= 2))
	fmt.Printf("BENCH submit_to_turn_started_floor floor_ms=%.3f direct_started_ms=%.3f writes=%d commit_ms=%.3f hops=%d ping_pong_ms=%.3f tether_p50_ms=%.3f ratio=%.3f target=2.00 met=%t\n",
		ms(f.total()), ms(f.direct), f.writes, ms(f.commit), f.hops, ms(f.pingPong), ms(started), ratio, ratio <= 2)
}
