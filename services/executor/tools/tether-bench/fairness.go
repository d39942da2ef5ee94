package main

// -curves fair_share (SPEC Q3), simulated: company B's submit → claim of
// its run by an in-process driver (store.ClaimNext; no executor process, no
// runner: the claim in isolation; tether-bench-stack -fairness measures
// submit → turn.started through the whole stack) while company A has 0,
// 1,000, 10,000 and 100,000 runs queued, each heading its own session (every one of them due, the worst case for B: before Q3 the
// claim was FIFO over due heads, and B's run waited behind all of A's).
//
// A fleet of -fair-slots drivers claims with store.ClaimNext, holds each
// run for -fair-turn (the turn), then ends it (its coordinator completed,
// the bench's own statement); a driver that ended one of A's runs submits a
// new one (store.Submit), so A's backlog stays at its size throughout.
// Company B submits one run every -fair-interval in a session of its own
// and the latency is from just before its Submit to the driver's claim of
// it: the start of the run (its turn.started follows at a cost that does
// not depend on A's backlog). Drivers with nothing to claim wait for B's
// submission's kick, as the executor's claim loop waits for its own.
//
// The baseline is the same measurement with A's backlog empty (B alone);
// the target is B's p99 at the largest backlog within 2× of it. With A's
// backlog the slots are all busy, so B also waits for one to free (on
// average turn / slots / 2): that wait, not A's backlog, is the floor.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// seedFairSQL queues runs prefix<from>…prefix<to> of company prefix, each
// in a session scope of its own (so each heads its scope and is due).
const seedFairSQL = `
WITH r AS (
  INSERT INTO executor.runs (run_id, company_id, normalized_session_id, session_scope, lifecycle, input, input_digest)
  SELECT $1 || g, $1, $1 || g, $1 || '-scope-' || g, 'LIFECYCLE_MODE_WARM', $4, 'bench'
    FROM generate_series($2::int, $3::int) g
  RETURNING run_id, session_scope, submit_seq)
INSERT INTO executor.coordinators (run_id, binding_digest, session_scope, submit_seq, company_id)
SELECT run_id, '', session_scope, submit_seq, $1 FROM r ORDER BY submit_seq`

// endFairSQL ends a run the fair-share drivers hold (its scope's next run,
// none here, would become the head).
const endFairSQL = `UPDATE executor.coordinators SET phase = 'completed', lease_owner = NULL WHERE run_id = $1 AND lease_owner = $2`

const (
	fairA, fairB = "fair-a", "fair-b"
)

func fairInput(company, session string) *prpv1.ExecutionInput {
	in := benchInput(session)
	in.Binding.CompanyId = company
	return in
}

// seedFair queues A's runs from..to, 1,000 a statement (each new head takes
// its scope's advisory lock).
func (b *bench) seedFair(ctx context.Context, from, to int) error {
	raw, err := proto.Marshal(fairInput(fairA, "seeded"))
	if err != nil {
		return err
	}
	for lo := from; lo <= to; lo += 1000 {
		if _, err := b.raw.Exec(ctx, seedFairSQL, fairA, lo, min(lo+999, to), raw); err != nil {
			return err
		}
	}
	return nil
}

