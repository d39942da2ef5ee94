package runner

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// endLive emits the closing events of a turn the provider finished —
// its turn.<status> last — without delivering its result: whoever takes
// the result (the runner loop) is lost before it does.
func (p *fakeProvider) endLive(turnID, status string) {
	p.emit(ProviderEvent{Type: "item.completed", TurnID: turnID, ItemID: "item-1", Priority: P1, Payload: map[string]any{"text": "live " + status}})
	p.emit(ProviderEvent{Type: "turn." + status, TurnID: turnID, Priority: P0, Payload: map[string]any{"status": status,
		"usage": map[string]any{"inputTokens": int64(120), "cachedInputTokens": int64(80), "outputTokens": int64(17)}}})
}

// copyDir copies the files of src into dst (created), keeping their modes.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(to, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil // sockets and the like: gone with the process
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, info.Mode().Perm())
	}))
}

// killKeepingState kills runnerd p as a crash would: its state dir as it
// is now is what the relaunched one finds, and nothing it sends from now
// on reaches the controller.
func killKeepingState(t *testing.T, e *testEnv, p *runnerProc) {
	t.Helper()
	runnerDir := filepath.Join(e.stateDir, "runner")
	crashed := filepath.Join(t.TempDir(), "runner")
	copyDir(t, runnerDir, crashed)
	e.gw.mu.Lock()
	sent := len(e.gw.events)
	e.gw.mu.Unlock()
	p.stop(t)
	e.gw.mu.Lock()
	e.gw.events = e.gw.events[:sent]
	e.gw.mu.Unlock()
	require.NoError(t, os.RemoveAll(runnerDir))
	copyDir(t, crashed, runnerDir)
}

// run1EndsAndItsProviderCrashes runs run-1's turn turn-1 to its end on a
// new runnerd, then crashes its provider while idle; it returns the
// environment, the runnerd and run-1's command sequence.
func run1EndsAndItsProviderCrashes(t *testing.T) (*testEnv, *runnerProc, *cmdSeq) {
	t.Helper()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "first"})
	e.gw.waitEvent("run.terminal", 1)
	prov.crash(failure.ProviderStdoutClosed)
	e.gw.waitEvent("harness.exited", 1) // noticed: the next turn starts a new provider
	return e, p, cs
}

// startRun2 attaches run-2 after run-1 (cs) and starts its turn on the
// provider restarted after run-1's crashed, which numbers its turns anew:
// the turn is turn-1 again.
func startRun2(t *testing.T, e *testEnv, cs *cmdSeq) {
	t.Helper()
	cs2 := &cmdSeq{t: t, seq: cs.seq, runID: "run-2", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs2.attach("c2-attach")).GetStatus())
	res := e.gw.command(cs2.next("c2-turn", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue(), "the restarted provider numbers its turns anew")
}

// turnHistory is what the controller stores of e's gateway's events (one
// row per source seq, the first copy): the turn.<status> events of turnID
// and the run.terminal events.
func turnHistory(e *testEnv, turnID, status string) (turnEvents, terminals []*prpv1.Event) {
	rows := e.gw.distinct()
	for seq := uint64(1); seq <= e.gw.maxSeq(); seq++ {
		rx, ok := rows[seq]
		if !ok {
			continue
		}
		switch ev := rx.ev; {
		case ev.GetEventType() == "turn."+status && ev.GetTurnId() == turnID:
			turnEvents = append(turnEvents, ev)
		case ev.GetEventType() == "run.terminal":
			terminals = append(terminals, ev)
		}
	}
	return turnEvents, terminals
}

