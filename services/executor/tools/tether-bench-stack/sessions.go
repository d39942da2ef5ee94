package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// sessionsCurve (-sessions 10,50) is the idle_session curve: it opens warm
// sessions (one turn each, then idle; distinct sessions) up to each count
// and sums RSS and PSS over the processes the gateway launched for them
// (runnerd and the provider's processes: every descendant of runnergw), per
// session. PSS shares each page among the processes mapping it, so its sum
// is the memory the sessions really take.
func sessionsCurve(ctx context.Context, client executorv1.ExecutorServiceClient, gatewayPID int, sizes []int) error {
	type point struct {
		n, procs int
		rss, pss float64 // MiB per session
	}
	var points []point
	opened := 0
	for _, n := range sizes {
		if err := openSessions(ctx, client, opened, n); err != nil {
			return err
		}
		opened = n
		time.Sleep(time.Second) // let the sessions' last writes and acks settle
		procs, rssKiB, pssKiB, err := treeMemory(gatewayPID)
		if err != nil {
			return err
		}
		p := point{n: n, procs: procs, rss: float64(rssKiB) / 1024 / float64(n), pss: float64(pssKiB) / 1024 / float64(n)}
		fmt.Printf("bench: idle_session: %d warm sessions: %d processes (%.1f per session); per session RSS %.1f MiB, PSS %.1f MiB\n",
			n, procs, float64(procs)/float64(n), p.rss, p.pss)
		points = append(points, p)
	}
	first, last := points[0], points[len(points)-1]
	for _, m := range []struct {
		name string
		get  func(point) float64
	}{{"idle_session_rss", func(p point) float64 { return p.rss }}, {"idle_session_pss", func(p point) float64 { return p.pss }}} {
		var line, xs, vs []string
		for _, p := range points {
			line = append(line, fmt.Sprintf("%d: %.1f", p.n, m.get(p)))
			xs, vs = append(xs, strconv.Itoa(p.n)), append(vs, fmt.Sprintf("%.3f", m.get(p)))
		}
		ratio := m.get(last) / m.get(first)
		fmt.Printf("curve %s (MiB per session) vs sessions:  %s  largest/smallest %.2f×\n", m.name, strings.Join(line, "  "), ratio)
		fmt.Printf("BENCH curve_%s sessions=%s values=%s ratio=%.3f target=0.00 met=true unit=MiB_per_session\n",
			m.name, strings.Join(xs, ","), strings.Join(vs, ","), ratio)
	}
	return nil
}

// openSessions runs one warm turn in each of sessions from+1…to, a few at a
// time, and returns once every turn ended.
func openSessions(ctx context.Context, client executorv1.ExecutorServiceClient, from, to int) error {
	const parallel = 4
	next := make(chan int)
	errs := make(chan error, parallel)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for i := range next {
				if err := oneTurn(ctx, client, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() {
		defer close(next)
		for i := from + 1; i <= to; i++ {
			select {
			case next <- i:
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func oneTurn(ctx context.Context, client executorv1.ExecutorServiceClient, i int) error {
	return oneTurnIn(ctx, client, fmt.Sprintf("idle-%d", i), fmt.Sprintf("idle-%d", i))
}

// oneTurnIn runs one warm turn as run id in session and waits for its
// run.terminal, which must be succeeded.
func oneTurnIn(ctx context.Context, client executorv1.ExecutorServiceClient, id, session string) error {
	return runTurn(ctx, client, id, cli.InputSpec{Prompt: "hello", Company: "bench", Agent: "bench", Session: session,
		Lifecycle: "warm", IdleTimeoutSeconds: 3600}, nil)
}

// runTurn submits spec as run id and waits for its run.terminal, which must
// be succeeded; started, when set, gets SubmitRun → turn.started.
func runTurn(ctx context.Context, client executorv1.ExecutorServiceClient, id string, spec cli.InputSpec, started *time.Duration) error {
	in, err := spec.Input()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in}); err != nil {
		return err
	}
	stream, err := client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id})
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("run %s: the watch ended without run.terminal", id)
		}
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		switch m.GetEvent().GetEventType() {
		case prp.EventTurnStarted:
			if started != nil {
				*started = time.Since(t0)
			}
		case "run.terminal":
			if s := m.GetEvent().GetPayload().AsMap()["runTerminalState"]; s != "succeeded" {
				return fmt.Errorf("run %s ended %v", id, s)
			}
			return nil
		}
	}
}

// treeMemory sums RSS and PSS (KiB) of every descendant of root.
func treeMemory(root int) (procs int, rss, pss int64, err error) {
	tree := procTree()
	queue := append([]int(nil), tree.children[root]...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = append(queue[1:], tree.children[pid]...)
		r, p, err := rollup(pid)
		if err != nil {
			continue // exited meanwhile
		}
		procs++
		rss += r
		pss += p
	}
	return procs, rss, pss, nil
}

// rollup reads Rss and Pss (KiB) from /proc/pid/smaps_rollup.
func rollup(pid int) (rss, pss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss, sc.Err()
}
