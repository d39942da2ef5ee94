package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

// TestMain serves the raw unary baseline when the bench re-executes this
// binary as it (startRaw), as the real binary's main does.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(rawServerEnv); dsn != "" {
		if err := serveRaw(dsn); err != nil {
			fmt.Fprintln(os.Stderr, "raw unary server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Every figure of `make bench` runs end to end on the current schema, in
// miniature: the bench is not part of CI, and a migration that changed a
// table the raw baselines copy (00025's NOT NULL client_run_id) broke
// `make bench` unnoticed. Figures are not judged here (no timed
// assertions); that they run, against their baselines, is.
func TestP1_EveryBenchFigureRunsOnTheCurrentSchema(t *testing.T) {
	exe, err := testbin.Path("github.com/tether-run/tether/services/executor/cmd/executor")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, config{
		claims: 40, claimWarmup: 10, workers: 2, leases: 20, batch: 8, payload: 64,
		duration: 200 * time.Millisecond, warmup: 50 * time.Millisecond, slices: 2,
		figures:      "lease_claim,lease_renewal,event_persistence,unary_getrun,unary_submit",
		unaryCallers: 2, executor: exe,
	}))
}

// TestP1_TheUnaryFiguresMeasureNoRunTheExecutorClaimed: the unary
// figures' sessions are headed by runs the bench holds, so the executor
// under measurement claims none of their runs (it claimed the first run of
// each unary_submit caller's session and the GetRun figure's run, and
// retried them against the absent gateway for the whole figure).
func TestP1_TheUnaryFiguresMeasureNoRunTheExecutorClaimed(t *testing.T) {
	exe, err := testbin.Path("github.com/tether-run/tether/services/executor/cmd/executor")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	claimed := 0
	require.NoError(t, run(ctx, config{
		duration: 300 * time.Millisecond, warmup: 50 * time.Millisecond, slices: 2,
		figures: "unary_getrun,unary_submit", unaryCallers: 3, executor: exe, unaryClaimed: &claimed,
	}))
	require.Zero(t, claimed, "runs of the unary figures the executor claimed")
}

// TestL2_TheAppendCurveRunsOnThePartitionedTableWithAPurgeBeside: the
// append curve of `make bench` (partitioning the events table, seeding
// prior and expired runs with their partition key, measuring without and
// with a purge running) runs end to end on the current schema, in
// miniature, on both layouts.
func TestL2_TheAppendCurveRunsOnThePartitionedTableWithAPurgeBeside(t *testing.T) {
	for _, unpartitioned := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		require.NoError(t, run(ctx, config{
			batch: 8, payload: 64, duration: 400 * time.Millisecond, warmup: 50 * time.Millisecond, slices: 2,
			curves: true, curveSet: map[string]bool{"event_append": true}, appendRows: []int{0, 20000},
			appendTable: unpartitioned, appendExpiredRuns: 12,
		}), "unpartitioned=%t", unpartitioned)
		cancel()
	}
}
