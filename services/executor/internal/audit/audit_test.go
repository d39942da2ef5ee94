package audit

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// history is a healthy history of three runs: r1 succeeded on attempt 1,
// r2 was taken over and succeeded on attempt 2 (with a cancellation
// recorded and acknowledged once), r3 is still running.
type history struct {
	runs   []Run
	events []Event
	acts   []Activity
}

func healthy() *history {
	h := &history{runs: []Run{
		{ID: "r1", State: "succeeded", Attempt: 1, EventCount: 4},
		{ID: "r2", State: "cancelled", Attempt: 2, EventCount: 5},
		{ID: "r3", State: "running", Attempt: 1, EventCount: 2},
	}}
	ev := func(run string, seq, writer uint64, typ string) Event {
		return Event{RunID: run, Seq: seq, Type: typ, Writer: writer}
	}
	exec := func(run string, seq, writer uint64, cmd string) Event {
		e := ev(run, seq, writer, EventCommandExecuted)
		e.CommandID, e.CommandType = cmd, CommandTurnStart
		return e
	}
	h.events = []Event{
		ev("r1", 1, 1, "run.attached"), exec("r1", 2, 1, "r1/turn/0"), ev("r1", 3, 1, "turn.started"), ev("r1", 4, 1, EventTerminal),
		ev("r2", 1, 1, "run.attached"), exec("r2", 2, 1, "r2/turn/0"), ev("r2", 3, 2, "run.attached"), ev("r2", 4, 2, "turn.interrupted"),
		ev("r2", 5, 2, EventTerminal),
		ev("r3", 2, 1, "turn.started"), exec("r3", 1, 1, "r3/turn/0"), // any order
	}
	h.acts = []Activity{{RunID: "r2", Action: ActionCancellationIntent}, {RunID: "r2", Action: ActionCancellationAck}, {RunID: "r2", Action: "other.action"}}
	return h
}

func (h *history) check() Report {
	return Check(History{Runs: h.runs, Events: h.events, Activities: h.acts})
}

func (h *history) event(run string, seq uint64) *Event {
	for i := range h.events {
		if h.events[i].RunID == run && h.events[i].Seq == seq {
			return &h.events[i]
		}
	}
	panic("no such event")
}

func requireOnly(t *testing.T, rep Report, class, runID string) {
	t.Helper()
	require.False(t, rep.Clean())
	for _, v := range rep.Violations {
		require.Equal(t, class, v.Class, "%+v", v)
		require.Equal(t, runID, v.RunID, "%+v", v)
		require.NotEmpty(t, v.Detail)
	}
	require.Equal(t, len(rep.Violations), rep.ByClass[class])
}

func TestX1_AHealthyHistoryIsClean(t *testing.T) {
	rep := healthy().check()
	require.True(t, rep.Clean(), "%+v", rep.Violations)
	require.Equal(t, 3, rep.Runs)
	require.Equal(t, 11, rep.Events)
	require.Equal(t, map[string]int{"succeeded": 1, "cancelled": 1, "running": 1}, rep.Outcomes)
	for _, c := range Classes {
		require.Contains(t, rep.ByClass, c)
	}
	var buf bytes.Buffer
	rep.WriteText(&buf)
	require.Contains(t, buf.String(), "audit: clean")
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(b), `"violations":[]`)
}

func TestX1_ARunMustEndWithExactlyOneTerminal(t *testing.T) {
	h := healthy()
	h.event("r1", 4).Type = "turn.completed" // ended without run.terminal
	requireOnly(t, h.check(), ClassTerminal, "r1")

	h = healthy()
	h.events = append(h.events, Event{RunID: "r3", Seq: 3, Type: EventTerminal, Writer: 1}) // not ended, has one
	h.runs[2].EventCount = 3
	requireOnly(t, h.check(), ClassTerminal, "r3")
}

