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
