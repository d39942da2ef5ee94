// Command warm-turn-bench measures the latency of a warm turn driven
// directly against the fake codex app-server through the codex driver
// (turn/start sent → turn/completed delivered), on one provider process and
// one thread, and prints the "direct" baseline line
//
//	BENCH warm_turn_direct turns=200 p50=… p90=… p99=… max=… mean=…
//
// The fake runs with the flags the stack gives it (--state-file-in-codex-home
// --durable-turn-ids --record-process-start --call-log) plus
// --delta-delay-ms 0, so a through-the-stack number can be put next to it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/codex"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "warm-turn-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	fake := flag.String("fake", "bin/fake-codex-app-server", "fake-codex-app-server binary")
	turns := flag.Int("turns", 200, "measured warm turns")
	warm := flag.Int("warmup", 10, "unmeasured turns first")
	flag.Parse()
	if *turns < 1 || *warm < 0 {
		return errors.New("-turns must be >= 1 and -warmup >= 0")
	}
	bin, err := filepath.Abs(*fake)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "warm-turn-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	codexHome := filepath.Join(dir, "codex-home")
	ws := filepath.Join(dir, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	s, err := codex.Start(ctx, codex.Config{
		Command: bin,
		Args: []string{"app-server", "--state-file-in-codex-home", "--durable-turn-ids", "--record-process-start",
			"--call-log", filepath.Join(dir, "calls.log"), "--delta-delay-ms", "0"},
		Env:            []string{"CODEX_HOME=" + codexHome, "HOME=" + dir},
		Dir:            ws,
		CodexHome:      codexHome,
		Model:          "mock-model",
		ApprovalPolicy: "never",
		Sandbox:        "read-only",
	}, func(codex.Event) {})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = s.Close(cctx, 2*time.Second)
	}()
	if _, _, err := s.OpenThread(ctx, ""); err != nil {
		return err
	}
	lat, err := turnLatencies(ctx, s, *warm, *turns)
	if err != nil {
		return err
	}
	printLatencies(lat)
	return nil
}

// turnLatencies drives warm+turns turns on the session's thread and
// returns the measured ones' times from turn/start to turn/completed.
func turnLatencies(ctx context.Context, s *codex.Session, warm, turns int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, turns)
	for i := 0; i < warm+turns; i++ {
		t0 := time.Now()
		id, err := s.StartTurn(ctx, fmt.Sprintf("warm turn %d", i+1))
		if err != nil {
			return nil, err
		}
		select {
		case r := <-s.TurnDone():
			if r.TurnID != id || r.Status != codex.TurnCompleted {
				return nil, fmt.Errorf("turn %s ended %s (%s)", r.TurnID, r.Status, r.ErrorMessage)
			}
		case <-s.Exited():
			return nil, s.ExitErr()
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("turn %s did not complete", id)
		}
		if i >= warm {
			lat = append(lat, time.Since(t0))
		}
	}
	return lat, nil
}

// printLatencies prints the BENCH line of the sorted latencies.
func printLatencies(lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		i := int(float64(len(lat))*p+0.999999) - 1
		return lat[max(0, min(i, len(lat)-1))]
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }
	fmt.Printf("BENCH warm_turn_direct turns=%d p50=%s p90=%s p99=%s max=%s mean=%s (driver → fake-codex-app-server, turn/start → turn/completed, one process, one thread)\n",
		len(lat), ms(pct(0.50)), ms(pct(0.90)), ms(pct(0.99)), ms(lat[len(lat)-1]), ms(sum/time.Duration(len(lat))))
}
