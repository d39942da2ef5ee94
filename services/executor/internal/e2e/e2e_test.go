// Package e2e runs the real processes — executor, runnergw, backup-verifier,
// runnerd and fake-codex-app-server — against a private PostgreSQL on
// loopback, and checks the walking skeleton's end-to-end promises.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

var binDir string

func TestMain(m *testing.M) {
	binDir = testbin.MustDir(
		"github.com/tether-run/tether/services/executor/cmd/executor",
		"github.com/tether-run/tether/services/executor/cmd/tetherctl",
		"github.com/tether-run/tether/services/runnergw/cmd/runnergw",
		"github.com/tether-run/tether/services/backup/cmd/backup-verifier",
		"github.com/tether-run/tether/services/runnerd/cmd/runnerd",
		"github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server",
		"github.com/tether-run/tether/services/runnerd/tools/fake-acp-agent",
		"github.com/tether-run/tether/services/runnerd/tools/fake-opencode",
		"github.com/tether-run/tether/services/runnerd/tools/mock-model",
	)
	code := pgtest.Run(m)
	testbin.Cleanup()
	os.Exit(code)
}

// stackSchema is the schema of a stack's database: the executor's and the
// backup verifier's migrations, applied once per test process to the
// template every test's database is cloned from, so that each test's
// services start without migrating.
var stackSchema = pgtest.Migrators(
	pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName(store.GooseTable)),
	pgtest.GooseMigrator(os.DirFS("../../../backup/internal/store"), "migrations", goose.WithTableName("backup_goose_version")),
)

type harness struct {
	t      *testing.T
	st     *stack.Stack
	client executorv1.ExecutorServiceClient
	dsn    string

	dbMu sync.Mutex
	db   *store.Store // see store
}

func newHarness(t *testing.T, opts stack.Options) *harness {
	return newHarnessWith(t, opts, "backup-verifier", "runnergw", "executor")
}

// newHarnessWith starts the named processes (in order) of a stack.
func newHarnessWith(t *testing.T, opts stack.Options, procs ...string) *harness {
	return newHarnessKeeping(t, opts, false, procs...)
}

// newHarnessKeeping is newHarnessWith; with keep, a failed test leaves its
// processes running and its directory in place for inspection.
func newHarnessKeeping(t *testing.T, opts stack.Options, keep bool, procs ...string) *harness {
	t.Helper()
	opts.BinDir = binDir
	opts.Dir = t.TempDir()
	if keep {
		dir, err := os.MkdirTemp("", "tether-"+strings.ReplaceAll(t.Name(), "/", "_")+"-")
		require.NoError(t, err)
		opts.Dir = dir
	}
	opts.DatabaseURL = pgtest.NewDB(t, stackSchema)
	opts.Migrated = true // stackSchema
	st, err := stack.New(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if keep && t.Failed() {
			t.Logf("KEEP=1: the failed case's processes still run and its files are in %s", opts.Dir)
			return
		}
		// Killed, not stopped: nothing is checked after a test, and a
		// graceful stop waits for each runnerd's outbox drain (2 s).
		st.Kill()
		if t.Failed() {
			dumpLogs(t, opts.Dir)
		}
		if keep {
			os.RemoveAll(opts.Dir)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range procs {
		_, err := st.Start(ctx, p)
		require.NoError(t, err)
	}
	h := &harness{t: t, st: st, dsn: opts.DatabaseURL}
	if st.Proc("executor") != nil {
		h.client = h.clientFor("executor")
	}
	return h
}

func (h *harness) clientFor(name string) executorv1.ExecutorServiceClient {
	conn, err := h.st.DialAs(h.st.Addr(name), stack.Operator)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return executorv1.NewExecutorServiceClient(conn)
}

func dumpLogs(t *testing.T, dir string) {
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".log") {
			b, _ := os.ReadFile(p)
			b = dropPolls(b)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("==== %s\n%s", p, b)
		}
		return nil
	})
}