// fairnessCurve measures B's submit → start at each size of A's backlog.
func (b *bench) fairnessCurve(ctx context.Context) ([]curve, error) {
	p50 := curve{name: "fair_share_b_start_p50", unit: "ms", x: "a_queued"}
	p99 := curve{name: "fair_share_b_start_p99", unit: "ms", x: "a_queued", target: 2}
	seeded := 0
	fleet := &fairFleet{b: b, slots: b.cfg.fairSlots, turn: b.cfg.fairTurn}
	for _, n := range append([]int{0}, b.cfg.backlogs...) {
		if n > seeded {
			if err := b.seedFair(ctx, seeded+1, n); err != nil {
				return nil, err
			}
			seeded = n
		}
		b.settle(ctx)
		lat, err := fleet.round(ctx, n > 0, b.cfg.fairSamples, b.cfg.fairInterval)
		if err != nil {
			return nil, err
		}
		logf("fair_share (simulated drivers, submit → claim): A has %d runs queued: B's submit → claim p50 %.3f ms, p99 %.3f ms (%d runs of B; %d slots, %s turns)",
			n, ms(percentile(lat, 50)), ms(percentile(lat, 99)), len(lat), fleet.slots, fleet.turn)
		p50.xs, p50.values = append(p50.xs, n), append(p50.values, ms(percentile(lat, 50)))
		p99.xs, p99.values = append(p99.xs, n), append(p99.values, ms(percentile(lat, 99)))
	}
	b.absolute = append(b.absolute, fmt.Sprintf("fair_share (simulated drivers, submit → claim) raw baseline (A's backlog empty, B alone): p50 %.3f ms, p99 %.3f ms; "+
		"the floor with every slot busy: one slot frees every %.3f ms", p50.values[0], p99.values[0], ms(fleet.turn)/float64(fleet.slots)))
	return []curve{p50, p99}, nil
}

// fairFleet is the drivers of the fair-share curve.
type fairFleet struct {
	b     *bench
	slots int
	turn  time.Duration
	next  int // A's runs submitted by top-ups
	mu    sync.Mutex
}

// round runs the drivers while B submits samples runs; topUp keeps A's
// backlog at its size.
func (f *fairFleet) round(ctx context.Context, topUp bool, samples int, interval time.Duration) ([]time.Duration, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu        sync.Mutex
		submitted = map[string]time.Time{}
		lat       []time.Duration
		done      = make(chan struct{})
		kick      = make(chan struct{}, f.slots)
		wg        sync.WaitGroup
		errs      = make(chan error, f.slots+1)
	)
	started := func(runID string) {
		mu.Lock()
		defer mu.Unlock()
		if t0, ok := submitted[runID]; ok {
			lat = append(lat, time.Since(t0))
			if len(lat) == samples {
				close(done)
			}
		}
	}
	for i := range f.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- f.drive(rctx, fmt.Sprintf("fair-driver-%d", i), kick, started, topUp)
		}()
	}
	go func() {
		for i := 0; ; i++ {
			select {
			case <-rctx.Done():
				return
			case <-done:
				return
			case <-time.After(interval):
			}
			id := fmt.Sprintf("%s-%d-%d", fairB, time.Now().UnixNano(), i)
			mu.Lock()
			submitted[id] = time.Now()
			mu.Unlock()
			if _, err := f.b.st.Submit(rctx, id, fairInput(fairB, id)); err != nil {
				errs <- err
				return
			}
			for range f.slots {
				select {
				case kick <- struct{}{}:
				default:
				}
			}
		}
	}()
	var err error
	select {
	case <-done:
	case err = <-errs:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	wg.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]time.Duration(nil), lat...), nil
}

// drive claims, holds each run for a turn and ends it, until ctx ends (the
// run in hand is ended first).
func (f *fairFleet) drive(ctx context.Context, owner string, kick <-chan struct{}, started func(string), topUp bool) error {
	for ctx.Err() == nil {
		c, err := f.b.claim(ctx, owner, leaseTTL)
		if err != nil {
			return err
		}
		if c == nil {
			select {
			case <-ctx.Done():
			case <-kick:
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		started(c.RunID)
		time.Sleep(f.turn) // the turn
		if err := f.end(context.WithoutCancel(ctx), c, topUp); err != nil {
			return err
		}
	}
	return nil
}

// end ends a claimed run and, for one of A's runs, queues A's next.
func (f *fairFleet) end(ctx context.Context, c *store.Claim, topUp bool) error {
	if _, err := f.b.raw.Exec(ctx, endFairSQL, c.RunID, c.Owner); err != nil {
		return err
	}
	if !topUp || c.Input.GetBinding().GetCompanyId() != fairA {
		return nil
	}
	f.mu.Lock()
	f.next++
	id := fmt.Sprintf("%s-more-%d", fairA, f.next)
	f.mu.Unlock()
	_, err := f.b.st.Submit(ctx, id, fairInput(fairA, id))
	return err
}