func TestX1_SeqsMustBeContiguousAndCounted(t *testing.T) {
	h := healthy()
	h.event("r3", 2).Seq = 3
	rep := h.check()
	requireOnly(t, rep, ClassSeqGap, "r3")
	require.EqualValues(t, 3, rep.Violations[0].Seq)

	h = healthy()
	h.runs[0].EventCount = 5
	requireOnly(t, h.check(), ClassSeqGap, "r1")
}

func TestX1_NoEventMayFollowTheTerminal(t *testing.T) {
	h := healthy()
	// The defect: harness.exited after run.terminal, writer 0.
	h.events = append(h.events, Event{RunID: "r1", Seq: 5, Type: "harness.exited", Writer: 1})
	h.runs[0].EventCount = 5
	rep := h.check()
	requireOnly(t, rep, ClassAfterTerminal, "r1")
	require.Contains(t, rep.Violations[0].Detail, "harness.exited")
}

func TestX1_WriterAttemptsNeverDecreaseAndTheTerminalComesFromTheFinalAttempt(t *testing.T) {
	h := healthy()
	h.event("r2", 4).Writer = 1 // a stale attempt wrote after attempt 2
	requireOnly(t, h.check(), ClassWriterAttempt, "r2")

	h = healthy()
	h.event("r3", 2).Writer = 2 // above the run's attempt
	requireOnly(t, h.check(), ClassWriterAttempt, "r3")

	h = healthy()
	h.runs[1].Attempt = 3 // a third attempt was claimed, the terminal is from the second
	requireOnly(t, h.check(), ClassTerminalAttempt, "r2")
}

func TestX1_ATurnCommandIsExecutedAtMostOnce(t *testing.T) {
	h := healthy()
	// A takeover re-executed the turn.start of r2's first attempt.
	e := h.event("r2", 3)
	e.Type, e.CommandID, e.CommandType = EventCommandExecuted, "r2/turn/0", CommandTurnStart
	rep := h.check()
	requireOnly(t, rep, ClassTurnTwice, "r2")
	require.Contains(t, rep.Violations[0].Detail, "r2/turn/0")

	// Other commands' executions are not turn starts.
	h = healthy()
	e = h.event("r2", 3)
	e.Type, e.CommandID, e.CommandType = EventCommandExecuted, "r2/turn/0", "turn.steer"
	require.True(t, h.check().Clean())
}

// SPEC X1, R7: a provider turn's end is reported once in its run: a second
// turn.<status> for the same turn (a reconciliation after a runnerd loss
// reporting again an end already stored) is a violation; distinct turns,
// and the same turn id in another run, are not.
func TestX1_AProviderTurnEndsWithOneTurnEventPerRun(t *testing.T) {
	end := func(h *history, run string, seq uint64, typ, turnID string) {
		e := h.event(run, seq)
		e.Type, e.TurnID, e.CommandID, e.CommandType = typ, turnID, "", ""
	}
	for _, tc := range []struct {
		name         string
		second, turn string // r1 seq 3's type and turn (seq 2 is turn-1's turn.completed)
		violation    bool
	}{
		{"the live event reported again", "turn.completed", "turn-1", true},
		{"ended again with another status", "turn.failed", "turn-1", true},
		{"interrupted, then completed", "turn.interrupted", "turn-1", true},
		{"two turns of the run", "turn.completed", "turn-2", false},
		{"an end without a turn id", "turn.completed", "", false},
		{"a turn's start is not its end", "turn.started", "turn-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := healthy()
			end(h, "r1", 2, "turn.completed", "turn-1")
			end(h, "r1", 3, tc.second, tc.turn)
			rep := h.check()
			if !tc.violation {
				require.True(t, rep.Clean(), "%+v", rep.Violations)
				return
			}
			requireOnly(t, rep, ClassTurnEventTwice, "r1")
			require.Len(t, rep.Violations, 1)
			require.EqualValues(t, 3, rep.Violations[0].Seq, "the second end is the violation")
			require.Contains(t, rep.Violations[0].Detail, "turn-1")
			var buf bytes.Buffer
			rep.WriteText(&buf)
			require.Contains(t, buf.String(), "VIOLATION "+ClassTurnEventTwice+" run=r1 seq=3")
		})
	}

	// A later turn the provider gave the same id (a restarted provider
	// numbering its turns anew) starts between the two ends: each end is
	// its own turn's. Without the start between, the second is a
	// violation.
	h := healthy()
	h.runs[0].EventCount = 5
	h.events = append(h.events, Event{RunID: "r1", Seq: 5, Type: EventTerminal, Writer: 1})
	end(h, "r1", 2, "turn.completed", "turn-1")
	end(h, "r1", 3, "turn.started", "turn-1")
	end(h, "r1", 4, "turn.completed", "turn-1")
	require.True(t, h.check().Clean(), "%+v", h.check().Violations)
	end(h, "r1", 3, "item.completed", "")
	requireOnly(t, h.check(), ClassTurnEventTwice, "r1")

	// The same provider turn id in two runs: each run's history is its own.
	h = healthy()
	end(h, "r1", 3, "turn.completed", "turn-1")
	end(h, "r2", 4, "turn.interrupted", "turn-1")
	require.True(t, h.check().Clean())
}

