// Package audit checks the executor's durable history for the
// exactly-once promises (SPEC X1): every run ends once, its events form one
// contiguous, fenced sequence that stops at its run.terminal, a runner
// executed each turn command at most once, each provider turn ended with
// one turn event, and a cancellation was recorded and acknowledged at most
// once; and no session is left wedged (its runs all failing while a
// current copy of its thread exists). Check is a pure function over the rows
// the store reads (store.AuditRows); tetherctl audit prints its report.
package audit

import (
	"fmt"
	"io"
	"sort"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/session"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Event types and audit actions the checks read.
const (
	EventTerminal        = prp.EventRunTerminal
	EventCommandExecuted = prp.EventCommandExecuted // runnerd: a command's effect was executed
	CommandTurnStart     = prp.CommandTurnStart
	// EventContinuityBreak: a run applied an operator's ReplaceSession (a
	// fresh provider session). Listed as a legitimate break, never a
	// violation (SPEC F3).
	EventContinuityBreak = session.EventContinuityBreak

	ActionCancellationIntent = store.ActionCancellationIntent
	ActionCancellationAck    = store.ActionCancellationAck
)

// Violation classes.
const (
	// ClassTerminal: a run that ended has no or several run.terminal
	// events, or a run that did not end has one.
	ClassTerminal = "terminal_count"
	// ClassSeqGap: the run-local seqs are not 1..n, or n differs from the
	// run's event count.
	ClassSeqGap = "seq_not_contiguous"
	// ClassAfterTerminal: an event follows the run's run.terminal.
	ClassAfterTerminal = "event_after_terminal"
	// ClassWriterAttempt: a writer attempt lower than an earlier row's, or
	// above the run's attempt.
	ClassWriterAttempt = "writer_attempt_decreased"
	// ClassTerminalAttempt: the run.terminal was not written by the run's
	// final attempt.
	ClassTerminalAttempt = "terminal_not_from_final_attempt"
	// ClassTurnTwice: a turn command id was executed by a runner more than
	// once.
	ClassTurnTwice = "turn_command_executed_twice"
	// ClassTurnEventTwice: a run holds more than one turn end event
	// (turn.completed, turn.failed, turn.interrupted, turn.cancelled) for
	// one provider turn — with no turn.started of that id between them,
	// which would begin a later turn the provider gave the same id: a
	// turn's end was reported again, e.g. by its reconciliation after a
	// runnerd loss (SPEC R7).
	ClassTurnEventTwice = "turn_terminal_event_twice"
	// ClassCancellationTwice: a run's cancellation intent or its
	// acknowledgement was recorded more than once.
	ClassCancellationTwice = "cancellation_recorded_twice"
	// ClassSourceOrder: a source's events are stored in a run out of the
	// order the source produced them (SPEC G4: relayed in order).
	ClassSourceOrder = "source_seq_out_of_order"
	// ClassForeignRunEvent: a run holds a turn of another run that began
	// after that run's runner had reported its run.terminal (a turn.started
	// or a turn command's execution naming the other run, from the same
	// runner at a later source seq): a turn no attempt started, injected
	// (SPEC T4).
	ClassForeignRunEvent = "event_of_another_run"
)

// Classes lists every violation class, in report order.
var Classes = []string{ClassTerminal, ClassSeqGap, ClassAfterTerminal, ClassWriterAttempt, ClassTerminalAttempt,
	ClassTurnTwice, ClassTurnEventTwice, ClassCancellationTwice, ClassSourceOrder, ClassSessionWedged, ClassForeignRunEvent}

// TurnEndTypes are the event types of a provider turn's end (the audit
// reads their turn id).
var TurnEndTypes = prp.TurnEndTypes()

// EventTurnStarted begins a provider turn; the audit reads its turn id too.
const EventTurnStarted = prp.EventTurnStarted

// TurnEventTypes are the event types whose turn id the audit reads: a
// turn's start and its ends.
var TurnEventTypes = append([]string{EventTurnStarted}, TurnEndTypes...)

// IsTurnEnd reports whether typ is one of TurnEndTypes.
func IsTurnEnd(typ string) bool { return prp.IsTurnEnd(typ) }

// Run is one run as stored.
type Run = store.AuditRun

// Event is one event row.
type Event = store.AuditEvent

// ContinuityBreak is a legitimate break of a scope's provider thread: the
// run that applied an operator's ReplaceSession.
type ContinuityBreak struct {
	RunID  string `json:"runId"`
	Seq    uint64 `json:"seq"`
	Detail string `json:"detail"`
}

// Activity is one audit entry of a run.
type Activity = store.AuditActivity

// Violation is one broken promise.
type Violation struct {
	Class  string `json:"class"`
	RunID  string `json:"runId"`
	Seq    uint64 `json:"seq,omitempty"`
	Detail string `json:"detail"`
}

// Report is the audit's outcome.
type Report struct {
	Runs       int         `json:"runs"`
	Events     int         `json:"events"`
	Violations []Violation `json:"violations"`
	// ByClass counts violations per class (every class present).
	ByClass map[string]int `json:"byClass"`
	// Outcomes counts runs per state.
	Outcomes map[string]int `json:"outcomes"`
	// ContinuityBreaks are the recorded ReplaceSession breaks (legitimate;
	// not violations).
	ContinuityBreaks []ContinuityBreak `json:"continuityBreaks"`
}

// Clean reports whether no promise was broken.
func (r Report) Clean() bool { return len(r.Violations) == 0 }

// History is what the audit reads: runs, their events (any order), their
// activities, and the session checkpoints recorded.
type History = store.AuditHistory

// Check audits a history.
func Check(h History) Report {
	runs, events, activities := h.Runs, h.Events, h.Activities
	rep := Report{Runs: len(runs), Events: len(events), Violations: []Violation{}, ByClass: map[string]int{}, Outcomes: map[string]int{},
		ContinuityBreaks: []ContinuityBreak{}}
	for _, c := range Classes {
		rep.ByClass[c] = 0
	}
	add := func(class, runID string, seq uint64, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{Class: class, RunID: runID, Seq: seq, Detail: fmt.Sprintf(format, args...)})
		rep.ByClass[class]++
	}
	byRun := map[string][]Event{}
	for _, e := range events {
		byRun[e.RunID] = append(byRun[e.RunID], e)
	}
	executed := map[string][]string{} // turn command id -> runs that report an execution
	var commandIDs []string
	for _, r := range runs {
		rep.Outcomes[r.State]++
		evs := byRun[r.ID]
		sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
		checkRun(r, evs, add)
		for _, e := range evs {
			if e.Type == EventContinuityBreak {
				rep.ContinuityBreaks = append(rep.ContinuityBreaks, ContinuityBreak{RunID: e.RunID, Seq: e.Seq, Detail: e.Detail})
			}
			if e.Type == EventCommandExecuted && e.CommandType == CommandTurnStart {
				if executed[e.CommandID] == nil {
					commandIDs = append(commandIDs, e.CommandID)
				}
				executed[e.CommandID] = append(executed[e.CommandID], e.RunID)
			}
		}
	}
	for _, id := range commandIDs {
		if n := len(executed[id]); n > 1 {
			add(ClassTurnTwice, executed[id][0], 0, "turn command %s executed %d times", id, n)
		}
	}
	checkForeign(runs, byRun, add)
	checkCancellations(runs, activities, add)
	checkWedged(runs, h.Checkpoints, add)
	return rep
}

