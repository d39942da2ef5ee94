package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// previousRelease is the commit tagged v0.1.0, the release before main
// (the tag is local to the repository it was made in: a fresh clone has the
// commit, not the tag).
const previousRelease = "dd9bcc3"

// previousExecutor builds the executor of previousRelease from its tree
// (git archive) into <checkout>/.cache/upgrade/<commit>/ once, and returns
// the binary.
func previousExecutor(t *testing.T) string {
	t.Helper()
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		require.NoError(t, err, "git %v", args)
		return strings.TrimSpace(string(out))
	}
	root := git("rev-parse", "--show-toplevel")
	commit := git("-C", root, "rev-parse", previousRelease+"^{commit}")
	dir := filepath.Join(root, ".cache", "upgrade", commit)
	bin := filepath.Join(dir, "bin", "executor")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	src := filepath.Join(dir, "src")
	require.NoError(t, os.RemoveAll(src))
	require.NoError(t, os.MkdirAll(src, 0o755))
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "%s", out)
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/tether-run/tether/pkg/buildinfo.version=v0.1.0",
		"-o", filepath.Join(dir, "bin")+"/", "./services/executor/cmd/executor")
	build.Dir = src
	out, err = build.CombinedOutput()
	require.NoError(t, err, "building the executor of %s: %s", commit, out)
	require.NoError(t, os.RemoveAll(src))
	return bin
}

