package runner

import (
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

// warmTurn runs one warm run (run.attach, turn.start, the turn's end) of
// run n and acknowledges its events; it returns the turn.start's command.
func warmTurn(t *testing.T, e *testEnv, seq *uint64, n int) *prpv1.Command {
	t.Helper()
	cs := &cmdSeq{t: t, runID: "run-" + strconv.Itoa(n), attempt: 1, seq: *seq}
	e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: cs.attach("attach-" + strconv.Itoa(n))}})
	turn := cs.next("turn-start-"+strconv.Itoa(n), CmdTurnStart, map[string]any{"text": "hello"})
	terminals := len(e.gw.eventsOf("run.terminal"))
	res := e.gw.command(turn)
	*seq = cs.seq
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	e.prov.last().finish(TurnResult{TurnID: res.GetResult().GetFields()["turnId"].GetStringValue(), Status: "completed"})
	e.gw.waitEvent("run.terminal", terminals+1)
	e.gw.ack(e.gw.maxSeq())
	return turn
}

// TestP4_TurnAfterTurnTheStateDocumentIsRewrittenAboutOnceASecond: warm
// turns that follow one another save their ends in the state document at
// most once per TurnSnapshotEvery (here 1 s, the default), not once a turn
// (each rewrite is a temporary file, two fsyncs and a rename); once the
// turns stop, the document catches up with the last one.
func TestP4_TurnAfterTurnTheStateDocumentIsRewrittenAboutOnceASecond(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var (
		mu    sync.Mutex
		saves int
	)
	e.start(func(c *Config) {
		c.StateSaved = func(*runnerstate.State) {
			mu.Lock()
			saves++
			mu.Unlock()
		}
	})
	e.gw.waitConns(1)
	var seq uint64
	warmTurn(t, e, &seq, 1) // the provider starts (its process and thread are saved)
	e.gw.ping(1)
	mu.Lock()
	before := saves
	mu.Unlock()
	const turns = 20
	began := time.Now()
	for n := 2; n <= turns+1; n++ {
		warmTurn(t, e, &seq, n)
	}
	e.gw.ping(2) // the loop handled the last acknowledgement
	elapsed := time.Since(began)
	mu.Lock()
	during := saves - before
	mu.Unlock()
	t.Logf("%d turns in %s: %d snapshots", turns, elapsed.Round(time.Millisecond), during)
	// At most one per started second, and one more for the first turn's
	// end (acknowledged after the test's ping).
	assert.LessOrEqual(t, during, int(elapsed/time.Second)+2, "snapshots during %d turns in %s", turns, elapsed)
	assert.Less(t, during, turns, "fewer snapshots than turns")
	require.Eventually(t, func() bool {
		st := e.document()
		return st.ActiveTurn == nil && statusIn(st, "turn-start-"+strconv.Itoa(turns+1)) == runnerstate.StatusCompleted
	}, 5*time.Second, 5*time.Millisecond, "the document catches up once the turns stop")
}

