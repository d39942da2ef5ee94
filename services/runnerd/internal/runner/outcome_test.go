package runner

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
)

// afterStartProvider runs after each turn/start the provider answered (the
// effect done, its outcome not journaled yet).
type afterStartProvider struct {
	Provider
	after func()
}

func (p *afterStartProvider) StartTurn(ctx context.Context, text string) (string, error) {
	id, err := p.Provider.StartTurn(ctx, text)
	p.after()
	return id, err
}

// statusIn is command id's status in st ("absent" without a record).
func statusIn(st *runnerstate.State, id string) string {
	if rec := st.ProcessedCommands[id]; rec != nil {
		return rec.Status
	}
	return "absent"
}

// turnStarts counts the turn/starts every provider e started answered.
func turnStarts(e *testEnv) int {
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	n := 0
	for _, p := range e.prov.sessions {
		p.mu.Lock()
		n += p.turns
		p.mu.Unlock()
	}
	return n
}

// TestP4_AWarmTurnStartIsAnsweredFromItsOutcomeRecordWithoutRewritingTheState:
// the answers to a warm run.attach and turn.start go out once their
// outcomes are journaled in the intent log (one fdatasync), not after a
// rewrite of the state document (two fsyncs, a rename): when they arrive
// the document does not hold them yet, and no snapshot was written for
// them, while the document and the log together (what a restarted runnerd
// reads) hold both completed. The turn's end then saves the state once.
func TestP4_AWarmTurnStartIsAnsweredFromItsOutcomeRecordWithoutRewritingTheState(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var (
		mu    sync.Mutex
		saves int
	)
	e.start(func(c *Config) {
		// Counts the snapshots that hold anything of the second run: a
		// late write of the first run's end (its callback may run after
		// the loop answered the test's ping) is not a rewrite for the
		// second run's answers.
		c.StateSaved = func(st *runnerstate.State) {
			if (st.CurrentRun == nil || st.CurrentRun.RunID != "run-2") && st.ProcessedCommands["c-attach2"] == nil && st.ProcessedCommands["c-turn2"] == nil {
				return
			}
			mu.Lock()
			saves++
			mu.Unlock()
		}
	})
	e.gw.waitConns(1)
	// A first run starts the provider and ends its turn; its end is saved
	// once acknowledged.
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	e.gw.ack(e.gw.maxSeq())
	require.Eventually(t, func() bool {
		st := e.document()
		return st.ActiveTurn == nil && st.ProcessedCommands["c-turn1"] != nil && st.ProcessedCommands["c-turn1"].Final()
	}, 5*time.Second, 5*time.Millisecond)
	e.gw.ping(1) // the loop settled the first run's saves
	mu.Lock()
	before := saves
	mu.Unlock()

	type seen struct {
		status, inDocument, onDisk string
		saves                      int
	}
	var answers []seen
	statusOf := statusIn
	e.gw.mu.Lock()
	e.gw.onResult = func(r *prpv1.CommandResult) {
		mu.Lock()
		defer mu.Unlock()
		answers = append(answers, seen{status: r.GetStatus(), inDocument: statusOf(e.document(), r.GetCommandId()),
			onDisk: statusOf(e.state(), r.GetCommandId()), saves: saves - before})
	}
	e.gw.mu.Unlock()
	cs2 := &cmdSeq{t: t, runID: "run-2", attempt: 1, seq: cs.seq}
	e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: cs2.attach("c-attach2")}})
	res := e.gw.command(cs2.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())

	mu.Lock()
	got := append([]seen(nil), answers...)
	mu.Unlock()
	require.Len(t, got, 2)
	for i, a := range got {
		assert.Equal(t, runnerstate.StatusCompleted, a.status)
		assert.Equal(t, runnerstate.StatusCompleted, a.onDisk, "answer %d: its outcome is durable (document + intent log)", i)
		assert.NotEqual(t, runnerstate.StatusCompleted, a.inDocument, "answer %d: sent before the state document holds it", i)
		assert.Zero(t, a.saves, "answer %d: no state document rewrite before it", i)
	}
	st := e.state()
	require.NotNil(t, st.ActiveTurn)
	assert.Equal(t, "c-turn2", st.ActiveTurn.CommandID)
	assert.Equal(t, "run-2", st.CurrentRun.RunID)

	// The turn's end saves the state (after its acknowledgement): the
	// document catches up with the outcomes.
	e.prov.last().finish(TurnResult{TurnID: "turn-2", Status: "completed"})
	e.gw.waitEvent("run.terminal", 2)
	e.gw.ack(e.gw.maxSeq())
	require.Eventually(t, func() bool {
		st := e.document()
		return st.ActiveTurn == nil && statusOf(st, "c-turn2") == runnerstate.StatusCompleted &&
			statusOf(st, "c-attach2") == runnerstate.StatusCompleted && st.CurrentRun.RunID == "run-2"
	}, 5*time.Second, 5*time.Millisecond)
}

