package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// Provider and runnerd loss (SPEC R7, R8) through the whole stack: real
// executor, runnergw, runnerd (provider host on) and fake codex, which
// SIGKILLs itself at a chosen phase of a turn ("[die:<phase>]" in the
// prompt, once, with --die-once-dir). "The turn started once" is read from
// the provider's own durable history (the fake's state file: the turns
// holding the prompt) and from its call log, never from counters.

// recoveryHarness is a stack whose fake dies on request and whose executor
// retries a failed attempt quickly.
func recoveryHarness(t *testing.T, fakeArgs ...string) *harness {
	t.Helper()
	return newHarness(t, stack.Options{
		FakeArgs:     append([]string{"--die-once-dir", t.TempDir()}, fakeArgs...),
		ExecutorArgs: []string{"-retry-delay", "200ms"},
	})
}

// providerTurn is one turn of the fake's durable history.
type providerTurn struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Items  []struct {
		Type  string   `json:"type"`
		Texts []string `json:"texts"`
		Text  string   `json:"text"`
	} `json:"items"`
}

// providerTurnsWith returns the turns of the session's provider thread
// (the fake's state file in the scope's codex home) whose user input holds
// prompt.
func providerTurnsWith(t *testing.T, h *harness, prompt string) []providerTurn {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(h.st.RunnerStateRoot(), "*", "codex-home", "fake-codex-state.json"))
	require.NoError(t, err)
	require.Len(t, files, 1, "one session scope with provider state")
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	var st struct {
		Threads map[string]struct {
			Turns []providerTurn `json:"turns"`
		} `json:"threads"`
	}
	require.NoError(t, json.Unmarshal(b, &st))
	require.Len(t, st.Threads, 1, "one provider thread")
	var out []providerTurn
	for _, th := range st.Threads {
		for _, tn := range th.Turns {
			for _, it := range tn.Items {
				if it.Type == "userMessage" && strings.Contains(strings.Join(it.Texts, "\n"), prompt) {
					out = append(out, tn)
					break
				}
			}
		}
	}
	return out
}

// requireOneSucceededTerminal checks the run ended succeeded with exactly
// one run.terminal, the last event, and returns its final message.
func requireOneSucceededTerminal(t *testing.T, h *harness, runID string, evs []*executorv1.WatchRunResponse) string {
	t.Helper()
	terms := eventsOf(evs, "run.terminal")
	require.Len(t, terms, 1, "one run.terminal")
	require.Equal(t, "run.terminal", evs[len(evs)-1].GetEvent().GetEventType())
	require.Equal(t, "succeeded", terms[0]["runTerminalState"])
	run := h.get(runID)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	final, _ := terms[0]["finalMessage"].(string)
	require.NotEmpty(t, final)
	return final
}

// requireKilledBySIGKILL checks harness.exited names the provider's own
// end, not the shim's.
func requireKilledBySIGKILL(t *testing.T, evs []*executorv1.WatchRunResponse) {
	t.Helper()
	exits := eventsOf(evs, "harness.exited")
	require.Len(t, exits, 1, "the provider was lost once")
	msg, _ := exits[0]["message"].(string)
	require.Contains(t, msg, "killed by signal SIGKILL", "the provider's own cause")
	require.Equal(t, "provider_process_exited", exits[0]["code"])
}

func watchRun(t *testing.T, h *harness, runID string) []*executorv1.WatchRunResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return h.watch(ctx, runID, 0, nil)
}

// runThroughProviderKill submits prompt as run runID (its own session),
// watches it to its end and checks what every provider kill must give:
// contiguous events, one succeeded run.terminal after attempt attempts, and
// harness.exited naming SIGKILL. It returns the events and the final
// message.
func runThroughProviderKill(t *testing.T, h *harness, runID, prompt string, attempt int) ([]*executorv1.WatchRunResponse, string) {
	t.Helper()
	h.submit(runID, runID, prompt)
	evs := watchRun(t, h, runID)
	requireContiguous(t, evs)
	final := requireOneSucceededTerminal(t, h, runID, evs)
	require.EqualValues(t, attempt, h.get(runID).GetAttempt())
	requireKilledBySIGKILL(t, evs)
	if attempt > 1 {
		retries := eventsOf(evs, "run.retry_scheduled")
		require.Len(t, retries, 1)
		require.Equal(t, "native_session_interrupted", retries[0]["code"])
		require.Contains(t, retries[0]["message"], "killed by signal SIGKILL", "the retry names the provider's signal")
	}
	return evs, final
}