// dropPolls leaves out the access log lines of the tests' GetRun polls,
// which otherwise fill the tail of an executor's log that dumpLogs shows.
func dropPolls(b []byte) []byte {
	var out []byte
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i+1], b[i+1:]
		} else {
			b = nil
		}
		if bytes.Contains(line, []byte(`"msg":"finished call"`)) && bytes.Contains(line, []byte(`"grpc.method":"GetRun"`)) &&
			bytes.Contains(line, []byte(`"grpc.code":"OK"`)) {
			continue
		}
		out = append(out, line...)
	}
	return out
}

func (h *harness) submitInput(session, prompt string) *prpv1.ExecutionInput {
	h.t.Helper()
	in, err := cli.InputSpec{Prompt: prompt, Company: "acme", Agent: "agent-1", Issue: "ISS-1", Session: session, Lifecycle: "warm"}.Input()
	require.NoError(h.t, err)
	return in
}

func (h *harness) submit(runID, session, prompt string) *executorv1.Run {
	h.t.Helper()
	in := h.submitInput(session, prompt)
	resp, err := h.client.SubmitRun(context.Background(), &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(h.t, err)
	return resp.GetRun()
}

// watch collects a run's events until the stream ends.
func (h *harness) watch(ctx context.Context, runID string, after uint64, each func(*executorv1.WatchRunResponse)) []*executorv1.WatchRunResponse {
	h.t.Helper()
	stream, err := h.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: runID, AfterSeq: after})
	require.NoError(h.t, err)
	var out []*executorv1.WatchRunResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(h.t, err)
		out = append(out, m)
		if each != nil {
			each(m)
		}
	}
}

func (h *harness) get(runID string) *executorv1.Run {
	h.t.Helper()
	resp, err := h.client.GetRun(context.Background(), &executorv1.GetRunRequest{RunId: runID})
	require.NoError(h.t, err)
	return resp.GetRun()
}

func countLines(t *testing.T, path, want string) int {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == want {
			n++
		}
	}
	return n
}

// requireContiguous checks that the run's events have run-local seqs 1..n
// and that each runner instance's source seqs are strictly increasing by one
// (no gap, no duplicate).
func requireContiguous(t *testing.T, evs []*executorv1.WatchRunResponse) {
	t.Helper()
	last := map[string]uint64{}
	for i, m := range evs {
		require.EqualValues(t, i+1, m.GetSeq(), "run-local seq")
		inst := m.GetEvent().GetSourceInstanceId()
		if m.GetEvent().GetSourceKind() == "control_plane" {
			continue
		}
		if prev, ok := last[inst]; ok {
			require.Equal(t, prev+1, m.GetEvent().GetSourceSeq(), "source seq after %d (event %d, %s)", prev, i+1, m.GetEvent().GetEventType())
		}
		last[inst] = m.GetEvent().GetSourceSeq()
	}
}

func TestWarmSessionThreeTurnsReuseOneRunnerAndOneProvider(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Submitted together: the executor runs them in order, one at a time.
	for i := 1; i <= 3; i++ {
		h.submit(fmt.Sprintf("warm-%d", i), "warm-session", fmt.Sprintf("turn number %d", i))
	}
	runners, providers := map[int32]bool{}, map[int32]bool{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("warm-%d", i)
		evs := h.watch(ctx, id, 0, nil)
		requireContiguous(t, evs)
		require.Equal(t, "run.terminal", evs[len(evs)-1].GetEvent().GetEventType())
		run := h.get(id)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
		require.EqualValues(t, len(evs), run.GetEventCount())
		// The provider's history grows: turn i sees 2*(i-1) earlier messages.
		require.Contains(t, run.GetResult().GetFinalMessage(), fmt.Sprintf("%d earlier messages", 2*(i-1)))
		runners[run.GetRunnerProcess().GetPid()] = true
		// E12: every run of the warm session records the provider serving
		// it, also those whose runner started it before they attached.
		require.Positive(t, run.GetProviderProcess().GetPid(), "run %s records its provider process", id)
		providers[run.GetProviderProcess().GetPid()] = true
	}
	require.Len(t, runners, 1, "one runnerd process serves the warm session")
	require.Len(t, providers, 1, "one provider process serves the warm session")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "one provider process")
	require.Equal(t, 3, countLines(t, h.st.CallLog(), "turn/start"))
}

