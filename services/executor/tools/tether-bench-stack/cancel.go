package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// cancelLatency is SPEC P2: CancelRun of a live turn until the provider's
// interrupt is acknowledged (the response's dispatch_state), over n runs of
// one warm session. Each run's turn is live (its first delta was persisted
// and watched) when it is cancelled; the next run starts after the cancelled
// one ended.
func cancelLatency(ctx context.Context, client executorv1.ExecutorServiceClient, warm, n int, traceDir string) error {
	var lat []time.Duration
	var windows []turnWindow
	for i := range warm + n {
		id := fmt.Sprintf("cancel-%d", i)
		in, err := cli.InputSpec{Prompt: fmt.Sprintf("[slow] cancel me %d", i), Company: "bench", Agent: "bench",
			Session: "cancel-bench", Lifecycle: "warm"}.Input()
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
		live := false
		for !live {
			m, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("run %s: no live turn: %w", id, err)
			}
			live = m.GetEvent().GetEventType() == "item.delta"
		}
		t0 := time.Now()
		res, err := client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: id,
			Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "bench", RequestId: id})
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("cancel %s: %w", id, err)
		}
		if c := res.GetCancellation(); !res.GetActive() || c.GetDispatchState() != "acknowledged" || !c.GetDispatched() {
			return fmt.Errorf("cancel %s: not acknowledged by the provider (active %t, %s, dispatched %t)",
				id, res.GetActive(), c.GetDispatchState(), c.GetDispatched())
		}
		if i >= warm {
			lat = append(lat, d)
			windows = append(windows, turnWindow{t0: t0, started: t0.Add(d), end: t0.Add(d)})
		}
		for {
			_, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("run %s after cancel: %w", id, err)
			}
		}
	}
	p50, p99 := pct(lat, 50), pct(lat, 99)
	ok := p99 <= 20*time.Millisecond
	fmt.Printf("\n%-40s %10s %10s %10s %s\n", "figure", "p50", "p99", "target", "met")
	fmt.Printf("%-40s %10s %10s %10s %s\n", fmt.Sprintf("cancel → interrupt acknowledged (%d)", len(lat)), p50, p99, "p99≤20ms", markOf(ok))
	fmt.Printf("BENCH cancel_latency cancels=%d p50_ms=%.3f p99_ms=%.3f target_ms=20 met=%t\n", len(lat), ms(p50), ms(p99), ok)
	return reportCancelWrites(traceDir, windows, anchors{})
}

func markOf(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}