// TestR7_ATurnEventJournaledBeforeALossIsNotJournaledAgainByTheReconciliation:
// the provider finished the turn and runnerd journaled its live
// turn.<status> event, then was lost before it took the turn's result
// (no run.terminal yet). The relaunched runnerd (or, for a provider lost
// under a live runnerd, the same one) reconciles the turn from the
// provider's record — also on a provider it re-attached to under its host,
// which replays nothing of a turn whose end is journaled (before, that
// turn stayed active for good): the turn's result settles it with one run.terminal,
// and the reconciled turn.<status> the driver emits again is not journaled
// a second time — the run's durable history holds one turn event for the
// turn (SPEC R7, X1). The event may still be in the outbox (not yet
// acknowledged) or only in the state saved after its acknowledgement. The
// run.terminal reports the turn's usage as its journaled event did, though
// the provider's record carries none (SPEC E1).
func TestR7_ATurnEventJournaledBeforeALossIsNotJournaledAgainByTheReconciliation(t *testing.T) {
	t.Parallel()
	for _, status := range []string{"completed", "failed"} {
		for _, loss := range []string{"runnerd, event unacknowledged", "runnerd, event acknowledged", "runnerd, hosted provider re-attached",
			"provider, under a live runnerd"} {
			t.Run(status+"/"+loss, func(t *testing.T) {
				t.Parallel()
				e := newTestEnv(t)
				hosted := func(c *Config) { c.ProviderHost = loss == "runnerd, hosted provider re-attached" }
				first := e.start(hosted)
				e.prov.mu.Lock()
				e.prov.history = map[string]string{"turn-1": status}
				e.prov.mu.Unlock()
				cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
				prov := attachAndTurn(t, e, cs)
				prov.endLive("turn-1", status)
				live := e.gw.waitEvent("turn."+status, 1)
				require.NotContains(t, live.GetPayload().AsMap(), "reconciled")

				if loss == "provider, under a live runnerd" {
					prov.crash(failure.ProviderStdoutClosed)
				} else {
					if loss == "runnerd, event acknowledged" {
						// The controller persisted it; the state saved
						// at the ping holds the cursor past it, so the
						// relaunched runnerd's outbox no longer does.
						e.gw.ack(live.GetSourceSeq())
						require.Equal(t, live.GetSourceSeq(), e.gw.ping(1).GetAckedSourceSeq())
						e.gw.mu.Lock()
						e.gw.acked = live.GetSourceSeq()
						e.gw.mu.Unlock()
					}
					killKeepingState(t, e, first)
					st := e.state()
					require.NotNil(t, st.ActiveTurn, "the turn is active in the crashed state")
					require.Equal(t, "turn-1", st.ActiveTurn.TurnID)

					e.start(hosted)
					e.gw.waitConns(2)
					e.gw.waitEvent("runner.reconciled", 1)
				}
				term := e.gw.waitEvent("run.terminal", 1)
				assert.Equal(t, "recorded "+status, term.GetPayload().AsMap()["finalMessage"], "the turn's recorded result ends it")
				assert.Equal(t, "turn-1", term.GetTurnId())
				// The provider's record carries no usage (codex's thread/read
				// keeps none): the terminal reports the journaled event's
				// (SPEC E1), not zero.
				assert.Equal(t, map[string]any{"inputTokens": float64(120), "cachedInputTokens": float64(80), "outputTokens": float64(17)},
					term.GetPayload().AsMap()["usage"].(map[string]any)["runDelta"], "the turn's usage as its journaled event reported it")
				e.gw.ping(2) // the loop has settled the reconciliation
				require.Eventually(t, func() bool { return e.state().ActiveTurn == nil }, 5*time.Second, 10*time.Millisecond)

				turnEvents, terminals := turnHistory(e, "turn-1", status)
				require.Len(t, turnEvents, 1, "one turn.%s for the turn in the run's history", status)
				assert.Equal(t, live.GetSourceSeq(), turnEvents[0].GetSourceSeq(), "the live event is the turn's one")
				require.Len(t, terminals, 1, "the turn settles once")
				assert.Greater(t, terminals[0].GetSourceSeq(), turnEvents[0].GetSourceSeq(), "the turn event precedes the terminal")
				assert.Equal(t, 2, e.prov.count(), "the turn was reconciled on a restarted (or re-attached) provider")
				assert.Zero(t, e.prov.last().turns, "no second turn/start")
			})
		}
	}
}

