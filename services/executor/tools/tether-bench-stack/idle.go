package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// turnsAfterIdle measures SPEC P6: n turns of the warm session "bench",
// each after an idle period of 2 × checkpointAfter (the executor's
// -checkpoint-after, backup verifier on) during which the session was
// checkpointed (verified, recorded), next to the warm turn's p50. Each
// idle period must yield a new checkpoint, and every turn must run on the
// warm turn's runnerd and provider processes, or the figure is refused.
func turnsAfterIdle(ctx context.Context, client executorv1.ExecutorServiceClient, n int, checkpointAfter, warmP50 time.Duration, traceDir string, raw anchors, checkpoints bool) error {
	var took []time.Duration
	var windows []turnWindow
	var runner, provider int32
	prev := ""
	for i := range n {
		idleSince := time.Now()
		deadline := idleSince.Add(2*checkpointAfter + 30*time.Second)
		for checkpoints {
			s, err := client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "bench", NormalizedSessionId: "bench"})
			if err != nil {
				return err
			}
			if cp := s.GetSessions()[0].GetCheckpoint(); cp != nil && cp.GetCheckpointId() != prev {
				prev = cp.GetCheckpointId()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("idle turn %d: no checkpoint within %s of idling", i, 2*checkpointAfter+30*time.Second)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Until(idleSince.Add(2 * checkpointAfter)))
		id := fmt.Sprintf("bench-idle-%d", i)
		in, err := cli.InputSpec{Prompt: id, Company: "bench", Agent: "bench", Session: "bench", Lifecycle: "warm"}.Input()
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
		var end, started time.Duration
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if m.GetEvent().GetEventType() == prp.EventTurnStarted {
				started = time.Since(t0)
			}
			if m.GetEvent().GetEventType() == "run.terminal" {
				end = time.Since(t0)
				if s := m.GetEvent().GetPayload().AsMap()["runTerminalState"]; s != "succeeded" {
					return fmt.Errorf("run %s ended %v", id, s)
				}
			}
		}
		took = append(took, end)
		windows = append(windows, turnWindow{t0: t0, started: t0.Add(started), end: t0.Add(end)})
		r, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: id})
		if err != nil {
			return err
		}
		rp, pp := r.GetRun().GetRunnerProcess().GetPid(), r.GetRun().GetProviderProcess().GetPid()
		if i == 0 {
			runner, provider = rp, pp
		} else if rp != runner || pp != provider {
			return fmt.Errorf("idle turn %d ran on runnerd %d provider %d, not %d/%d: the session did not stay warm", i, rp, pp, runner, provider)
		}
	}
	if recs, err := synctrace.Read(traceDir); err == nil && len(recs) > 0 {
		fmt.Printf("\nturns after idle (backups on):")
		printMedianSteps(recs, windows, raw, "turns", "SubmitRun")
	}
	p50 := pct(took, 50)
	ratio := float64(p50) / float64(warmP50)
	if !checkpoints {
		fmt.Printf("turn after idle, no checkpoints (control): p50 %s p99 %s, warm %s: %.2fx\n", p50, pct(took, 99), warmP50, ratio)
		fmt.Printf("BENCH warm_turn_after_idle_control p50_ms=%.3f warm_p50_ms=%.3f ratio=%.3f turns=%d\n", ms(p50), ms(warmP50), ratio, n)
		return nil
	}
	fmt.Printf("%-28s %12s %12s %12s %9.2fx %6s %s\n", "turn after idle, backups on", p50, pct(took, 99), "warm "+warmP50.Round(time.Microsecond).String(), ratio, "≤1.2x", markOf(ratio <= 1.2))
	fmt.Printf("BENCH warm_turn_after_idle_with_backups p50_ms=%.3f max_ms=%.3f warm_p50_ms=%.3f ratio=%.3f turns=%d idle_ms=%d checkpoints=%d same_processes=true target=1.20 met=%t\n",
		ms(p50), ms(pct(took, 100)), ms(warmP50), ratio, n, (2 * checkpointAfter).Milliseconds(), n, ratio <= 1.2)
	return nil
}
