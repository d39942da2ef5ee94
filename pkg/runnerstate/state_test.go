package runnerstate

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The command journal encodes exactly as encoding/json encodes the plain
// map (sorted keys, escaped strings), whether a record's encoding is
// cached (final records) or not (pending ones), and decodes back.
func TestR4_CommandJournalEncodesLikeAPlainMap(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	j := CommandJournal{
		"b<&>": {CommandID: "b<&>", ControllerSeq: 2, CommandType: "turn.start", Status: StatusCompleted,
			Result: map[string]any{"turnId": "t-1", "n": 1.5, "nested": map[string]any{"z": true, "a": nil}}, ReceivedAt: at},
		"a": {CommandID: "a", ControllerSeq: 1, CommandType: "run.attach", Status: StatusPending, Code: "execution_indeterminate", ReceivedAt: at},
		"c": {CommandID: "c", ControllerSeq: 3, CommandType: "turn.steer", Status: StatusRejected, Code: "no_active_turn", Message: "no turn", ReceivedAt: at},
	}
	plain := map[string]*CommandRecord(j)
	want, err := json.Marshal(plain)
	require.NoError(t, err)
	for i := 0; i < 2; i++ { // the second time from the cache
		got, err := json.Marshal(j)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got))
	}
	assert.NotNil(t, j["b<&>"].encoded, "a final record's encoding is cached")
	assert.Nil(t, j["a"].encoded, "a pending record is encoded each time")

	// The pending record completes: its new outcome is encoded.
	j["a"].Status, j["a"].Code, j["a"].Result = StatusCompleted, "", map[string]any{"runId": "r"}
	want, err = json.Marshal(plain)
	require.NoError(t, err)
	got, err := json.Marshal(j)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
	assert.Contains(t, string(got), `"runId":"r"`)

	var back CommandJournal
	require.NoError(t, json.Unmarshal(got, &back))
	assert.Equal(t, StatusCompleted, back["a"].Status)
	assert.Equal(t, "t-1", back["b<&>"].Result["turnId"])

	empty, err := json.Marshal(struct {
		J CommandJournal `json:"j,omitempty"`
	}{J: CommandJournal{}})
	require.NoError(t, err)
	assert.Equal(t, `{}`, string(empty))
}

// Encode writes the same document encoding/json would (the journal's
// place among the fields aside), and Decode reads it back.
func TestR4_EncodedStateLoadsBack(t *testing.T) {
	st := NewState(Identity{RunnerInstanceID: "r", SessionScope: "s", NormalizedSessionID: "n"})
	st.ProcessedCommands["c1"] = &CommandRecord{CommandID: "c1", ControllerSeq: 1, CommandType: "run.attach", Status: StatusCompleted,
		Result: map[string]any{"runId": "run-1"}}
	st.HighestAttempts["run-1"] = 2
	b, err := Encode(st)
	require.NoError(t, err)
	var generic, viaJSON map[string]any
	require.NoError(t, json.Unmarshal(b, &generic))
	plain, err := json.Marshal(st)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(plain, &viaJSON))
	assert.Equal(t, viaJSON, generic)

	back, err := Decode(b)
	require.NoError(t, err)
	assert.Equal(t, "run-1", back.ProcessedCommands["c1"].Result["runId"])
	assert.Equal(t, uint64(2), back.HighestAttempts["run-1"])

	empty := NewState(Identity{RunnerInstanceID: "r"})
	b, err = Encode(empty)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "processedCommands")
	assert.True(t, json.Valid(b))
}
