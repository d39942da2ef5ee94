package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
)

// SPEC F9, R13: a local root is set aside for a checkpoint only when it is
// provably older, by recorded order; a root newer than the checkpoint (its
// runner continued from it here and produced at least what the executor
// holds) is never discarded.
func TestF9_AStaleRootIsDecidedByRecordedOrderNotByDifference(t *testing.T) {
	t.Parallel()
	const sc = "scope-1"
	spec := func(cp string, minSeq uint64) *gatewayv1.RestoreSpec {
		return &gatewayv1.RestoreSpec{CheckpointId: cp, MinSourceSeq: minSeq,
			Stamp: &backupv1.Stamp{RunnerInstanceId: "runner-1", NormalizedSessionId: "s", SessionScope: sc}}
	}
	root := func(inst, marked string, produced uint64) LocalRoot {
		return LocalRoot{RunnerInstanceID: inst, SessionScope: sc, NormalizedSessionID: "s", Produced: produced,
			MarkedCheckpoint: marked}
	}
	for _, tc := range []struct {
		name  string
		local LocalRoot
		spec  *gatewayv1.RestoreSpec
		stale bool
	}{
		{"exactly the checkpoint: resumed", root("runner-1", "cp-1", 10), spec("cp-1", 10), false},
		{"exactly the checkpoint, but a run went on from it elsewhere (fail-back of an in-flight run): older",
			root("runner-1", "cp-1", 10), spec("cp-1", 12), true},
		{"R13: continued here after the checkpoint (turn.start journaled, runnerd killed): kept",
			root("runner-1", "cp-1", 14), spec("cp-1", 12), false},
		{"continued here, more journaled than the executor holds: kept", root("runner-1", "cp-1", 20), spec("cp-1", 12), false},
		{"continued here, but the runner went on elsewhere (the executor holds more): older",
			root("runner-1", "cp-1", 11), spec("cp-1", 15), true},
		{"the checkpoint was taken elsewhere after this root: older", root("runner-1", "cp-0", 30), spec("cp-1", 12), true},
		{"an unmarked root of the checkpoint's runner: older", root("runner-1", "", 3), spec("cp-1", 12), true},
		{"fail-back: a root of another runner id that served the scope before, left by a move: set aside",
			func() LocalRoot { r := root("runner-0", "cp-0", 50); r.ServedBefore = true; return r }(), spec("cp-1", 12), true},
		{"C3: a root of a runner no record names is not judged here", root("runner-sandbox", "cp-0", 50), spec("cp-1", 12), false},
		{"a root of a runner cut off in a run the records say another runner finished: set aside",
			func() LocalRoot { r := root("runner-cut", "", 20); r.RunServedElsewhere = true; return r }(), spec("cp-1", 12), true},
		{"a root of another scope is not judged here", LocalRoot{RunnerInstanceID: "runner-9", SessionScope: "scope-2", NormalizedSessionID: "s"},
			spec("cp-1", 12), false},
		{"a root of another session is not judged here", LocalRoot{RunnerInstanceID: "runner-9", SessionScope: sc, NormalizedSessionID: "other"},
			spec("cp-1", 12), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.stale, StaleRoot(tc.local, sc, tc.spec))
		})
	}
}

// SPEC F9: a root left behind by a move is recognised by the runners the
// Open's restore names as having served the scope, not only by its (at
// most 16) newest prior runs: a session that ran many turns elsewhere
// before failing back still has its abandoned root set aside.
func TestF9_ARootOfARunnerThatServedTheScopeLongAgoIsRecognisedAsLeftByAMove(t *testing.T) {
	t.Parallel()
	spec := &gatewayv1.RestoreSpec{ServedRunnerIds: []string{"runner-2", "runner-0"}}
	prior := []*gatewayv1.PriorRun{{RunnerInstanceId: "runner-2"}, {RunId: "never-served"}}
	for _, tc := range []struct {
		name   string
		id     string
		spec   *gatewayv1.RestoreSpec
		served bool
	}{
		{"named by the restore, beyond the prior runs", "runner-0", spec, true},
		{"named by a prior run", "runner-2", &gatewayv1.RestoreSpec{}, true},
		{"named by neither: foreign (C3)", "runner-sandbox", spec, false},
		{"no runner identity", "", spec, false},
		{"no restore", "runner-0", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.served, servedScope(tc.id, tc.spec, prior))
		})
	}
}