func TestR7_ProviderKilledAfterCompletingTheTurnBeforeItsEventsWereSentIsReconciledWithoutASecondTurnStart(t *testing.T) {
	t.Parallel()
	h := recoveryHarness(t)
	const prompt = "finish the report [die:completed]"
	// No retry: the provider's recorded result ended the turn.
	evs, final := runThroughProviderKill(t, h, "r7-completed", prompt, 1)
	reconciled := eventsOf(evs, "turn.completed")
	require.Len(t, reconciled, 1)
	require.Equal(t, true, reconciled[0]["reconciled"], "the result came from thread/read")
	require.Empty(t, eventsOf(evs, "turn.lost"))

	turns := providerTurnsWith(t, h, prompt)
	require.Len(t, turns, 1, "the provider ran the turn once")
	require.Equal(t, "completed", turns[0].Status)
	require.Contains(t, final, "ECHO: "+prompt, "the recorded reply is the run's result")
	log := h.st.CallLog()
	require.Equal(t, 1, countLines(t, log, "die:completed"))
	require.Equal(t, 1, countLines(t, log, "turn/start"), "turn/start was sent once")
	require.Equal(t, 2, countLines(t, log, "process-start"), "one replacement provider")
	require.Equal(t, 1, countLines(t, log, "thread/read"), "the turn was reconciled")

	// The session shows the replacement provider, not the dead one.
	killedPID := eventsOf(evs, "harness.exited")[0]["pid"]
	readies := eventsOf(evs, "harness.ready")
	livePID := readies[len(readies)-1]["pid"]
	require.NotEqual(t, killedPID, livePID)
	// (the runner reports it with its next pong)
	require.Eventually(t, func() bool {
		sess, err := h.client.GetSession(context.Background(), &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "r7-completed"})
		return err == nil && len(sess.GetSessions()) == 1 && float64(sess.GetSessions()[0].GetProviderProcess().GetPid()) == livePID
	}, time.Minute, 100*time.Millisecond, "GetSession follows the provider restart")

	// The session goes on on the replacement provider, with the history.
	h.submit("r7-completed-next", "r7-completed", "and the summary")
	next := requireOneSucceededTerminal(t, h, "r7-completed-next", watchRun(t, h, "r7-completed-next"))
	require.Contains(t, next, "(turn 2, 2 earlier messages)")
	require.Equal(t, 2, countLines(t, log, "process-start"))
}

func TestR7_ProviderKilledBeforeAnsweringTurnStartTheAttemptIsRetriedAndTheTurnRunsOnce(t *testing.T) {
	t.Parallel()
	h := recoveryHarness(t)
	const prompt = "[die:turn-start] plan the week"
	evs, final := runThroughProviderKill(t, h, "r7-start", prompt, 2)
	require.Len(t, eventsOf(evs, "turn.started"), 1, "one turn was announced")

	turns := providerTurnsWith(t, h, prompt)
	require.Len(t, turns, 1, "the provider ran the turn once")
	require.Equal(t, "completed", turns[0].Status)
	require.Contains(t, final, "(turn 1, 0 earlier messages)")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "die:turn-start"))
}

func TestR7_ProviderKilledMidStreamTheCutOffTurnIsRetriedOnTheResumedThreadAndTheRunSucceeds(t *testing.T) {
	t.Parallel()
	h := recoveryHarness(t, "--delta-delay-ms", "20")
	prompt := "[die:mid-stream] " + slowTurn
	evs, final := runThroughProviderKill(t, h, "r7-stream", prompt, 2)
	lost := eventsOf(evs, "turn.lost")
	require.Len(t, lost, 1, "the cut-off turn was reported lost, not failed")
	require.Equal(t, "interrupted", lost[0]["reconciliation"])
	require.Contains(t, lost[0]["message"], "killed by signal SIGKILL")
	require.LessOrEqual(t, len(eventsOf(evs, "turn.interrupted")), 1, "at most the reconciled one")

	// The provider's history: the cut-off turn was dropped (thread/revert,
	// SPEC R12) and the retried one completed once.
	require.Equal(t, "dropped", lost[0]["providerHistory"])
	turns := providerTurnsWith(t, h, prompt)
	require.Len(t, turns, 1)
	require.Equal(t, "completed", turns[0].Status)
	require.Contains(t, final, "(turn 1, 0 earlier messages)", "the retry continued the same thread, without the cut-off turn")
	log := h.st.CallLog()
	require.Equal(t, 2, countLines(t, log, "turn/start"), "one turn/start per attempt")
	require.Equal(t, 2, countLines(t, log, "process-start"), "one replacement provider")
}