type adder func(class, runID string, seq uint64, format string, args ...any)

// checkRun checks one run's events, in seq order.
func checkRun(r Run, evs []Event, add adder) {
	var terminals []Event
	for _, e := range evs {
		if e.Type == EventTerminal {
			terminals = append(terminals, e)
		}
	}
	switch {
	case r.Ended() && len(terminals) != 1:
		add(ClassTerminal, r.ID, 0, "run %s has %d run.terminal events", r.State, len(terminals))
	case !r.Ended() && len(terminals) != 0:
		add(ClassTerminal, r.ID, terminals[0].Seq, "run still %s has %d run.terminal events", r.State, len(terminals))
	}
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			add(ClassSeqGap, r.ID, e.Seq, "event %d of the run has seq %d", i+1, e.Seq)
			break
		}
	}
	if uint64(len(evs)) != r.EventCount {
		add(ClassSeqGap, r.ID, 0, "%d events stored, the run counts %d", len(evs), r.EventCount)
	}
	if len(terminals) > 0 {
		first := terminals[0]
		if last := evs[len(evs)-1]; last.Seq > first.Seq {
			n := 0
			for _, e := range evs {
				if e.Seq > first.Seq {
					n++
				}
			}
			add(ClassAfterTerminal, r.ID, last.Seq, "%d events after run.terminal (seq %d), the last %s", n, first.Seq, last.Type)
		}
		for _, t := range terminals {
			if t.Writer != r.Attempt {
				add(ClassTerminalAttempt, r.ID, t.Seq, "run.terminal written by attempt %d, the run's final attempt is %d", t.Writer, r.Attempt)
			}
		}
	}
	ended := map[string]Event{} // provider turn id -> its first end event
	for _, e := range evs {
		if e.Type == EventTurnStarted && e.TurnID != "" {
			// A later turn of that id (a restarted provider may number
			// its turns anew): its end is its own.
			delete(ended, e.TurnID)
			continue
		}
		if !IsTurnEnd(e.Type) || e.TurnID == "" {
			continue
		}
		if first, ok := ended[e.TurnID]; ok {
			add(ClassTurnEventTwice, r.ID, e.Seq, "turn %s ended again by %s (seq %d); its %s is seq %d", e.TurnID, e.Type, e.Seq, first.Type, first.Seq)
			continue
		}
		ended[e.TurnID] = e
	}
	last := map[string]uint64{}
	for _, e := range evs {
		if e.Source == "" {
			continue
		}
		if l, ok := last[e.Source]; ok && e.SourceSeq <= l {
			add(ClassSourceOrder, r.ID, e.Seq, "%s: source seq %d of %s stored after its source seq %d", e.Type, e.SourceSeq, e.Source, l)
			continue
		}
		last[e.Source] = e.SourceSeq
	}
	var hi uint64
	for _, e := range evs {
		switch {
		case e.Writer < hi:
			add(ClassWriterAttempt, r.ID, e.Seq, "%s written by attempt %d after a row of attempt %d", e.Type, e.Writer, hi)
		case e.Writer > r.Attempt:
			add(ClassWriterAttempt, r.ID, e.Seq, "%s written by attempt %d, the run's attempt is %d", e.Type, e.Writer, r.Attempt)
		}
		hi = max(hi, e.Writer)
	}
}

