package statedir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tether-run/tether/pkg/runnerstate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rec(seq uint64) Record {
	return Record{SourceSeq: seq, Priority: 1, EventType: "item.delta",
		Envelope: json.RawMessage(fmt.Sprintf(`{"sourceSeq":"%d","payload":{"x":"%s"}}`, seq, strings.Repeat("y", 100)))}
}

func TestR4_OutboxTornTailIsTruncated(t *testing.T) {
	dir := t.TempDir()
	o, dropped, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	assert.Zero(t, dropped)
	require.NoError(t, o.Append(rec(1), rec(2)))
	require.NoError(t, o.Append(rec(3)))
	assert.Error(t, o.Append(rec(3)), "seqs must increase")
	require.NoError(t, o.Close())

	path := filepath.Join(dir, OutboxFile)
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	for name, tail := range map[string]string{
		"partial line": `12345678 {"sourceSeq":4,"env`,
		"bad crc":      "00000000 " + `{"sourceSeq":4,"priority":1,"eventType":"x","envelope":{}}` + "\n",
		"garbage":      "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, append(append([]byte(nil), good...), tail...), 0o600))
			o, dropped, err := OpenOutbox(dir, 1)
			require.NoError(t, err)
			defer o.Close()
			assert.Equal(t, int64(len(tail)), dropped)
			assert.Equal(t, uint64(3), o.LastSeq())
			recs := o.After(0)
			require.Len(t, recs, 2, "records at or below the acked seq are not live")
			assert.Equal(t, uint64(2), recs[0].SourceSeq)
			assert.JSONEq(t, string(rec(2).Envelope), string(recs[0].Envelope))
			// Appending after the truncation continues cleanly.
			require.NoError(t, o.Append(rec(4)))
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, string(good), string(b[:len(good)]))
		})
	}
}

// A batch is appended with one write, which a kill -9 can cut between
// pages: the records of a batch whose last record is missing were never
// fsynced nor sent, and the provider cursor their batch carried on its last
// record is lost. They are dropped, so the provider lines behind them are
// replayed once from the cursor that was journaled (a kept record would be
// sent and its line's events journaled again: the same delta twice).
func TestR1_OutboxDropsTheRecordsOfABatchCutShort(t *testing.T) {
	dir := t.TempDir()
	o, _, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	withCursor := func(r Record, c uint64) Record { r.ProviderCursor = c; return r }
	require.NoError(t, o.Append(rec(1), withCursor(rec(2), 7)))
	require.NoError(t, o.Append(rec(3)))
	require.NoError(t, o.Close())
	path := filepath.Join(dir, OutboxFile)
	good, err := os.ReadFile(path)
	require.NoError(t, err)

	// The first two of a three-record batch reached the file.
	var torn []byte
	for _, r := range []Record{rec(4), rec(5)} {
		line, err := encodeLine(r)
		require.NoError(t, err)
		torn = append(torn, line...)
	}
	require.NoError(t, os.WriteFile(path, append(append([]byte(nil), good...), torn...), 0o600))
	o, dropped, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(len(torn)), dropped)
	assert.Equal(t, uint64(3), o.LastSeq())
	assert.Equal(t, uint64(7), o.ProviderCursor())
	require.Len(t, o.After(0), 3)
	require.NoError(t, o.Append(rec(4), withCursor(rec(5), 9), rec(6)))
	require.NoError(t, o.Close())
	o, dropped, err = OpenOutbox(dir, 0)
	require.NoError(t, err)
	defer o.Close()
	assert.Zero(t, dropped, "a whole batch is kept")
	assert.Equal(t, uint64(6), o.LastSeq())
	assert.Equal(t, uint64(9), o.ProviderCursor())

	// A log written before batch ends were marked is kept whole.
	legacy := t.TempDir()
	var b []byte
	for _, r := range []Record{rec(1), rec(2)} {
		line, err := encodeLine(r)
		require.NoError(t, err)
		b = append(b, line...)
	}
	require.NoError(t, os.WriteFile(filepath.Join(legacy, OutboxFile), b, 0o600))
	lo, dropped, err := OpenOutbox(legacy, 0)
	require.NoError(t, err)
	defer lo.Close()
	assert.Zero(t, dropped)
	assert.Len(t, lo.After(0), 2)
}