// TestR8_RunnerdKilledAroundATurnStartsOutcomeRecordNeverRunsItAgain: a
// runnerd killed at each moment around a turn.start's outcome record — its
// turn started but the outcome not journaled, the outcome journaled and
// answered but no snapshot written, the turn's end journaled too but still
// no snapshot — leaves a state dir from which the relaunched runnerd never
// starts the turn again: the resent turn.start gets the turn that was
// started (stored, or adopted from the provider's thread), the run.attach
// its stored answer, and the turn goes on or is settled once.
func TestR8_RunnerdKilledAroundATurnStartsOutcomeRecordNeverRunsItAgain(t *testing.T) {
	t.Parallel()
	for _, moment := range []string{"before the outcome record", "after the answer, before a snapshot", "after the turn's end, before its snapshot"} {
		t.Run(moment, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t)
			runnerDir := filepath.Join(e.stateDir, "runner")
			crashed := filepath.Join(t.TempDir(), "runner")
			var once sync.Once
			snap := func() { once.Do(func() { copyDir(t, runnerDir, crashed) }) }
			first := e.start(func(c *Config) {
				c.AttachFollowWindow = time.Minute
				if moment != "before the outcome record" {
					return
				}
				start := c.StartProvider
				c.StartProvider = func(ctx context.Context, cfg ProviderConfig, emit func(ProviderEvent)) (Provider, error) {
					p, err := start(ctx, cfg, emit)
					if err != nil {
						return nil, err
					}
					return &afterStartProvider{Provider: p, after: snap}, nil
				}
			})
			e.gw.waitConns(1)
			if moment == "after the answer, before a snapshot" {
				e.gw.mu.Lock()
				e.gw.onResult = func(r *prpv1.CommandResult) {
					if r.GetCommandId() == "c-turn" {
						snap()
					}
				}
				e.gw.mu.Unlock()
			}
			cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
			attach := cs.attach("c-attach")
			turn := cs.next("c-turn", CmdTurnStart, map[string]any{"text": "hello"})
			e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: attach}})
			res := e.gw.command(turn)
			require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
			require.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue())
			if moment == "after the turn's end, before its snapshot" {
				e.prov.last().finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "done"})
				e.gw.waitEvent("run.terminal", 1)
				snap() // not acknowledged: the turn's end is not saved
				require.NotNil(t, e.state().ActiveTurn)
			}
			// runnerd is killed here: its state dir as it was then is what
			// the relaunched one finds, and nothing it sent afterwards
			// reached the controller.
			_, err := os.Stat(crashed)
			require.NoError(t, err, "the state dir was taken at the crash")
			e.gw.mu.Lock()
			e.gw.onResult = nil
			sent := len(e.gw.events)
			e.gw.mu.Unlock()
			first.stop(t)
			e.gw.mu.Lock()
			e.gw.events = e.gw.events[:sent]
			e.gw.results = nil
			e.gw.mu.Unlock()
			require.NoError(t, os.RemoveAll(runnerDir))
			copyDir(t, crashed, runnerDir)
			crashedState := e.state()
			if moment != "before the outcome record" {
				assert.NotEqual(t, runnerstate.StatusCompleted, statusIn(e.document(), "c-turn"),
					"the answer went out before the state document held it")
				assert.Equal(t, runnerstate.StatusCompleted, statusIn(crashedState, "c-turn"),
					"the outcome record holds it")
				require.NotNil(t, crashedState.ActiveTurn, "the outcome record holds the turn it started")
				assert.Equal(t, "turn-1", crashedState.ActiveTurn.TurnID)
				assert.Equal(t, "run-1", crashedState.CurrentRun.RunID)
			}
			e.prov.mu.Lock()
			// The provider's thread records the turn (it started) as
			// still running.
			e.prov.history = map[string]string{"turn-1": "inProgress"}
			e.prov.lastTurn = "turn-1"
			e.prov.mu.Unlock()

			e.start(nil)
			e.gw.waitConns(2)
			e.gw.waitEvent("runner.reconciled", 1)
			res = e.gw.command(attach)
			assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
			res = e.gw.command(turn)
			require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
			assert.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue(), "the turn that was started")
			assert.Equal(t, 1, turnStarts(e), "the turn started once, before the crash")

			if moment == "after the turn's end, before its snapshot" {
				// Its end was journaled (and sent): it is settled, not
				// reconciled again.
				e.gw.ping(1)
				require.Eventually(t, func() bool { return e.state().ActiveTurn == nil }, 5*time.Second, 5*time.Millisecond)
				n := 0
				for _, rx := range e.gw.distinct() {
					if rx.ev.GetEventType() == "run.terminal" {
						n++
					}
				}
				assert.Equal(t, 1, n, "the turn ends once")
				return
			}
			st := e.state()
			require.NotNil(t, st.ActiveTurn, "the turn goes on")
			assert.Equal(t, "turn-1", st.ActiveTurn.TurnID)
			assert.Equal(t, "c-turn", st.ActiveTurn.CommandID)
			e.prov.last().finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "done"})
			term := e.gw.waitEvent("run.terminal", 1)
			assert.Equal(t, "turn-1", term.GetTurnId())
			assert.Equal(t, 1, turnStarts(e))
		})
	}
}