func TestX1_ACancellationIsRecordedAndAcknowledgedAtMostOnce(t *testing.T) {
	for _, action := range []string{ActionCancellationIntent, ActionCancellationAck} {
		h := healthy()
		h.acts = append(h.acts, Activity{RunID: "r2", Action: action})
		rep := h.check()
		requireOnly(t, rep, ClassCancellationTwice, "r2")
		require.Contains(t, rep.Violations[0].Detail, action)
		var buf bytes.Buffer
		rep.WriteText(&buf)
		require.Contains(t, buf.String(), "VIOLATION "+ClassCancellationTwice+" run=r2")
		require.Contains(t, buf.String(), "audit: 1 violations")
	}
}

func TestF3_AReplaceSessionContinuityBreakIsListedAsLegitimateNotAViolation(t *testing.T) {
	h := healthy()
	h.runs[0].EventCount = 5
	// r1's break comes before its terminal (seq 4, the terminal moves to 5).
	for i := range h.events {
		if h.events[i].RunID == "r1" && h.events[i].Type == EventTerminal {
			h.events[i].Seq = 5
		}
	}
	h.events = append(h.events, Event{RunID: "r1", Seq: 4, Type: EventContinuityBreak, Writer: 1, Detail: "session replaced by alice"})
	rep := h.check()
	require.True(t, rep.Clean(), "%+v", rep.Violations)
	require.Equal(t, []ContinuityBreak{{RunID: "r1", Seq: 4, Detail: "session replaced by alice"}}, rep.ContinuityBreaks)
	var b bytes.Buffer
	rep.WriteText(&b)
	require.Contains(t, b.String(), "continuity break (legitimate) run=r1 seq=4: session replaced by alice")
}

// SPEC G4: a source's events are stored in the order it produced them; a
// later event stored ahead of an earlier one (a re-attachment that got live
// events before the replay) is a violation, each source on its own.
func TestG4_ASourcesEventsStoredOutOfItsOrderAreAViolation(t *testing.T) {
	h := healthy()
	src := func(run string, seq uint64, source string, sourceSeq uint64) {
		e := h.event(run, seq)
		e.Source, e.SourceSeq = source, sourceSeq
	}
	// r1: the runner's events 7, 8, 9 and an executor event of its own
	// numbering in between.
	src("r1", 1, "runner-a", 7)
	src("r1", 2, "executor:control", 1)
	src("r1", 3, "runner-a", 8)
	src("r1", 4, "runner-a", 9)
	require.True(t, h.check().Clean())

	src("r1", 3, "runner-a", 10) // 10 stored before 9
	rep := h.check()
	requireOnly(t, rep, ClassSourceOrder, "r1")
	require.Equal(t, uint64(4), rep.Violations[0].Seq)
	require.Equal(t, 1, rep.ByClass[ClassSourceOrder])
}
