package statedir

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/runnerstate"
)

func intent(id string, seq uint64) Intent {
	return Intent{CommandID: id, ControllerSeq: seq, CommandType: "turn.start", RunID: "run-1", Attempt: 2,
		Fingerprint: "fp-" + id, ReceivedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func TestR4_IntentLogAppendsDurablyAndDropsATornTail(t *testing.T) {
	dir := t.TempDir()
	l, ins, err := OpenIntentLog(dir)
	require.NoError(t, err)
	assert.Empty(t, ins)
	require.NoError(t, l.Append(intent("a", 1), intent("b", 2)))
	require.NoError(t, l.Append(intent("c", 3)))
	require.NoError(t, l.Close())
	f, err := os.OpenFile(filepath.Join(dir, IntentLogFile), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`deadbeef {"commandId":"torn`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	read, err := ReadIntentLog(dir)
	require.NoError(t, err)
	assert.Len(t, read, 3)
	l, ins, err = OpenIntentLog(dir)
	require.NoError(t, err)
	require.Len(t, ins, 3)
	assert.Equal(t, intent("b", 2), ins[1])
	require.NoError(t, l.Append(intent("d", 4)), "appends go after the dropped tail")
	read, err = ReadIntentLog(dir)
	require.NoError(t, err)
	assert.Len(t, read, 4)
	require.NoError(t, l.Reset())
	assert.Zero(t, l.Size())
	require.NoError(t, l.Append(intent("e", 5)))
	require.NoError(t, l.Close())
	read, err = ReadIntentLog(dir)
	require.NoError(t, err)
	assert.Equal(t, []Intent{intent("e", 5)}, read)
	fi, err := os.Stat(filepath.Join(dir, IntentLogFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

// A saved state covers the intents up to its lastControllerCommandSeq;
// the others come back as pending records with the cursor and attempts
// they moved.
func TestR4_ReplayIntentsRestoresWhatTheStateDoesNotCover(t *testing.T) {
	st := runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: "r"})
	st.LastControllerCommandSeq = 2
	st.ProcessedCommands["b"] = &runnerstate.CommandRecord{CommandID: "b", ControllerSeq: 2, Status: runnerstate.StatusCompleted}
	st.HighestAttempts["run-1"] = 1
	n := ReplayIntents(st, []Intent{intent("a", 1), intent("b", 2), intent("c", 3), intent("d", 4)})
	assert.Equal(t, 2, n)
	assert.Equal(t, uint64(4), st.LastControllerCommandSeq)
	assert.Equal(t, uint64(2), st.HighestAttempts["run-1"])
	assert.Nil(t, st.ProcessedCommands["a"], "covered by the state (and pruned from it): not resurrected")
	assert.Equal(t, runnerstate.StatusCompleted, st.ProcessedCommands["b"].Status)
	assert.Equal(t, runnerstate.StatusPending, st.ProcessedCommands["c"].Status)
	assert.Equal(t, "fp-d", st.ProcessedCommands["d"].Fingerprint)
}

// outcome is the outcome record of command id (seq) completed by turnID,
// with the state it left: run-1 attached, turnID active.
func outcome(id string, seq, outcomeSeq uint64, turnID string) Intent {
	in := intent(id, seq)
	rec := &runnerstate.CommandRecord{CommandID: id, ControllerSeq: seq, CommandType: in.CommandType, RunID: in.RunID,
		Attempt: in.Attempt, Fingerprint: in.Fingerprint, ReceivedAt: in.ReceivedAt, Status: runnerstate.StatusCompleted,
		Result: map[string]any{"turnId": turnID}}
	in.Outcomes = &runnerstate.OutcomeBatch{Seq: outcomeSeq, Commands: []*runnerstate.CommandRecord{rec},
		CurrentRun: &runnerstate.RunRef{RunID: "run-1", Attempt: 2}, ActiveTurn: &runnerstate.Turn{TurnID: turnID, RunID: "run-1", Attempt: 2, CommandID: id},
		LastTurnID: turnID}
	return in
}

// TestR8_AnOutcomeRecordCompletesItsReplayedCommand: an outcome record the
// state does not cover completes its command (a resent one gets the stored
// answer) and restores the state the command left; it survives the log's
// framing and a torn tail after it.
func TestR8_AnOutcomeRecordCompletesItsReplayedCommand(t *testing.T) {
	dir := t.TempDir()
	l, _, err := OpenIntentLog(dir)
	require.NoError(t, err)
	require.NoError(t, l.Append(intent("a", 1)))
	require.NoError(t, l.Append(outcome("a", 1, 1, "turn-1")))
	require.NoError(t, l.Append(intent("b", 2)))
	require.NoError(t, l.Close())
	f, err := os.OpenFile(filepath.Join(dir, IntentLogFile), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`deadbeef {"commandId":"b","outcomes":{"seq":2`) // torn: b's outcome never became durable
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, ins, err := OpenIntentLog(dir)
	require.NoError(t, err)
	require.Len(t, ins, 3)
	st := runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: "r"})
	assert.Equal(t, 3, ReplayIntents(st, ins))
	a := st.ProcessedCommands["a"]
	require.NotNil(t, a)
	assert.Equal(t, runnerstate.StatusCompleted, a.Status)
	assert.Equal(t, "turn-1", a.Result["turnId"])
	assert.Equal(t, runnerstate.StatusPending, st.ProcessedCommands["b"].Status, "no outcome: pending (settled by the recovery)")
	require.NotNil(t, st.ActiveTurn)
	assert.Equal(t, "turn-1", st.ActiveTurn.TurnID)
	assert.Equal(t, "run-1", st.CurrentRun.RunID)
	assert.Equal(t, uint64(1), st.LastOutcomeSeq)
	assert.Equal(t, uint64(2), st.LastControllerCommandSeq)

	// The state saved from it covers the record.
	b, err := runnerstate.Encode(st)
	require.NoError(t, err)
	saved, err := runnerstate.Decode(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), saved.LastOutcomeSeq)
	assert.Equal(t, runnerstate.StatusCompleted, saved.ProcessedCommands["a"].Status)
}

// TestR8_AnOutcomeRecordTheDocumentCoversIsNotAppliedAgain: a crash while
// the log is emptied (the truncation is not synced) may leave records a
// saved document covers: they change nothing — the document's later state
// (the turn ended, a later command's outcome) stands.
func TestR8_AnOutcomeRecordTheDocumentCoversIsNotAppliedAgain(t *testing.T) {
	st := runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: "r"})
	st.LastControllerCommandSeq = 3
	st.LastOutcomeSeq = 2
	st.LastTurnID = "turn-2"
	st.CurrentRun = &runnerstate.RunRef{RunID: "run-2", Attempt: 1}
	st.ProcessedCommands["a"] = &runnerstate.CommandRecord{CommandID: "a", ControllerSeq: 1, Status: runnerstate.StatusCompleted,
		Result: map[string]any{"turnId": "turn-1"}}
	st.ProcessedCommands["c"] = &runnerstate.CommandRecord{CommandID: "c", ControllerSeq: 3, Status: runnerstate.StatusCompleted,
		Result: map[string]any{"turnId": "turn-2"}}
	logged := []Intent{intent("a", 1), outcome("a", 1, 1, "turn-1"), intent("c", 3), outcome("c", 3, 2, "turn-2")}
	for _, ins := range [][]Intent{logged, logged[:2], nil} { // whole, partly truncated, emptied
		cp := *st
		assert.Zero(t, ReplayIntents(&cp, ins))
		assert.Nil(t, cp.ActiveTurn, "the turns ended after the records")
		assert.Equal(t, "run-2", cp.CurrentRun.RunID)
		assert.Equal(t, "turn-2", cp.LastTurnID)
		assert.Equal(t, uint64(2), cp.LastOutcomeSeq)
	}
}