// TestR8_TheIntentLogIsEmptiedOnlyOnceASavedDocumentCoversItsOutcomes:
// warm turn after warm turn, the intent log grows by their intents and
// outcome records and is emptied once a saved state document covers every
// record in it: at each answer, the document and the log together (what a
// restarted runnerd reads) hold the answered outcome and its turn, before
// and after the log was emptied.
func TestR8_TheIntentLogIsEmptiedOnlyOnceASavedDocumentCoversItsOutcomes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	e.gw.waitConns(1)
	logPath := filepath.Join(e.stateDir, "runner", runnerstate.IntentLogFile)
	var (
		mu       sync.Mutex
		problems []string
	)
	e.gw.mu.Lock()
	e.gw.onResult = func(r *prpv1.CommandResult) {
		st := e.state()
		problem := ""
		switch {
		case statusIn(st, r.GetCommandId()) != r.GetStatus():
			problem = "its outcome is " + statusIn(st, r.GetCommandId())
		case r.GetCommandType() == CmdTurnStart && (st.ActiveTurn == nil || st.ActiveTurn.CommandID != r.GetCommandId()):
			problem = "its turn is not active"
		}
		if problem != "" {
			mu.Lock()
			problems = append(problems, r.GetCommandId()+" answered "+r.GetStatus()+" while "+problem)
			mu.Unlock()
		}
	}
	e.gw.mu.Unlock()
	var seq uint64
	emptied, peak := 0, int64(0)
	for n := 1; n <= 300 && emptied < 2; n++ {
		cs := &cmdSeq{t: t, runID: "run-" + strconv.Itoa(n), attempt: 1, seq: seq}
		e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: cs.attach("attach-" + strconv.Itoa(n))}})
		res := e.gw.command(cs.next("turn-"+strconv.Itoa(n), CmdTurnStart, map[string]any{"text": "hello"}))
		seq = cs.seq
		require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
		e.prov.last().finish(TurnResult{TurnID: res.GetResult().GetFields()["turnId"].GetStringValue(), Status: "completed"})
		e.gw.waitEvent("run.terminal", n)
		e.gw.ack(e.gw.maxSeq())
		fi, err := os.Stat(logPath)
		require.NoError(t, err)
		if fi.Size() < peak {
			emptied++
		}
		peak = fi.Size()
	}
	assert.Equal(t, 2, emptied, "the log was emptied")
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, problems)
}
