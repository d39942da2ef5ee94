package durable

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope"
)

// warmRoot is a scope root whose control plane binds run-1 to runner-1
// after that runner journaled run-1's run.attach and turn.start (controller
// seqs 1 and 2), as the gateway's launch leaves it.
func warmRoot(t *testing.T) (base, root string, p scope.Params, id Identity) {
	t.Helper()
	p = execution("company-p4", "run-1", "agent-p4", "workspace-p4", "session-p4")
	base = t.TempDir()
	root = filepath.Join(base, p.Key().RootName())
	id = Identity{RunID: "run-1", NormalizedSessionID: p.NormalizedSessionID, RunnerInstanceID: "runner-1", EnvironmentLeaseID: "lease-1"}
	doc := runnerState(id, "ready")
	doc["lastControllerCommandSeq"] = 2
	doc["currentRun"] = map[string]any{"runId": "run-1", "attempt": 1}
	doc["processedCommands"] = map[string]any{
		"run-1/g0/run.attach": map[string]any{"commandId": "run-1/g0/run.attach", "controllerSeq": 1, "commandType": "run.attach", "runId": "run-1", "status": "completed"},
		"run-1/g0/turn.start": map[string]any{"commandId": "run-1/g0/turn.start", "controllerSeq": 2, "commandType": "turn.start", "runId": "run-1", "status": "completed"},
	}
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), doc)
	require.NoError(t, Bind(root, id))
	return base, root, p, id
}

// journalAttach appends run's run.attach (and turn.start) at controller
// seq to root's intent log, as runnerd does before their effects.
func journalAttach(t *testing.T, root, run string, seq uint64) {
	t.Helper()
	var buf bytes.Buffer
	for i, typ := range []string{runnerstate.CmdRunAttach, "turn.start"} {
		require.NoError(t, runnerstate.AppendFrame(&buf, runnerstate.Intent{CommandID: run + "/g0/" + typ,
			ControllerSeq: seq + uint64(i), CommandType: typ, RunID: run, Attempt: 1, Fingerprint: "f"}))
	}
	f, err := os.OpenFile(filepath.Join(root, RunnerDir, runnerstate.IntentLogFile), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	_, err = f.Write(buf.Bytes())
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// SPEC P4: a warm run on a live runner is bound by the run.attach its runner
// journaled, not by a control-plane rewrite; every reader of the binding
// sees it, so a relaunch for that run resumes it as the exact run.
func TestP4_ARunAttachTheRunnerJournaledAfterTheBindBindsItsRun(t *testing.T) {
	base, root, p, id := warmRoot(t)
	got, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, id, *got, "nothing journaled since the bind")

	journalAttach(t, root, "run-2", 3)
	got, _, err = ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	want := id
	want.RunID = "run-2"
	require.Equal(t, want, *got)
	raw, err := os.ReadFile(filepath.Join(root, ControlPlaneDir, ControlPlaneFile))
	require.NoError(t, err)
	require.Contains(t, string(raw), `"runId":"run-1"`, "the control plane itself was not rewritten")

	run2 := p
	run2.RunID = "run-2"
	prep, err := Prepare(context.Background(), Request{Base: base, Scope: run2.Key(), RunID: "run-2"})
	require.NoError(t, err)
	require.Equal(t, SourceExactRun, prep.Source)
	require.Equal(t, want, *prep.Binding)

	// The next run finds run-2 the scope's previous run (R8, E13).
	run3 := p
	run3.RunID = "run-3"
	prior := terminalPrior(run2)
	recs := []PriorRun{prior, terminalPrior(p)}
	MarkPrevious(run3.Key(), recs)
	prep, err = Prepare(context.Background(), Request{Base: base, Scope: run3.Key(), RunID: "run-3", PriorRuns: PriorRunsOf(recs...)})
	require.NoError(t, err)
	require.Equal(t, SourcePriorRun, prep.Source)
	require.Equal(t, "run-2", prep.Binding.RunID)
}

// What a runner journaled before the control plane was last bound (a
// restored checkpoint's journal, a runner's earlier runs) binds nothing; a
// runner of another identity binds nothing either.
func TestP4_OnlyTheBoundRunnersRunAttachAfterTheBindCounts(t *testing.T) {
	_, root, _, id := warmRoot(t)
	journalAttach(t, root, "run-2", 3)
	restored := id
	restored.RunID = "run-9"
	require.NoError(t, Bind(root, restored))
	got, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, restored, *got, "run-2's attach predates the bind")

	_, root, _, id = warmRoot(t)
	doc := runnerState(Identity{RunID: "x", NormalizedSessionID: id.NormalizedSessionID, RunnerInstanceID: "runner-other",
		EnvironmentLeaseID: id.EnvironmentLeaseID}, "ready")
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), doc)
	journalAttach(t, root, "run-2", 3)
	got, _, err = ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, id, *got, "another runner's journal binds nothing")
}

// A run.attach the state document holds (its intent log reset since) binds
// as well; so does the document's current run when the commands after the
// bind were pruned from its bounded journal.
func TestP4_TheStateDocumentsJournalBindsWhenTheIntentLogWasReset(t *testing.T) {
	_, root, _, id := warmRoot(t)
	doc := runnerState(id, "ready")
	doc["lastControllerCommandSeq"] = 4
	doc["processedCommands"] = map[string]any{
		"run-2/g0/run.attach": map[string]any{"commandId": "run-2/g0/run.attach", "controllerSeq": 3, "commandType": "run.attach", "runId": "run-2", "status": "completed"},
		"run-2/g0/turn.start": map[string]any{"commandId": "run-2/g0/turn.start", "controllerSeq": 4, "commandType": "turn.start", "runId": "run-2", "status": "completed"},
	}
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), doc)
	got, _, err := ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, "run-2", got.RunID)

	pruned := map[string]any{}
	for seq := 200; seq < 200+runnerstate.MaxProcessedCommands; seq++ {
		cid := fmt.Sprintf("run-5/steer/%d", seq)
		pruned[cid] = map[string]any{"commandId": cid, "controllerSeq": seq, "commandType": "turn.steer", "runId": "run-5", "status": "completed"}
	}
	doc["processedCommands"] = pruned
	doc["lastControllerCommandSeq"] = 200 + runnerstate.MaxProcessedCommands - 1
	doc["currentRun"] = map[string]any{"runId": "run-5", "attempt": 1}
	writeJSON(t, filepath.Join(root, RunnerDir, RunnerStateFile), doc)
	got, _, err = ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.Equal(t, "run-5", got.RunID)
}
