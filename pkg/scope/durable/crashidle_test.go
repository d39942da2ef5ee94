package durable

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/runnerstate"
)

// SPEC R8: a runner that crashed idle between turns (lifecycle ready or
// connecting, no active turn, no command in flight, process gone) whose
// control plane names the scope's previous run — terminal in the database,
// same full scope — is resumed, not quarantined. Everything else E13 lists
// as unproven still is.
func TestR8_ACrashedIdleRunnerOfTheScopesPreviousRunIsResumedAndAnythingUnprovenIsStillQuarantined(t *testing.T) {
	prior := execution("company-r8", "run-r8-prior", "agent-r8", "workspace-r8", "session-r8")
	older := prior
	older.RunID = "run-r8-older"
	current := prior
	current.RunID = "run-r8-current"
	identity := Identity{RunID: prior.RunID, NormalizedSessionID: prior.NormalizedSessionID,
		RunnerInstanceID: "runner-r8", EnvironmentLeaseID: "lease-r8"}
	// The executor's records, newest first: the prior run, then an older one.
	records := func() []PriorRun {
		recs := []PriorRun{terminalPrior(prior), terminalPrior(older)}
		MarkPrevious(current.Key(), recs)
		return recs
	}
	deadRunner := map[string]any{"pid": 1 << 30, "startTicks": 1, "bootId": "another-boot"}
	ticks, err := procid.StartTicks(os.Getpid())
	require.NoError(t, err)
	liveRunner := map[string]any{"pid": os.Getpid(), "startTicks": ticks, "bootId": procid.BootID()}

	cases := []struct {
		name      string
		lifecycle string
		edit      func(doc map[string]any)
		boundRun  string     // the control plane's run (default: the prior run)
		records   []PriorRun // default: records()
		// log is the runner's intent log: what runnerd journaled after
		// the document it saved (commands in flight, outcome records).
		log     []runnerstate.Intent
		resumed bool
	}{
		{name: "ready between turns", lifecycle: "ready", resumed: true},
		{name: "connecting between turns", lifecycle: "connecting", resumed: true},
		{name: "a turn of another run in flight", lifecycle: "ready", edit: func(d map[string]any) {
			d["activeTurn"] = map[string]any{"turnId": "t-1", "runId": older.RunID}
		}},
		{name: "a turn of no run in flight", lifecycle: "ready", edit: func(d map[string]any) {
			d["activeTurn"] = map[string]any{"turnId": "t-1"}
		}},
		// runnerd journaled the end of the previous run's turn and died
		// before it saved the state that clears the turn: the run is
		// terminal in the database, so its turn is over (the relaunched
		// runnerd reads the end from its journal).
		{name: "a turn of the terminal previous run not yet cleared", lifecycle: "ready", resumed: true, edit: func(d map[string]any) {
			d["activeTurn"] = map[string]any{"turnId": "t-1", "runId": prior.RunID}
		}},
		{name: "a command in flight", lifecycle: "ready", edit: func(d map[string]any) {
			d["processedCommands"] = map[string]any{"c-1": map[string]any{"commandId": "c-1", "status": "pending"}}
		}},
		{name: "a command of another run in flight", lifecycle: "ready", edit: func(d map[string]any) {
			d["processedCommands"] = map[string]any{"c-1": map[string]any{"commandId": "c-1", "status": "pending", "runId": older.RunID}}
		}},
		// runnerd died after the previous run's turn ended, before it
		// saved the outcome of that run's turn.start: the run is terminal
		// in the database, so its turn is over.
		{name: "a command of the terminal previous run in flight", lifecycle: "ready", resumed: true, edit: func(d map[string]any) {
			d["processedCommands"] = map[string]any{"c-1": map[string]any{"commandId": "c-1", "status": "pending", "runId": prior.RunID}}
		}},
		// The warm path answers run.attach and turn.start from an outcome
		// record in the intent log; the document catches up later. A
		// runner that died with another run's turn there is not idle,
		// though its document shows no turn.
		{name: "a turn of another run in the intent log's outcome record", lifecycle: "ready", log: []runnerstate.Intent{{
			CommandID: "c-2", ControllerSeq: 2, CommandType: "turn.start", RunID: older.RunID,
			Outcomes: &runnerstate.OutcomeBatch{Seq: 1,
				Commands:   []*runnerstate.CommandRecord{{CommandID: "c-2", ControllerSeq: 2, CommandType: "turn.start", RunID: older.RunID, Status: runnerstate.StatusCompleted}},
				ActiveTurn: &runnerstate.Turn{TurnID: "t-2", RunID: older.RunID}},
		}}},
		{name: "a turn of the terminal previous run in the intent log's outcome record", lifecycle: "ready", resumed: true, log: []runnerstate.Intent{{
			CommandID: "c-2", ControllerSeq: 2, CommandType: "turn.start", RunID: prior.RunID,
			Outcomes: &runnerstate.OutcomeBatch{Seq: 1,
				Commands:   []*runnerstate.CommandRecord{{CommandID: "c-2", ControllerSeq: 2, CommandType: "turn.start", RunID: prior.RunID, Status: runnerstate.StatusCompleted}},
				ActiveTurn: &runnerstate.Turn{TurnID: "t-2", RunID: prior.RunID}},
		}}},
		{name: "a command of another run journaled in the intent log, no outcome", lifecycle: "ready", log: []runnerstate.Intent{{
			CommandID: "c-3", ControllerSeq: 3, CommandType: "turn.start", RunID: older.RunID,
		}}},
		{name: "the runner process still alive", lifecycle: "ready", edit: func(d map[string]any) {
			d["runnerProcess"] = liveRunner
		}},
		{name: "stopped on purpose", lifecycle: "stopped"},
		{name: "recoverable failure", lifecycle: "recoverable_failure"},
		{name: "not the scope's previous run", lifecycle: "ready", boundRun: older.RunID},
		{name: "previous run still running", lifecycle: "ready",
			records: []PriorRun{{RunID: prior.RunID, Status: "running", Scope: keyOf(prior)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			id := identity
			if tc.boundRun != "" {
				id.RunID = tc.boundRun
			}
			root := filepath.Join(base, current.Key().RootName())
			doc := runnerState(id, tc.lifecycle)
			doc["runnerProcess"] = deadRunner
			if tc.edit != nil {
				tc.edit(doc)
			}
			writeJSON(t, filepath.Join(root, ControlPlaneDir, ControlPlaneFile), controlPlane(id))
			writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), doc)
			if tc.log != nil {
				var buf bytes.Buffer
				for _, in := range tc.log {
					require.NoError(t, runnerstate.AppendFrame(&buf, in))
				}
				require.NoError(t, os.WriteFile(filepath.Join(root, RunnerDir, runnerstate.IntentLogFile), buf.Bytes(), 0o600))
			}
			recs := tc.records
			if recs == nil {
				recs = records()
			}
			prep, err := Prepare(context.Background(), Request{Base: base, Scope: current.Key(), RunID: current.RunID,
				PriorRuns: PriorRunsOf(recs...)})
			if tc.resumed {
				require.NoError(t, err)
				require.Equal(t, SourcePriorRun, prep.Source)
				require.Equal(t, id, *prep.Binding, "the runner instance and lease are kept")
				require.DirExists(t, root)
				return
			}
			requireCode(t, err, failure.RunnerStateIdentityMismatch)
			require.Nil(t, prep)
		})
	}
}

