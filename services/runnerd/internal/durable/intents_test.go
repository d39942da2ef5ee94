package durable

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