// TestR7_ATurnIDAProviderUsesAgainAfterARestartGetsItsOwnTurnEvent: turn
// ids are the provider's, and a restarted provider may number its turns
// from the start again (the fake codex without durable turn ids does; an
// ACP session's turns start at acp-turn-1): the turn.<status> of a new
// turn whose id equals the previous turn's journaled one is that turn's
// own event, journaled — the journaled-once rule covers a turn's
// reconciliation, never a later turn (SPEC R7, X1).
func TestR7_ATurnIDAProviderUsesAgainAfterARestartGetsItsOwnTurnEvent(t *testing.T) {
	t.Parallel()
	e, _, cs := run1EndsAndItsProviderCrashes(t)

	startRun2(t, e, cs)
	require.Equal(t, 2, e.prov.count(), "a restarted provider")
	e.prov.last().finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "second"})
	e.gw.waitEvent("run.terminal", 2)

	var runs []string
	for _, ev := range e.gw.eventsOf("turn.completed") {
		require.Equal(t, "turn-1", ev.GetTurnId())
		runs = append(runs, ev.GetRunId())
	}
	assert.Equal(t, []string{"run-1", "run-2"}, runs, "each run's turn has its turn.completed")
}

// TestR7_ATurnIDUsedAgainIsReconciledWithItsOwnEventAfterARunnerdLoss: as
// above, and runnerd is lost while the second turn-1 runs, the first
// turn-1's turn.completed still unacknowledged in the outbox: the
// relaunched runnerd, reading the outbox for a journaled turn event, takes
// the turn.started after it as the end of that fact, and the second turn's
// reconciled turn.completed is journaled — its one event; nor is the first
// turn-1's run.terminal taken for the end of the second (before, the
// second stayed unsettled: no run.terminal for run-2) (SPEC R7, R8, X1).
func TestR7_ATurnIDUsedAgainIsReconciledWithItsOwnEventAfterARunnerdLoss(t *testing.T) {
	t.Parallel()
	e, first, cs := run1EndsAndItsProviderCrashes(t)
	startRun2(t, e, cs)
	e.gw.waitEvent("turn.started", 2)
	e.prov.mu.Lock()
	e.prov.history = map[string]string{"turn-1": "completed"}
	e.prov.mu.Unlock()

	killKeepingState(t, e, first) // nothing acknowledged

	e.start(nil)
	e.gw.waitConns(2)
	e.gw.waitEvent("run.terminal", 2)
	var runs, terminals []string
	for _, ev := range e.gw.distinct() {
		switch ev.ev.GetEventType() {
		case "turn.completed":
			runs = append(runs, ev.ev.GetRunId())
		case "run.terminal":
			terminals = append(terminals, ev.ev.GetRunId())
		}
	}
	sort.Strings(runs)
	sort.Strings(terminals)
	assert.Equal(t, []string{"run-1", "run-2"}, runs, "each run's turn-1 has one turn.completed")
	assert.Equal(t, []string{"run-1", "run-2"}, terminals, "each run ends once")
}

// TestR7_AResentTurnStartOfATurnThatReusedALostTurnsIDAnnouncesNoLoss: turn
// turn-1 was lost; the retry's turn.start ran on the restarted provider,
// which named its turn turn-1 again, and it completed. A controller that
// takes the run over and resends that turn.start gets the stored answer,
// and no turn.lost: the loss recorded under the id is the earlier
// command's, not this one's (SPEC R7).
func TestR7_AResentTurnStartOfATurnThatReusedALostTurnsIDAnnouncesNoLoss(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.crash(failure.ProviderProcessExited)
	e.gw.waitEvent(EventTurnLost, 1)

	retry := &cmdSeq{t: t, seq: cs.seq, runID: "run-1", attempt: 2}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(retry.next("c-attach-2", CmdRunAttach, map[string]any{"input": testInput(t)})).GetStatus())
	res := e.gw.command(retry.next("c-turn-retry", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue(), "the restarted provider numbers its turns anew")
	e.prov.last().finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "retried"})
	e.gw.waitEvent("run.terminal", 1)

	takeover := &cmdSeq{t: t, seq: retry.seq, runID: "run-1", attempt: 3}
	e.gw.command(takeover.next("c-attach-3", CmdRunAttach, map[string]any{"input": testInput(t)}))
	res = e.gw.command(takeover.next("c-turn-retry", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), "the stored answer")
	e.gw.ping(1) // the resent command's effects are journaled
	assert.Len(t, e.gw.eventsOf(EventTurnLost), 1, "the completed turn is not announced lost")
}