// waitGatewayLog waits until the gateway's log has a line with every one
// of parts.
func waitGatewayLog(t *testing.T, h *harness, parts ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(h.st.LogPath("runnergw"))
		if err != nil {
			return false
		}
	lines:
		for _, line := range strings.Split(string(b), "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			return true
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the gateway's log has no line with %q", parts)
}

// killRunnerd SIGKILLs the session's runnerd (as GetRun reports it) and
// waits until it is gone.
func killRunnerd(t *testing.T, h *harness, runID string) int32 {
	t.Helper()
	pid := h.get(runID).GetRunnerProcess().GetPid()
	require.True(t, isRunnerd(pid), "pid %d is the session's runnerd", pid)
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGKILL))
	require.Eventually(t, func() bool { return !procid.Exists(int(pid)) }, 10*time.Second, 10*time.Millisecond)
	return pid
}

func TestR8_RunnerdKilledBetweenTurnsTheNextRunContinuesTheThreadWithTheSameRunnerIdentity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	first := "r8-idle-1"
	h.submit(first, "r8-idle", "first question")
	requireOneSucceededTerminal(t, h, first, watchRun(t, h, first))
	before := h.get(first)
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun(first, h.submitInput("r8-idle", "first question")))
	rs, ok := readRunnerState(t, root)
	require.True(t, ok)
	require.Equal(t, "ready", rs.Lifecycle, "a warm runner between turns")
	killed := killRunnerd(t, h, first)
	// The next run is submitted once the gateway saw the runner go: on a
	// loaded box its Open could otherwise still find the dead runner's
	// connection, take the scope's authority over on it (one rotation)
	// and attach again to the relaunched runner (a second one).
	waitGatewayLog(t, h, "runner disconnected", before.GetRunnerInstanceId())

	// The scope's previous run is terminal, the root's runner crashed idle
	// with the same identity: the next run resumes it (nothing quarantined).
	h.submit("r8-idle-2", "r8-idle", "second question")
	evs := watchRun(t, h, "r8-idle-2")
	final := requireOneSucceededTerminal(t, h, "r8-idle-2", evs)
	require.Contains(t, final, "(turn 2, 2 earlier messages)", "the provider thread continued")
	second := h.get("r8-idle-2")
	require.Equal(t, before.GetRunnerInstanceId(), second.GetRunnerInstanceId(), "the same runner identity")
	require.NotEqual(t, killed, second.GetRunnerProcess().GetPid(), "in a relaunched runnerd")
	require.NoDirExists(t, filepath.Join(h.st.RunnerStateRoot(), durable.QuarantineDir))
	rotated := eventsOf(evs, "session.authority_rotated")
	require.Len(t, rotated, 1)
	require.Equal(t, first, rotated[0]["previousRunId"])
	// (durableSource is verified_prior_run, or empty when a re-attach under
	// load found the runner the first attach relaunched already live.)
	log := h.st.CallLog()
	require.Equal(t, 1, countLines(t, log, "process-start"), "the provider survived under its host")
	require.Equal(t, 2, countLines(t, log, "turn/start"), "one turn/start per run")
	cp := controlPlaneOf(t, root)
	require.Equal(t, "r8-idle-2", cp.RunID)
	require.Equal(t, before.GetRunnerInstanceId(), cp.RunnerInstanceID)
}