// TestR8_RunnerdKilledSeveralTurnsAfterItsLastSnapshotRunsNoTurnAgain: a
// runnerd killed after several warm turns none of whose ends reached the
// state document (their commands and outcomes are in the intent log, their
// ends in the outbox) — with the last turn ended, or still running —
// leaves a state dir from which the relaunched runnerd starts none of
// those turns again: every resent command gets its stored answer, no turn
// ends twice, the running turn goes on, and source seqs go on after the
// journaled ones.
func TestR8_RunnerdKilledSeveralTurnsAfterItsLastSnapshotRunsNoTurnAgain(t *testing.T) {
	t.Parallel()
	for _, moment := range []string{"after the last turn's end", "during the last turn"} {
		t.Run(moment, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t)
			runnerDir := filepath.Join(e.stateDir, "runner")
			crashed := filepath.Join(t.TempDir(), "runner")
			first := e.start(func(c *Config) { c.TurnSnapshotEvery = time.Hour })
			e.gw.waitConns(1)
			var seq uint64
			var cmds []*prpv1.Command
			cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
			attachAndTurn(t, e, cs).finish(TurnResult{TurnID: "turn-1", Status: "completed"})
			seq = cs.seq
			e.gw.waitEvent("run.terminal", 1)
			e.gw.ack(e.gw.maxSeq())
			// The first turn's end is saved (no snapshot for an hour
			// before it).
			require.Eventually(t, func() bool { return statusIn(e.document(), "c-turn1") == runnerstate.StatusCompleted },
				5*time.Second, 5*time.Millisecond)
			const ended = 5
			for n := 2; n <= ended+1; n++ {
				cmds = append(cmds, warmTurn(t, e, &seq, n))
			}
			terminals := ended + 1
			var running *prpv1.Command
			runningTurn := ""
			if moment == "during the last turn" {
				n := ended + 2
				rs := &cmdSeq{t: t, runID: "run-" + strconv.Itoa(n), attempt: 1, seq: seq}
				e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: rs.attach("attach-" + strconv.Itoa(n))}})
				running = rs.next("turn-start-"+strconv.Itoa(n), CmdTurnStart, map[string]any{"text": "hello"})
				res := e.gw.command(running)
				require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
				runningTurn = res.GetResult().GetFields()["turnId"].GetStringValue()
				seq = rs.seq
			}
			doc := e.document()
			for _, c := range cmds {
				assert.Equal(t, "absent", statusIn(doc, c.GetCommandId()), "no snapshot holds %s", c.GetCommandId())
			}
			// runnerd is killed here: its state dir as it was then is what
			// the relaunched one finds, and nothing it sent afterwards
			// (its exit's) reached the controller.
			copyDir(t, runnerDir, crashed)
			maxSeq := e.gw.maxSeq()
			e.gw.mu.Lock()
			sent := len(e.gw.events)
			e.gw.mu.Unlock()
			first.stop(t)
			e.gw.mu.Lock()
			e.gw.events = e.gw.events[:sent]
			e.gw.results = nil
			e.gw.mu.Unlock()
			require.NoError(t, os.RemoveAll(runnerDir))
			copyDir(t, crashed, runnerDir)
			st := e.state()
			for _, c := range cmds {
				assert.Equal(t, runnerstate.StatusCompleted, statusIn(st, c.GetCommandId()), "the intent log holds %s", c.GetCommandId())
			}
			startsBefore := turnStarts(e)
			e.prov.mu.Lock()
			e.prov.history = map[string]string{}
			if running != nil {
				e.prov.history[runningTurn] = "inProgress" // the provider's thread has it running
				e.prov.lastTurn = runningTurn
			}
			e.prov.mu.Unlock()

			e.start(nil)
			e.gw.waitConns(2)
			for _, c := range cmds {
				res := e.gw.command(c)
				assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), "%s: %s", c.GetCommandId(), res.GetMessage())
			}
			if running != nil {
				e.gw.waitEvent("runner.reconciled", 1)
				res := e.gw.command(running)
				require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
			}
			e.gw.ping(2)
			assert.Equal(t, startsBefore, turnStarts(e), "no turn started again")
			st = e.state()
			if running == nil {
				assert.Nil(t, st.ActiveTurn, "every turn had ended")
			} else {
				require.NotNil(t, st.ActiveTurn, "the running turn goes on")
				assert.Equal(t, running.GetCommandId(), st.ActiveTurn.CommandID)
				e.prov.last().finish(TurnResult{TurnID: st.ActiveTurn.TurnID, Status: "completed"})
				terminals++
				e.gw.waitEvent("run.terminal", terminals)
			}
			// A next turn runs once and ends once, its events after the
			// journaled ones.
			warmTurn(t, e, &seq, 100)
			terminals++
			e.gw.ping(3)
			for _, ev := range e.gw.eventsOf("run.terminal") {
				if ev.GetRunId() == "run-100" {
					assert.Greater(t, ev.GetSourceSeq(), maxSeq, "source seqs go on after the journaled ones")
				}
			}
			n := 0
			for _, rx := range e.gw.distinct() {
				if rx.ev.GetEventType() == "run.terminal" {
					n++
				}
			}
			assert.Equal(t, terminals, n, "each turn ends once")
			assert.Equal(t, startsBefore+1, turnStarts(e))
		})
	}
}
