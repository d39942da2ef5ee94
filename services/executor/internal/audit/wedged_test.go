package audit

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// SPEC X1 (issue #30): the wedged-session rule, one case per clause.
func TestX1_ASessionWhoseRunsAllFailWhileACurrentCopyOfItsThreadExistsIsWedged(t *testing.T) {
	t.Parallel()
	run := func(id string, seq uint64, state string) Run {
		r := Run{ID: id, Scope: "s", Seq: seq, State: state}
		if state == "failed" {
			r.FailureCode, r.FailureMessage = "runner_harness_state_mismatch", "no verified checkpoint"
		}
		return r
	}
	quarantined := func(r Run) Run {
		r.FailureCode = "runner_state_identity_mismatch"
		r.FailureMessage = "prior run r1 is failed but its runner state is not_suspended; the durable state was quarantined to /var/lib/tether/runners/quarantine/s.identity_indeterminate.1.2.ab and nothing was started"
		return r
	}
	withRunner := func(r Run, id string) Run {
		r.RunnerInstanceID = id
		return r
	}
	cpAfter := func(run string) []Checkpoint { return []Checkpoint{{ID: "cp-" + run, Scope: "s", LastRunID: run}} }
	cases := []struct {
		name        string
		runs        []Run
		checkpoints []Checkpoint
		wedged      bool
		copy        string
	}{
		{"every run after the checkpointed success failed", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "failed")},
			cpAfter("r1"), true, "checkpoint cp-r1"},
		{"the submission order decides, not the ids", []Run{run("b", 1, "succeeded"), run("a", 3, "failed"), run("c", 2, "failed")},
			cpAfter("b"), true, "checkpoint cp-b"},
		{"a failed run quarantined the root that ran the last turn", []Run{run("r1", 1, "succeeded"), quarantined(run("r2", 2, "failed")), run("r3", 3, "failed")},
			nil, true, "run r2 quarantined"},
		{"the runner that ran the last turn still serves the failing runs", []Run{withRunner(run("r1", 1, "succeeded"), "runner-a"),
			withRunner(run("r2", 2, "failed"), "runner-a"), run("r3", 3, "failed")}, nil, true, "runner runner-a that ran r1 served run r2"},
		{"another runner served them", []Run{withRunner(run("r1", 1, "succeeded"), "runner-a"),
			withRunner(run("r2", 2, "failed"), "runner-b"), run("r3", 3, "failed")}, nil, false, ""},
		{"cancelled runs in between count neither way", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "cancelled"), run("r4", 4, "failed")},
			cpAfter("r1"), true, "checkpoint cp-r1"},
		{"one failed run is what a fault may cost", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed")}, cpAfter("r1"), false, ""},
		{"a later success: the session recovered", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "failed"), run("r4", 4, "succeeded")},
			cpAfter("r1"), false, ""},
		{"an open run after the failures: not yet", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "failed"), run("r4", 4, "queued")},
			cpAfter("r1"), false, ""},
		{"no copy known: the thread is lost, not wedged", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "failed")},
			nil, false, ""},
		{"the checkpoint is older than the newest turn", []Run{run("r0", 1, "succeeded"), run("r1", 2, "succeeded"), run("r2", 3, "failed"), run("r3", 4, "failed")},
			cpAfter("r0"), false, ""},
		{"a checkpoint of another scope", []Run{run("r1", 1, "succeeded"), run("r2", 2, "failed"), run("r3", 3, "failed")},
			[]Checkpoint{{ID: "cp", Scope: "other", LastRunID: "r1"}}, false, ""},
		{"never succeeded: no thread", []Run{run("r1", 1, "failed"), run("r2", 2, "failed"), run("r3", 3, "failed")}, cpAfter("r1"), false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws := WedgedSessions(tc.runs, tc.checkpoints)
			rep := Check(History{Runs: tc.runs, Checkpoints: tc.checkpoints})
			if !tc.wedged {
				require.Empty(t, ws)
				require.Zero(t, rep.ByClass[ClassSessionWedged], "%+v", rep.Violations)
				return
			}
			require.Len(t, ws, 1)
			require.Equal(t, "s", ws[0].Scope)
			require.Contains(t, ws[0].Copy, tc.copy)
			var terminal []Violation
			for _, v := range rep.Violations {
				if v.Class == ClassSessionWedged {
					terminal = append(terminal, v)
				}
			}
			require.Len(t, terminal, 1)
			require.Equal(t, ws[0].Failed[len(ws[0].Failed)-1], terminal[0].RunID, "filed under the last failed run")
			require.Contains(t, terminal[0].Detail, "all failed")
			var b bytes.Buffer
			rep.WriteText(&b)
			require.Contains(t, b.String(), "VIOLATION "+ClassSessionWedged)
		})
	}
}

// Each scope is judged on its own: a wedged scope beside a healthy one.
func TestX1_WedgedSessionsAreJudgedPerScope(t *testing.T) {
	t.Parallel()
	runs := []Run{
		{ID: "a1", Scope: "a", Seq: 1, State: "succeeded"}, {ID: "b1", Scope: "b", Seq: 2, State: "succeeded"},
		{ID: "a2", Scope: "a", Seq: 3, State: "failed"}, {ID: "b2", Scope: "b", Seq: 4, State: "failed"},
		{ID: "a3", Scope: "a", Seq: 5, State: "failed"}, {ID: "b3", Scope: "b", Seq: 6, State: "succeeded"},
	}
	cps := []Checkpoint{{ID: "cp-a", Scope: "a", LastRunID: "a1"}, {ID: "cp-b", Scope: "b", LastRunID: "b1"}}
	ws := WedgedSessions(runs, cps)
	require.Len(t, ws, 1)
	require.Equal(t, Wedge{Scope: "a", LastSucceeded: "a1", Failed: []string{"a2", "a3"}, Copy: "checkpoint cp-a holds its thread up to a1"}, ws[0])
}