// runnerd journals a turn's end (run.terminal) with one fsync and saves the
// state that clears the active turn afterwards. Killed in between, its state
// on disk still holds the turn of a run the database shows ended: the next
// run of the session must continue it, not quarantine it or find the turn
// still active. The crash is reproduced exactly: the state saved while the
// turn ran is put back after a kill -9 at the end of the run (the outbox,
// never compacted this early, holds everything after it).
func TestR8_RunnerdKilledAfterJournalingTheTurnsEndBeforeSavingItTheNextRunContinues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "40"}})
	first := "r8-end-1"
	h.submit(first, "r8-end", slowTurn)
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun(first, h.submitInput("r8-end", slowTurn)))
	// What runnerd saved while the turn ran: its state document and its
	// intent log, which holds the outcome of the turn.start (the active
	// turn) until a saved document covers it.
	statePath := filepath.Join(root, "runner", "runner-state.json")
	logPath := filepath.Join(root, "runner", runnerstate.IntentLogFile)
	var during, duringLog []byte
	require.Eventually(t, func() bool {
		l, _ := os.ReadFile(logPath) // read first: the log is emptied once a saved document covers it
		b, err := os.ReadFile(statePath)
		var st runnerstate.State
		if err != nil || json.Unmarshal(b, &st) != nil {
			return false
		}
		st.ApplyIntentLog(l)
		if st.ActiveTurn == nil {
			return false
		}
		require.Equal(t, first, st.ActiveTurn.RunID)
		during, duringLog = b, l
		return true
	}, time.Minute, 5*time.Millisecond, "the state saved while the turn runs")
	requireOneSucceededTerminal(t, h, first, watchRun(t, h, first))
	before := h.get(first)
	killRunnerd(t, h, first)
	for path, b := range map[string][]byte{statePath: during, logPath: duringLog} {
		tmp := path + ".restore"
		require.NoError(t, os.WriteFile(tmp, b, 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}

	h.submit("r8-end-2", "r8-end", "second question")
	evs := watchRun(t, h, "r8-end-2")
	final := requireOneSucceededTerminal(t, h, "r8-end-2", evs)
	require.Contains(t, final, "(turn 2, 2 earlier messages)", "the provider thread continued")
	require.Equal(t, before.GetRunnerInstanceId(), h.get("r8-end-2").GetRunnerInstanceId(), "the same runner identity")
	require.NoDirExists(t, filepath.Join(h.st.RunnerStateRoot(), durable.QuarantineDir))
	log := h.st.CallLog()
	require.Equal(t, 2, countLines(t, log, "turn/start"), "one turn/start per run")
	require.Equal(t, 1, countLines(t, log, "process-start"), "the provider survived under its host")
	rlog, err := os.ReadFile(filepath.Join(root, "runnerd.log"))
	require.NoError(t, err)
	require.Contains(t, string(rlog), "the active turn had ended before the restart", "the relaunched runnerd read the end from its journal")
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "tetherctl audit is clean: %+v", rep.Violations)
}

func TestR8_ARuntimeRequestOpenWhenRunnerdDiesIsAnnouncedExpiredByTheRelaunchedRunnerd(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("r8-ask", "r8-ask", "which colour? [ask]")
	var killed int32
	var created map[string]any
	evs := h.watch(ctx, "r8-ask", 0, func(m *executorv1.WatchRunResponse) {
		if killed != 0 || m.GetEvent().GetEventType() != "runtime_request.created" {
			return
		}
		created = m.GetEvent().GetPayload().AsMap()
		killed = killRunnerd(t, h, "r8-ask")
	})
	require.NotZero(t, killed, "runnerd was killed while the request was open")
	requireOneSucceededTerminal(t, h, "r8-ask", evs)

	expired := eventsOf(evs, "runtime_request.expired")
	require.Len(t, expired, 1, "the open request is announced expired once")
	require.Equal(t, "durable_handoff", expired[0]["reason"], "the provider survived under its host")
	require.Equal(t, false, expired[0]["replayAllowed"])
	require.Equal(t, created["requestId"], expired[0]["requestId"])
	require.Equal(t, created["turnId"], expired[0]["turnId"])
	require.Equal(t, "expired", expired[0]["request"].(map[string]any)["status"])
	log := h.st.CallLog()
	require.Equal(t, 1, countLines(t, log, "process-start"), "the provider survived")
	require.Equal(t, 1, countLines(t, log, "user-input-response:failure"), "the host answered the dead runnerd's request")
	require.Equal(t, 1, countLines(t, log, "turn/start"))
}