func TestWatchRunReplayFromZeroEqualsTheLiveSequence(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h.submit("replay-1", "replay", "stream me")
	live := h.watch(ctx, "replay-1", 0, nil)
	require.NotEmpty(t, live)
	replayed := h.watch(ctx, "replay-1", 0, nil)
	require.Len(t, replayed, len(live))
	for i := range live {
		require.True(t, proto.Equal(live[i], replayed[i]), "event %d differs", i+1)
	}
	// From the middle, the tail is the same too.
	mid := uint64(len(live) / 2)
	tail := h.watch(ctx, "replay-1", mid, nil)
	require.Len(t, tail, len(live)-int(mid))
	require.True(t, proto.Equal(live[mid], tail[0]))
}

func TestSubmitRunTwiceWithTheSameInputYieldsOneRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := h.submit("twice", "twice", "only once")
	b := h.submit("twice", "twice", "only once")
	require.Equal(t, a.GetRunId(), b.GetRunId())
	h.watch(ctx, "twice", 0, nil)
	list, err := h.client.ListRuns(ctx, &executorv1.ListRunsRequest{NormalizedSessionId: "twice"})
	require.NoError(t, err)
	require.Len(t, list.GetRuns(), 1)
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"))
}

func TestGatewayKilledMidTurnTheTurnFinishesWithContiguousEvents(t *testing.T) {
	t.Parallel()
	// Slow deltas so the kill lands mid-turn.
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "60"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("gw-crash", "gw-crash", "a long answer with many words so that it streams for a while before it ends")
	killed := false
	evs := h.watch(ctx, "gw-crash", 0, func(m *executorv1.WatchRunResponse) {
		if !killed && m.GetEvent().GetEventType() == "item.delta" {
			killed = true
			h.st.Proc("runnergw").Kill()
			_, err := h.st.Start(ctx, "runnergw")
			require.NoError(t, err)
		}
	})
	require.True(t, killed, "the gateway was killed mid-turn")
	requireContiguous(t, evs)
	run := h.get("gw-crash")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.EqualValues(t, 1, run.GetAttempt(), "the executor kept its lease")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"), "the provider turn started exactly once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "the provider survived the gateway crash")
	replayed := h.watch(ctx, "gw-crash", 0, nil)
	require.Len(t, replayed, len(evs))
}

func TestAttachWithALowerAttemptIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw := h.gatewayClient()
	in, err := cli.InputSpec{Prompt: "x", Company: "acme", Agent: "agent-1", Session: "fence", Lifecycle: "warm"}.Input()
	require.NoError(t, err)
	open := func(attempt uint64) (gatewayv1.RunnerGateway_AttachClient, error) {
		s, err := gw.Attach(ctx)
		if err != nil {
			return nil, err
		}
		return s, s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
			RunId: "fenced-run", Fence: &gatewayv1.FencingToken{Owner: "executor-a", Attempt: attempt}, Input: in,
		}}})
	}
	newer, err := open(2)
	require.NoError(t, err)
	first, err := newer.Recv()
	require.NoError(t, err)
	require.NotNil(t, first.GetOpened(), "attempt 2 attaches")

	older, err := open(1)
	require.NoError(t, err)
	_, err = older.Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.EqualValues(t, "runner_attempt_fenced", failure.CodeOf(err))
}

// gatewayClient is a client of the stack's gateway that signs grants with
// the stack's executor key, as an executor does (closed with the test).
func (h *harness) gatewayClient() gatewayv1.RunnerGatewayClient {
	h.t.Helper()
	conn, err := grpcx.Dial(h.st.Addr("runnergw"), "")
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	gw, err := h.st.GatewayClient(conn)
	require.NoError(h.t, err)
	return gw
}