// TestL3_ExecutorsOfThePreviousReleaseAndOfMainShareTheDatabaseDuringARollingUpgrade
// (opt-in: make test-upgrade): two executors of the previous release
// (v0.1.0) drive warm runs of six sessions on a database migrated by main;
// while runs keep being submitted and are in flight, each executor in turn
// is stopped (SIGTERM: its leases are handed back) and started again as
// main's, so that for a while one of each version runs. Every run ends
// succeeded, exactly once, each session's turns in order, and the audit is
// clean.
func TestL3_ExecutorsOfThePreviousReleaseAndOfMainShareTheDatabaseDuringARollingUpgrade(t *testing.T) {
	if os.Getenv("TETHER_UPGRADE") == "" {
		t.Skip("opt-in: make test-upgrade (TETHER_UPGRADE=1) builds the previous release and rolls executors over to main")
	}
	old := previousExecutor(t)
	h := newHarnessWith(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "15"}}, "backup-verifier", "runnergw")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	require.NoError(t, h.st.AddExecutor("executor-2"))
	for _, e := range []string{"executor", "executor-2"} {
		h.st.SetBinary(e, old)
		h.st.SetExtraArgs(e, "-owner-id", e+"@v0.1.0") // the lease owner names the version
		_, err := h.st.Start(ctx, e)
		require.NoError(t, err)
	}
	// Which versions hold leases, sampled: both at once must be seen.
	var (
		seenMu sync.Mutex
		seen   = map[string]bool{}
		mixed  bool
	)
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			rows, err := h.store().Pool().Query(sctx, `SELECT DISTINCT lease_owner FROM executor.coordinators WHERE phase = 'observed'`)
			if err == nil {
				old, cur := false, false
				for rows.Next() {
					var o string
					if rows.Scan(&o) == nil {
						seenMu.Lock()
						seen[o] = true
						seenMu.Unlock()
						old, cur = old || strings.HasSuffix(o, "@v0.1.0"), cur || !strings.HasSuffix(o, "@v0.1.0")
					}
				}
				rows.Close()
				if old && cur {
					seenMu.Lock()
					mixed = true
					seenMu.Unlock()
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	clients := []executorv1.ExecutorServiceClient{h.clientFor("executor"), h.clientFor("executor-2")}

	// The submitter: a run every 150 ms, round robin over six sessions,
	// through whichever executor answers, at least minRuns and on until
	// the roll is over.
	const sessions, minRuns, maxRuns = 6, 48, 600
	var (
		mu        sync.Mutex
		submitted []string
	)
	done, rolled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < maxRuns; i++ {
			if i >= minRuns {
				select {
				case <-rolled:
					return
				default:
				}
			}
			id := fmt.Sprintf("up-%02d", i)
			in := h.submitInput(fmt.Sprintf("up-s%d", i%sessions), slowTurn)
			for try := 0; ; try++ {
				_, err := clients[(i+try)%2].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in})
				if err == nil {
					break
				}
				if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
					t.Errorf("submitting %s: %v", id, err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			submitted = append(submitted, id)
			mu.Unlock()
			time.Sleep(150 * time.Millisecond)
		}
	}()
	// holding also records what it saw: a lease held for less than the
	// sampler's 20 ms can be seen here and missed there.
	holding := func(owner string) int {
		n := h.count(`SELECT count(*) FROM executor.coordinators WHERE phase = 'observed' AND lease_owner = $1`, owner)
		if n > 0 {
			seenMu.Lock()
			seen[owner] = true
			seenMu.Unlock()
		}
		return n
	}
	seenNow := func(cond func() bool) func() bool {
		return func() bool {
			seenMu.Lock()
			defer seenMu.Unlock()
			return cond()
		}
	}
	// Roll: executor-2 first, then executor, each while it drives runs;
	// between the two, both versions drive runs at once.
	for _, e := range []string{"executor-2", "executor"} {
		require.Eventually(t, func() bool { return holding(e+"@v0.1.0") > 0 }, time.Minute, 10*time.Millisecond, "%s drives runs before it is upgraded", e)
		h.st.Proc(e).Stop(15 * time.Second)
		h.st.SetBinary(e, "")
		h.st.SetExtraArgs(e)
		_, err := h.st.Start(ctx, e)
		require.NoError(t, err, "starting main's %s", e)
		require.Eventually(t, seenNow(func() bool { return seen[e] }), time.Minute, 10*time.Millisecond, "main's %s drives runs", e)
		if e == "executor-2" {
			require.Eventually(t, seenNow(func() bool { return mixed }), time.Minute, 10*time.Millisecond, "runs driven by both versions at once")
			// SPEC L2: partitioning the events table waits for the
			// previous release (its inserts name no run_created_at).
			out, err := exec.Command(filepath.Join(binDir, "executor"), "migrate", "-partition-events", "-database-url", h.dsn).CombinedOutput()
			require.Error(t, err, "%s", out)
			require.Contains(t, string(out), "executor@v0.1.0", "the refusal names the older executor")
		}
	}
	// Every executor runs main: partition while runs are in flight; the
	// submitter goes on for a few more runs on the partitioned table.
	// (An older executor's heartbeat and leases count for a minute after
	// it stopped: the step is retried as an operator would.)
	var out []byte
	require.Eventually(t, func() bool {
		var err error
		out, err = exec.Command(filepath.Join(binDir, "executor"), "migrate", "-partition-events", "-database-url", h.dsn).CombinedOutput()
		return err == nil
	}, 3*time.Minute, 2*time.Second, "executor migrate -partition-events once the previous release is gone")
	require.Contains(t, string(out), "executor.events is partitioned")
	mu.Lock()
	partitionedAt := len(submitted)
	mu.Unlock()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(submitted) >= partitionedAt+6
	}, time.Minute, 50*time.Millisecond, "runs submitted after the partitioning")
	close(rolled)
	<-done
	mu.Lock()
	ids := append([]string(nil), submitted...)
	mu.Unlock()
	total := len(ids)
	require.GreaterOrEqual(t, total, minRuns)
	for _, id := range ids {
		run := h.waitState(ctx, clients[0], id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		require.Contains(t, run.GetResult().GetFinalMessage(), "ECHO:", id)
	}
	// Each session's turns in order: turn n of a session saw 2(n-1)
	// earlier messages.
	for s := range sessions {
		n := 0
		for i := s; i < total; i += sessions {
			run, err := clients[0].GetRun(ctx, &executorv1.GetRunRequest{RunId: fmt.Sprintf("up-%02d", i)})
			require.NoError(t, err)
			require.Contains(t, run.GetRun().GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*n), "run up-%02d", i)
			n++
		}
	}
	stopSampling()
	<-sampled
	seenMu.Lock()
	defer seenMu.Unlock()
	require.True(t, seen["executor@v0.1.0"] && seen["executor-2@v0.1.0"] && seen["executor"] && seen["executor-2"],
		"each executor drove runs as v0.1.0 and as main: %v", seen)
	require.True(t, mixed, "runs were driven by both versions at once")
	require.Equal(t, "p", func() string {
		var kind string
		require.NoError(t, h.store().Pool().QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'executor.events'::regclass`).Scan(&kind))
		return kind
	}(), "executor.events is partitioned")
	h.requireAuditClean()
}