func TestR8_RunnerdKilledBeforeItRecordedTurnStartTheProviderTurnIsAdoptedNotStartedTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--die-once-dir", dir}, ExecutorArgs: []string{"-retry-delay", "200ms"}})
	h.submit("r8-cut-1", "r8-cut", "first question")
	requireOneSucceededTerminal(t, h, "r8-cut-1", watchRun(t, h, "r8-cut-1"))

	// The provider records the turn and holds its answer to turn/start
	// ("[stall:turn-recorded]"): runnerd has journaled the command's
	// intent, not its outcome, when it is killed.
	const prompt = "[stall:turn-recorded] second question"
	h.submit("r8-cut-2", "r8-cut", prompt)
	log := h.st.CallLog()
	require.Eventually(t, func() bool { return countLines(t, log, "stall:turn-recorded") == 1 }, time.Minute, 10*time.Millisecond)
	killRunnerd(t, h, "r8-cut-1") // the session's warm runnerd
	// (fakecodex.ReleaseFile(fakecodex.StallTurnRecorded))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "release-turn-recorded"), nil, 0o600))

	evs := watchRun(t, h, "r8-cut-2")
	final := requireOneSucceededTerminal(t, h, "r8-cut-2", evs)
	require.Contains(t, final, "(turn 2, 2 earlier messages)", "the thread continued")
	turns := providerTurnsWith(t, h, prompt)
	require.Len(t, turns, 1, "the provider ran the turn once")
	require.Equal(t, "completed", turns[0].Status)
	require.Equal(t, 2, countLines(t, log, "turn/start"), "one turn/start per run")
	require.Equal(t, 1, countLines(t, log, "process-start"), "the provider survived under its host")
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("r8-cut-2", h.submitInput("r8-cut", prompt)))
	rlog, err := os.ReadFile(filepath.Join(root, "runnerd.log"))
	require.NoError(t, err)
	require.Contains(t, string(rlog), "had started a turn; reconciling it", "the relaunched runnerd adopted the provider's turn")
	require.NoDirExists(t, filepath.Join(h.st.RunnerStateRoot(), durable.QuarantineDir))
}

func TestR7_AProviderKilledBetweenTurnsIsNeitherInGetSessionNorInListRunners(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("r7-gone-1", "r7-gone", "first question")
	requireOneSucceededTerminal(t, h, "r7-gone-1", watchRun(t, h, "r7-gone-1"))
	session := func() *executorv1.Session {
		resp, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "r7-gone"})
		require.NoError(t, err)
		require.Len(t, resp.GetSessions(), 1)
		return resp.GetSessions()[0]
	}
	gw := h.gatewayClient()
	runnerProvider := func() *prpv1.ProcessInfo {
		resp, err := gw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
		require.NoError(t, err)
		require.Len(t, resp.GetRunners(), 1)
		return resp.GetRunners()[0].GetProviderProcess()
	}
	dead := h.get("r7-gone-1").GetProviderProcess().GetPid()
	require.Positive(t, dead)
	require.Equal(t, dead, session().GetProviderProcess().GetPid(), "the live provider is shown")
	require.Equal(t, dead, runnerProvider().GetPid())

	require.NoError(t, syscall.Kill(int(dead), syscall.SIGKILL))
	require.Eventually(t, func() bool {
		s := session()
		return s.GetRunnerConnected() && s.GetLifecycle() == "ready" && s.GetProviderProcess() == nil && runnerProvider() == nil
	}, time.Minute, 20*time.Millisecond, "neither GetSession nor ListRunners shows the dead provider")

	// The next turn starts a provider on the same thread, and it is shown.
	h.submit("r7-gone-2", "r7-gone", "second question")
	final := requireOneSucceededTerminal(t, h, "r7-gone-2", watchRun(t, h, "r7-gone-2"))
	require.Contains(t, final, "(turn 2, 2 earlier messages)")
	live := h.get("r7-gone-2").GetProviderProcess().GetPid()
	require.NotEqual(t, dead, live)
	require.Equal(t, live, session().GetProviderProcess().GetPid())
	require.Equal(t, live, runnerProvider().GetPid())
}