func TestR4_OutboxTrimCompactsAtomically(t *testing.T) {
	dir := t.TempDir()
	o, _, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	var seq uint64
	for o.FileSize() < compactMinBytes+4096 {
		seq++
		require.NoError(t, o.Append(rec(seq)))
	}
	require.NoError(t, o.Trim(seq-2))
	assert.Equal(t, 2, o.Len())
	assert.Less(t, o.FileSize(), int64(4096), "compacted")
	require.NoError(t, o.Append(rec(seq+1)))
	require.NoError(t, o.Close())

	o, dropped, err := OpenOutbox(dir, seq-2)
	require.NoError(t, err)
	defer o.Close()
	assert.Zero(t, dropped)
	assert.Equal(t, 3, o.Len())
	assert.Equal(t, seq+1, o.LastSeq())
	fi, err := os.Stat(filepath.Join(dir, OutboxFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temp files left behind")
}

func TestR4_StateSaveIsAtomicPrivateAndBounded(t *testing.T) {
	base := t.TempDir()
	s, err := OpenStore(filepath.Join(base, "state"))
	require.NoError(t, err)
	st, err := s.Load()
	require.NoError(t, err)
	assert.Nil(t, st)
	st = runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: "r", SessionScope: "s", NormalizedSessionID: "n", EnvironmentLeaseID: "e"})
	for i := 1; i <= runnerstate.MaxProcessedCommands+10; i++ {
		id := fmt.Sprintf("c%d", i)
		st.ProcessedCommands[id] = &runnerstate.CommandRecord{CommandID: id, ControllerSeq: uint64(i), Status: runnerstate.StatusCompleted}
	}
	require.NoError(t, s.Save(st))
	got, err := s.Load()
	require.NoError(t, err)
	assert.Len(t, got.ProcessedCommands, runnerstate.MaxProcessedCommands)
	assert.NotContains(t, got.ProcessedCommands, "c10")
	assert.Contains(t, got.ProcessedCommands, "c11")
	fi, err := os.Stat(filepath.Join(s.Dir, runnerstate.StateFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	ents, err := os.ReadDir(s.Dir)
	require.NoError(t, err)
	assert.Len(t, ents, 1)

	// Symlinked state dirs fail closed.
	require.NoError(t, os.Symlink(filepath.Join(base, "state"), filepath.Join(base, "link")))
	_, err = OpenStore(filepath.Join(base, "link"))
	assert.Error(t, err)
}

// A warm runner serves run after run: only the most recent runnerstate.MaxTrackedRuns
// runs' highest attempts are kept, in first-seen order, across a save.
func TestR4_HighestAttemptsAreBoundedToTheRecentRuns(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	st := runnerstate.NewState(runnerstate.Identity{RunnerInstanceID: "r", EnvironmentLeaseID: "l", NormalizedSessionID: "s"})
	for i := 0; i < runnerstate.MaxTrackedRuns+44; i++ {
		st.NoteAttempt(fmt.Sprintf("run-%03d", i), 1)
	}
	st.NoteAttempt("run-299", 2) // an existing run moves its attempt, not its place
	require.Len(t, st.HighestAttempts, runnerstate.MaxTrackedRuns)
	require.NotContains(t, st.HighestAttempts, "run-043", "the oldest runs are forgotten")
	require.Contains(t, st.HighestAttempts, "run-044")
	require.EqualValues(t, 2, st.HighestAttempts["run-299"])
	require.NoError(t, s.Save(st))
	back, err := s.Load()
	require.NoError(t, err)
	require.Equal(t, st.HighestAttempts, back.HighestAttempts)
	require.Equal(t, st.AttemptRuns, back.AttemptRuns)

	// A document written before the order was kept gets one on load.
	back.AttemptRuns = nil
	require.NoError(t, s.Save(back))
	old, err := s.Load()
	require.NoError(t, err)
	require.Len(t, old.AttemptRuns, runnerstate.MaxTrackedRuns)
	old.NoteAttempt("run-new", 1)
	require.Len(t, old.HighestAttempts, runnerstate.MaxTrackedRuns)
}

// A provider host mark no journaled event carries (it arrived after its
// line's events were appended, or its line had none) is journaled on its
// own, and survives a reopen and a compaction that drops every record
// carrying a cursor: a restarted runnerd resumes the host after it and
// never journals a line's events twice.
func TestR4_OutboxKeepsTheProviderCursorNoEventCarries(t *testing.T) {
	dir := t.TempDir()
	o, _, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	withCursor := func(r Record, c uint64) Record { r.ProviderCursor = c; return r }
	require.NoError(t, o.Append(rec(1), withCursor(rec(2), 7)))
	require.NoError(t, o.Append(rec(3))) // line 8's events; its mark not yet here
	require.NoError(t, o.MarkCursor(8))  // the mark, on its own
	require.NoError(t, o.MarkCursor(6), "an older mark changes nothing")
	require.NoError(t, o.Close())

	o, dropped, err := OpenOutbox(dir, 0)
	require.NoError(t, err)
	assert.Zero(t, dropped)
	assert.Equal(t, uint64(8), o.ProviderCursor())
	assert.Equal(t, uint64(3), o.LastSeq())
	require.Len(t, o.After(0), 3, "a cursor record is no event")
	require.NoError(t, o.Append(rec(4)))

	// Every record is acknowledged and compacted away: the cursor stays.
	o.Forget(4)
	require.NoError(t, o.Compact())
	require.NoError(t, o.Close())
	o, dropped, err = OpenOutbox(dir, 4)
	require.NoError(t, err)
	defer o.Close()
	assert.Zero(t, dropped)
	assert.Equal(t, uint64(8), o.ProviderCursor())
	assert.Zero(t, o.Len())
	require.NoError(t, o.Append(rec(5)), "appends go on after a cursor record")
}

// TestP4_TheOutboxSyncsEachAppendWithOneFdatasync counts the data syncs of
// three appends: one fdatasync each, as the intent log's (the outbox used a
// full fsync, which also journals the timestamps, on a warm turn's path).
func TestP4_TheOutboxSyncsEachAppendWithOneFdatasync(t *testing.T) {
	o, _, err := OpenOutbox(t.TempDir(), 0)
	require.NoError(t, err)
	defer o.Close()
	before := dataSyncs.Load()
	for seq := uint64(1); seq <= 3; seq++ {
		require.NoError(t, o.Append(rec(seq)))
	}
	assert.Equal(t, int64(3), dataSyncs.Load()-before)
}
