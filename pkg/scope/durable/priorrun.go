package durable

import (
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// PriorRunFromInput builds the prior-run record of run runID from what the
// database holds for it: its stored status, whether the run row is terminal,
// and its persisted execution input. The scope is the full scope key of that
// input read as run runID's (so a projectless run-id placeholder workspace
// yields the transient workspace, and an unnamed session "session-<runID>");
// it is nil when no input was persisted, which VerifyPriorRun treats as
// indeterminate.
//
// The executor (from its run rows) and the gateway (from the
// gatewayv1.PriorRun records the executor sends) both convert through this
// function, so the two sides verify a prior run against the same key.
func PriorRunFromInput(runID, status string, terminal bool, in *prpv1.ExecutionInput) PriorRun {
	r := PriorRun{RunID: runID, Status: status, Terminal: terminal}
	if in != nil {
		k := scope.ParamsOf(runID, in).Key()
		r.Scope = &k
	}
	return r
}

// MarkPrevious marks the scope's previous run among recs (the database's
// records, newest first): the newest record of want's full scope that is
// terminal. Runs of a session are driven one at a time in submission order,
// so that run is the last one that held the scope; a crashed runner left
// idle by it is its proven owner (SPEC R8, see VerifyPriorRun). Terminal
// runs no runner ever served (NeverServed: they failed before they
// attached, e.g. while the scope's gateway was lost, SPEC F8) ran no turn:
// they are marked too, and the newest served terminal run below them is
// still the previous one, so a host that comes back after such failures
// resumes the root its last served run left idle.
func MarkPrevious(want scope.Key, recs []PriorRun) {
	for i := range recs {
		r := &recs[i]
		if r.Terminal && r.Scope != nil && r.Scope.RootName() == want.RootName() {
			r.Previous = true
			if !r.NeverServed {
				return
			}
		}
	}
}