// TestR8_ACutTurnStartOnAFreshThreadWhoseTurnReusesAnEarlierThreadsIDIsAdopted:
// the provider's thread was replaced by a fresh one (its earlier thread
// could not be resumed), whose turns are numbered anew (an ACP session's
// acp-turn-1). runnerd is killed between journaling a turn.start and its
// outcome; the fresh thread's newest turn, turn-1, bears the id of a turn
// of the earlier thread that runnerd knows. It is the cut command's turn:
// adopted, never started a second time (SPEC R8, X1) — runnerd knows the
// turns of the thread it reads, not of another.
func TestR8_ACutTurnStartOnAFreshThreadWhoseTurnReusesAnEarlierThreadsIDIsAdopted(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	turn := cutTurnStart(t, e)
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st, err := store.Load()
	require.NoError(t, err)
	// The earlier thread's turn.start, answered with its turn-1.
	st.ProcessedCommands["c0"] = &runnerstate.CommandRecord{CommandID: "c0", ControllerSeq: 1, CommandType: CmdTurnStart,
		RunID: "run-0", Attempt: 1, Status: runnerstate.StatusCompleted,
		Result: map[string]any{"turnId": "turn-1", "providerThreadId": "thread-1"}}
	st.ProviderThreadID, st.LastTurnID = "thread-2", ""
	require.NoError(t, store.Save(st))

	res := resendAfterRestart(e, turn, "turn-1", map[string]string{"turn-1": "inProgress"})
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, "turn-1", res.GetResult().AsMap()["turnId"])
	prov := e.prov.last()
	assert.Zero(t, prov.turns, "no second turn/start: the fresh thread's turn-1 is the cut command's")
	require.NotNil(t, e.state().ActiveTurn, "the provider's turn is retained")
	assert.Equal(t, "c2", e.state().ActiveTurn.CommandID)
}

// TestR8_AFreshThreadForgetsTheEarlierThreadsNewestTurn: the provider is
// restarted and cannot resume the thread; the fresh thread's turns are its
// own. The state saved once the fresh thread is open — what a runnerd
// killed during the turn.start that opened it leaves — no longer names the
// earlier thread's newest turn as the thread's (a cut turn.start is judged
// by it: its turn may bear that id).
func TestR8_AFreshThreadForgetsTheEarlierThreadsNewestTurn(t *testing.T) {
	t.Parallel()
	e, _, cs := run1EndsAndItsProviderCrashes(t)
	require.Equal(t, "turn-1", e.state().LastTurnID)
	var atStart *runnerstate.State
	e.prov.mu.Lock()
	e.prov.freshThread = "thread-2"
	e.prov.beforeStartTurn = func() { atStart = e.state() }
	e.prov.mu.Unlock()

	startRun2(t, e, cs)
	require.NotNil(t, atStart)
	assert.Equal(t, "thread-2", atStart.ProviderThreadID)
	assert.Empty(t, atStart.LastTurnID, "thread-2 had no turn when its first was started")
}

// TestR7_AnInterruptOfAnEarlierTurnOfTheSameIDDoesNotExcuseALaterTurnCutOff:
// turn-1 was interrupted on request; the provider restarted and named a
// later turn turn-1 again; that provider is lost mid-turn and its record
// reads the turn back interrupted — cut off by the loss, not asked: the
// turn is lost and retried, not ended as interrupted (SPEC R7).
func TestR7_AnInterruptOfAnEarlierTurnOfTheSameIDDoesNotExcuseALaterTurnCutOff(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	res := e.gw.command(cs.next("c-int", CmdTurnInterrupt, map[string]any{}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	prov.finish(TurnResult{TurnID: "turn-1", Status: "interrupted"})
	e.gw.waitEvent("run.terminal", 1)
	prov.crash(failure.ProviderStdoutClosed)
	e.gw.waitEvent("harness.exited", 1) // noticed: the next turn starts a new provider

	startRun2(t, e, cs)
	e.prov.mu.Lock()
	e.prov.history = map[string]string{"turn-1": "interrupted"}
	e.prov.mu.Unlock()
	e.prov.last().crash(failure.ProviderStdoutClosed)

	lost := e.gw.waitEvent(EventTurnLost, 1)
	assert.Equal(t, "run-2", lost.GetRunId())
	assert.Equal(t, "interrupted", lost.GetPayload().AsMap()["reconciliation"])
	assert.Len(t, e.gw.eventsOf("run.terminal"), 1, "run-2 does not end: its attempt is retried")
}