// checkForeign reports, in each run, the turn.started events and turn
// command executions of another run that its runner emitted after that
// run's run.terminal (same source, later source seq).
func checkForeign(runs []Run, byRun map[string][]Event, add adder) {
	ended := map[string]map[string]uint64{} // run -> source -> its run.terminal's source seq
	for _, evs := range byRun {
		for _, e := range evs {
			if e.Type == EventTerminal && e.Source != "" {
				if ended[e.RunID] == nil {
					ended[e.RunID] = map[string]uint64{}
				}
				ended[e.RunID][e.Source] = e.SourceSeq
			}
		}
	}
	for _, r := range runs {
		for _, e := range byRun[r.ID] {
			turn := e.Type == EventTurnStarted || e.Type == EventCommandExecuted && e.CommandType == CommandTurnStart
			if !turn || e.EventRunID == "" || e.EventRunID == r.ID {
				continue
			}
			if end, ok := ended[e.EventRunID][e.Source]; ok && e.SourceSeq > end {
				add(ClassForeignRunEvent, r.ID, e.Seq, "%s of run %s (source seq %d) stored here, after run %s's run.terminal (source seq %d)",
					e.Type, e.EventRunID, e.SourceSeq, e.EventRunID, end)
			}
		}
	}
}

func checkCancellations(runs []Run, activities []Activity, add adder) {
	counts := map[string]map[string]int{}
	for _, a := range activities {
		if counts[a.RunID] == nil {
			counts[a.RunID] = map[string]int{}
		}
		counts[a.RunID][a.Action]++
	}
	for _, r := range runs {
		for _, action := range []string{ActionCancellationIntent, ActionCancellationAck} {
			if n := counts[r.ID][action]; n > 1 {
				add(ClassCancellationTwice, r.ID, 0, "%s recorded %d times", action, n)
			}
		}
	}
}

// WriteText prints the report for people: one line per violation, then a
// summary per class and the outcome distribution.
func (r Report) WriteText(w io.Writer) {
	for _, v := range r.Violations {
		if v.Seq > 0 {
			fmt.Fprintf(w, "VIOLATION %s run=%s seq=%d: %s\n", v.Class, v.RunID, v.Seq, v.Detail)
		} else {
			fmt.Fprintf(w, "VIOLATION %s run=%s: %s\n", v.Class, v.RunID, v.Detail)
		}
	}
	fmt.Fprintf(w, "audited %d runs, %d events\n", r.Runs, r.Events)
	for _, c := range Classes {
		fmt.Fprintf(w, "  %-34s %d\n", c, r.ByClass[c])
	}
	states := make([]string, 0, len(r.Outcomes))
	for s := range r.Outcomes {
		states = append(states, s)
	}
	sort.Strings(states)
	fmt.Fprint(w, "outcomes:")
	for _, s := range states {
		fmt.Fprintf(w, " %s=%d", s, r.Outcomes[s])
	}
	fmt.Fprintln(w)
	for _, b := range r.ContinuityBreaks {
		fmt.Fprintf(w, "continuity break (legitimate) run=%s seq=%d: %s\n", b.RunID, b.Seq, b.Detail)
	}
	if r.Clean() {
		fmt.Fprintln(w, "audit: clean")
	} else {
		fmt.Fprintf(w, "audit: %d violations\n", len(r.Violations))
	}
}