func TestR8_MarkPreviousNamesTheNewestTerminalRunOfTheSameFullScope(t *testing.T) {
	want := execution("company-mp", "run-mp-current", "agent-mp", "workspace-mp", "session-mp")
	other := want
	other.ExecutionWorkspaceID = "workspace-other"
	at := func(id string, p PriorRun) PriorRun { p.RunID = id; return p }
	recs := []PriorRun{
		{RunID: "queued-after", Status: "queued", Scope: keyOf(want)},
		at("other-scope", terminalPrior(other)),
		at("previous", terminalPrior(want)),
		at("older", terminalPrior(want)),
	}
	MarkPrevious(want.Key(), recs)
	for _, r := range recs {
		require.Equal(t, r.RunID == "previous", r.Previous, r.RunID)
	}
}

// SPEC R8, X2: the gateway killed during the first Bind of a fresh root
// leaves at most the control plane it was preparing aside: the run's retry
// starts the root fresh. Anything beside it is read as usual.
func TestR8_ARootWhoseFirstBindWasCutShortStartsFreshAndAnythingBesideItIsStillQuarantined(t *testing.T) {
	p := execution("company-cut", "run-cut", "agent-cut", "workspace-cut", "session-cut")
	cases := []struct {
		name  string
		files []string // under the root; a trailing "/" is a directory
		fresh bool
	}{
		{name: "an empty control plane prepared aside", files: []string{bindTempPrefix + "1/"}, fresh: true},
		{name: "a control plane prepared aside", files: []string{bindTempPrefix + "1/" + ControlPlaneFile}, fresh: true},
		{name: "runner state beside it", files: []string{bindTempPrefix + "1/", "runner/runner-state.json"}},
		{name: "a control-plane directory without its document", files: []string{bindTempPrefix + "1/", "control-plane/"}},
		{name: "a file named like it", files: []string{bindTempPrefix + "2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, p.Key().RootName())
			for _, f := range tc.files {
				path := filepath.Join(root, f)
				if f[len(f)-1] == '/' {
					require.NoError(t, os.MkdirAll(path, 0o700))
					continue
				}
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
				require.NoError(t, os.WriteFile(path, []byte("{"), 0o600))
			}
			prep, err := Prepare(context.Background(), Request{Base: base, Scope: p.Key(), RunID: p.RunID, PriorRuns: PriorRunsOf()})
			if !tc.fresh {
				requireCode(t, err, failure.RunnerStateIdentityMismatch)
				require.NoDirExists(t, root, "quarantined")
				return
			}
			require.NoError(t, err)
			require.Equal(t, SourceFresh, prep.Source)
			entries, err := os.ReadDir(root)
			require.NoError(t, err)
			require.Empty(t, entries, "the cut Bind's leftovers are removed")
			id := Identity{RunID: p.RunID, NormalizedSessionID: p.NormalizedSessionID, RunnerInstanceID: "runner-cut", EnvironmentLeaseID: "lease-cut"}
			require.NoError(t, Bind(root, id))
			got, why, err := ReadControlPlaneIdentity(root)
			require.NoError(t, err)
			require.NotNil(t, got, why)
			require.Equal(t, id, *got)
			entries, err = os.ReadDir(root)
			require.NoError(t, err)
			require.Len(t, entries, 1, "the first Bind renamed its control plane into place")
		})
	}
}

// SPEC F8: runs that failed before any runner served them (their gateway
// was lost) ran no turn; they do not hide the run that last held the root,
// whose runner the host's death left idle: that run is still the scope's
// previous run, so the returning host resumes the root.
func TestF8_RunsThatFailedUnservedDoNotHideTheRunThatLastHeldTheRoot(t *testing.T) {
	want := execution("company-mp", "run-mp-current", "agent-mp", "workspace-mp", "session-mp")
	at := func(id string, p PriorRun) PriorRun { p.RunID = id; return p }
	unserved := func(id string) PriorRun { p := at(id, terminalPrior(want)); p.NeverServed = true; return p }
	recs := []PriorRun{
		unserved("failed-waiting-2"),
		unserved("failed-waiting-1"),
		at("served", terminalPrior(want)),
		at("older", terminalPrior(want)),
	}
	MarkPrevious(want.Key(), recs)
	for _, r := range recs {
		require.Equal(t, r.RunID != "older", r.Previous, r.RunID)
	}
}
