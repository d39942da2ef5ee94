package audit

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// ClassSessionWedged is the class of a session scope whose runs all fail after its last
// succeeded run (at least MinWedgedRuns of them, none still open) while a
// current copy of its thread is known to exist — a checkpoint recorded
// after that run, a root a failed run reports it set aside (quarantine),
// or the runner that ran it, still serving the scope's failed runs.
// The thread is not lost, yet nothing the session is sent can use it: a
// fault left the session wedged (issue #30, SPEC F7–F9).
const ClassSessionWedged = "session_wedged"

// MinWedgedRuns is how many failed runs in a row after a session's last
// success make it wedged: one failed run is what a fault may cost; the next
// run must find the thread again.
const MinWedgedRuns = 2

// Checkpoint is one recorded session checkpoint (executor.session_checkpoints).
type Checkpoint = store.AuditCheckpoint

// Wedge is one wedged session scope.
type Wedge struct {
	Scope string
	// LastSucceeded is the scope's newest succeeded run.
	LastSucceeded string
	// Failed are the runs after it, in submission order; all failed.
	Failed []string
	// LastFailure is the last failed run's failure code.
	LastFailure string
	// Copy says where a current copy of the thread is.
	Copy string
}

// quarantineMark is how a failure message names a root set aside
// (durable.Quarantine's destination, <state-root>/quarantine/...).
var quarantineMark = "/" + durable.QuarantineDir + "/"

// WedgedSessions applies the wedged-session rule to every scope of runs
// (ordered by Run.Seq, the submission order) and the scopes' checkpoints.
// A scope is wedged when
//   - it has a succeeded run (a thread exists: its newest one is L),
//   - every run submitted after L has ended, and failed — at least
//     MinWedgedRuns of them (cancelled runs are neither),
//   - a current copy of L's thread exists: a checkpoint of the scope whose
//     last run is L; a failed run after L whose failure reports that its
//     root was quarantined (the root that ran L, moved aside whole); or a
//     failed run after L served by L's runner (the same runner instance:
//     the root that ran L is live, yet the run failed).
//
// A scope whose runs after L include an open or a succeeded run is not
// wedged (it recovered or may still), nor one with no copy known (its
// thread is lost, not wedged).
func WedgedSessions(runs []Run, checkpoints []Checkpoint) []Wedge {
	byScope := map[string][]Run{}
	for _, r := range runs {
		byScope[r.Scope] = append(byScope[r.Scope], r)
	}
	checkpointed := map[string]string{} // scope + "\x00" + last run -> checkpoint id
	for _, c := range checkpoints {
		checkpointed[c.Scope+"\x00"+c.LastRunID] = c.ID
	}
	scopes := make([]string, 0, len(byScope))
	for s := range byScope {
		scopes = append(scopes, s)
	}
	sort.Strings(scopes)
	var out []Wedge
	for _, s := range scopes {
		if w, ok := wedgedScope(s, byScope[s], checkpointed); ok {
			out = append(out, w)
		}
	}
	return out
}

func wedgedScope(scope string, runs []Run, checkpointed map[string]string) (Wedge, bool) {
	sort.Slice(runs, func(i, j int) bool { return runs[i].Seq < runs[j].Seq })
	last := -1
	for i, r := range runs {
		if r.State == "succeeded" {
			last = i
		}
	}
	if last < 0 {
		return Wedge{}, false
	}
	w := Wedge{Scope: scope, LastSucceeded: runs[last].ID}
	quarantined, sameRunner := "", ""
	for _, r := range runs[last+1:] {
		switch r.State {
		case "cancelled":
			continue
		case "failed":
		default:
			return Wedge{}, false // open: not (yet) wedged
		}
		w.Failed = append(w.Failed, r.ID)
		w.LastFailure = r.FailureCode
		if strings.Contains(r.FailureMessage, quarantineMark) && quarantined == "" {
			quarantined = r.ID
		}
		if id := runs[last].RunnerInstanceID; id != "" && r.RunnerInstanceID == id && sameRunner == "" {
			sameRunner = r.ID
		}
	}
	if len(w.Failed) < MinWedgedRuns {
		return Wedge{}, false
	}
	switch id, ok := checkpointed[scope+"\x00"+w.LastSucceeded]; {
	case ok:
		w.Copy = fmt.Sprintf("checkpoint %s holds its thread up to %s", id, w.LastSucceeded)
	case quarantined != "":
		w.Copy = fmt.Sprintf("run %s quarantined the root that ran %s", quarantined, w.LastSucceeded)
	case sameRunner != "":
		w.Copy = fmt.Sprintf("runner %s that ran %s served run %s", runs[last].RunnerInstanceID, w.LastSucceeded, sameRunner)
	default:
		return Wedge{}, false
	}
	return w, true
}

// checkWedged adds a ClassSessionWedged violation per wedged scope, filed
// under its last failed run.
func checkWedged(runs []Run, checkpoints []Checkpoint, add adder) {
	for _, w := range WedgedSessions(runs, checkpoints) {
		add(ClassSessionWedged, w.Failed[len(w.Failed)-1], 0,
			"session scope %s: the %d runs after its last succeeded run %s all failed (the last with %s), while %s",
			w.Scope, len(w.Failed), w.LastSucceeded, w.LastFailure, w.Copy)
	}
}
