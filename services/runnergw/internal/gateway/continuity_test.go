package gateway

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/runnerstatetest"
)

// openRaw sends open as the stream's Open; the answer is Opened or the
// refusal. The stream is closed again.
func (rl *relay) openRaw(ctx context.Context, open *gatewayv1.Open) (*gatewayv1.Opened, error) {
	s, err := rl.client.Attach(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil {
		return nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, err
	}
	_ = s.CloseSend()
	return m.GetOpened(), nil
}

func TestF3_GatewayFailsClosedOnALostScopeAndAReplacementStartsAFreshRootOnce(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("f3", "acme", "hello")
	sc := scope.OfRun("run-1", in)
	root := filepath.Join(rl.cfg.StateRoot, sc)
	first, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	prior := []*gatewayv1.PriorRun{terminalRun("run-1", in)}

	// A decision pending: the live runner is closed, its root moved aside,
	// and the run starts a fresh runner on a fresh root.
	open := &gatewayv1.Open{RunId: "run-2", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in,
		PriorRuns: prior, ReplacementId: "repl-1"}
	opened, err := rl.openRaw(ctx, open)
	require.NoError(t, err)
	require.NotEqual(t, first.GetRunnerInstanceId(), opened.GetRunnerInstanceId())
	require.Equal(t, "fresh", opened.GetDurableSource())
	breaks, err := filepath.Glob(filepath.Join(rl.cfg.StateRoot, ContinuityBreaksDir, sc+".*.repl-1"))
	require.NoError(t, err)
	require.Len(t, breaks, 1)
	require.DirExists(t, filepath.Join(breaks[0], "control-plane"), "the old root, whole")
	rl.waitDetached(sc)

	// A later attempt of the same run finds the scope already its own.
	open.Fence.Attempt = 2
	again, err := rl.openRaw(ctx, open)
	require.NoError(t, err)
	require.Equal(t, opened.GetRunnerInstanceId(), again.GetRunnerInstanceId())
	breaks, err = filepath.Glob(filepath.Join(rl.cfg.StateRoot, ContinuityBreaksDir, "*"))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "nothing moved again")
	rl.waitDetached(sc)

	// The scope's state is lost with no checkpoint: a run that must
	// continue it fails closed and creates nothing.
	_, err = rl.client.CloseRunner(ctx, &gatewayv1.CloseRunnerRequest{Input: in, RunId: "run-2", Reason: "test"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rl.runner(sc).GetLifecycle() == LifecycleExited }, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, os.RemoveAll(root))
	_, err = rl.openRaw(ctx, &gatewayv1.Open{RunId: "run-3", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in,
		PriorRuns: append(prior, terminalRun("run-2", in)), ContinuityRequired: true})
	require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err), "%v", err)
	require.NoDirExists(t, root)
}

// A gateway lost and back with its disk holds the root of a scope that was
// failed over and ran elsewhere since. Placed here again, the scope must
// continue from its current checkpoint, not from the old root: the old
// root is moved aside and the checkpoint restored. A root that is exactly
// the checkpoint (this gateway took it and nothing ran since) is resumed
// without a download.
func TestF3_AGatewayBackWithAnOldRootRestoresTheScopesCurrentCheckpoint(t *testing.T) {
	t.Parallel()
	fv, client := startFakeVerifier(t)
	withBackup := func(c *Config) { c.Backup = client }
	a, b := newRelay(t, withBackup), newRelay(t, withBackup)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("moved", "acme", "first")
	sc := scope.Of(in)
	prompt := func(p string) *prpv1.ExecutionInput {
		c := proto.Clone(in).(*prpv1.ExecutionInput)
		c.Task.Prompt = p
		return c
	}
	specOf := func(r *gatewayv1.SuspendRunnerResponse) *gatewayv1.RestoreSpec {
		return &gatewayv1.RestoreSpec{CheckpointId: r.GetCheckpoint().GetCheckpointId(), Stamp: r.GetStamp(), LeaseId: r.GetLeaseId()}
	}
	downloads := func() int {
		fv.mu.Lock()
		defer fv.mu.Unlock()
		return fv.downloads
	}
	// The executor's records of the scope's earlier runs, all ended.
	inputs := map[string]*prpv1.ExecutionInput{"run-1": in, "run-2": prompt("second"), "run-3": prompt("second"),
		"run-4": prompt("third"), "run-5": prompt("third"), "run-6": prompt("fourth")}
	ended := func(ids ...string) {
		var prior []*gatewayv1.PriorRun
		for _, id := range ids {
			prior = append(prior, &gatewayv1.PriorRun{RunId: id, Status: "succeeded", Terminal: true, Input: inputs[id]})
		}
		a.prior, b.prior = prior, prior
	}
	finalMessage := func(evs []*prpv1.Event) string {
		t.Helper()
		term := evs[len(evs)-1].GetPayload().AsMap()
		require.Equal(t, "succeeded", term["runTerminalState"], "%v", term)
		return term["finalMessage"].(string)
	}

	// On A: a turn, then a verified suspension (checkpoint 1).
	_, evs := a.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	a.waitDetached(sc)
	cp1, err := a.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)

	// Its next run on A resumes the local root, which is checkpoint 1.
	ended("run-1")
	_, err = a.openWith(ctx, "run-2", prompt("second"), specOf(cp1), a.prior...)
	require.NoError(t, err)
	require.Zero(t, downloads(), "the local root is the checkpoint: nothing downloaded")
	a.waitDetached(sc)
	ended("run-1", "run-2")
	_, evs = a.turn(ctx, "run-3", nil, prompt("second"), nil)
	require.Contains(t, finalMessage(evs), "2 earlier messages")
	a.waitDetached(sc)
	cp2, err := a.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)

	// A is lost; the scope fails over to B from checkpoint 2 and runs a
	// turn there, then suspends (checkpoint 3).
	ended("run-1", "run-2", "run-3")
	_, err = b.openWith(ctx, "run-4", prompt("third"), specOf(cp2), b.prior...)
	require.NoError(t, err)
	require.Equal(t, 1, downloads())
	b.waitDetached(sc)
	ended("run-1", "run-2", "run-3", "run-4")
	_, evs = b.turn(ctx, "run-5", nil, prompt("third"), nil)
	require.Contains(t, finalMessage(evs), "4 earlier messages")
	b.waitDetached(sc)
	cp3, err := b.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)

	// A is back with its old root (checkpoint 2's); the scope is placed on
	// A again with checkpoint 3: A restores it and the thread has every
	// turn.
	ended("run-1", "run-2", "run-3", "run-4", "run-5")
	_, err = a.openWith(ctx, "run-6", prompt("fourth"), specOf(cp3), a.prior...)
	require.NoError(t, err)
	require.Equal(t, 2, downloads(), "the old root is not the current checkpoint: restored")
	a.waitDetached(sc)
	ended("run-1", "run-2", "run-3", "run-4", "run-5", "run-6")
	_, evs = a.turn(ctx, "run-7", nil, prompt("fourth"), nil)
	require.Contains(t, finalMessage(evs), "6 earlier messages")
	breaks, err := os.ReadDir(filepath.Join(a.cfg.StateRoot, sc, "continuity-breaks"))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "the old root was moved aside, not deleted")
}

// Local state of another runner identity is not an older state of the
// checkpoint's runner: it is never swapped for the checkpoint, the
// durable-state rules refuse it (quarantined, nothing starts; SPEC C3).
func TestC3_AForeignRootIsRefusedEvenWithACheckpointToRestore(t *testing.T) {
	t.Parallel()
	fv, client := startFakeVerifier(t)
	a := newRelay(t, func(c *Config) { c.Backup = client })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("foreign", "acme", "first")
	sc := scope.Of(in)
	_, evs := a.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	a.waitDetached(sc)
	cp, err := a.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)
	runnerstatetest.SetRunnerInstance(t, filepath.Join(a.cfg.StateRoot, sc), "runner-replacement-sandbox")

	spec := &gatewayv1.RestoreSpec{CheckpointId: cp.GetCheckpoint().GetCheckpointId(), Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId()}
	_, err = a.openWith(ctx, "run-2", in, spec, &gatewayv1.PriorRun{RunId: "run-1", Status: "succeeded", Terminal: true, Input: in})
	require.EqualValues(t, failure.RunnerStateIdentityMismatch, failure.CodeOf(err), "%v", err)
	fv.mu.Lock()
	defer fv.mu.Unlock()
	require.Zero(t, fv.downloads, "nothing restored over it")
}

// SPEC F9, F8 (make test-chaos SEED=1: chaos-3-003, chaos-4-003 after a
// fail-back): gateway A launched a runner for run-1 and its host died
// before the executor recorded that runner; run-1's next attempt ran on B
// with a fresh runner, which the scope went on with (run-2, a checkpoint).
// When the scope fails back onto A, A's root — its control plane names
// run-1 under a runner no record names, crashed, not suspended — is a
// branch the scope left: it is set aside and the checkpoint restored.
// Before, the durable-state rules judged it (prior run run-1 ended, its
// runner not suspended): quarantined, and the run failed.
func TestF9_ARootCutOffInARunThatAnotherRunnerFinishedIsSetAsideForTheCheckpoint(t *testing.T) {
	t.Parallel()
	fv, client := startFakeVerifier(t)
	withBackup := func(c *Config) { c.Backup = client }
	a, b := newRelay(t, withBackup), newRelay(t, withBackup)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("cutoff", "acme", "first")
	sc := scope.Of(in)
	prompt := func(p string) *prpv1.ExecutionInput {
		c := proto.Clone(in).(*prpv1.ExecutionInput)
		c.Task.Prompt = p
		return c
	}

	// On A: run-1's runner, then A's host dies (runnerd and its provider
	// killed -9; the root keeps a crashed, unsuspended runner state).
	_, evs := a.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	a.waitDetached(sc)
	cut := a.runner(sc)
	require.NotNil(t, cut)
	for _, p := range []*prpv1.ProcessInfo{cut.GetProviderProcess(), cut.GetRunnerProcess()} {
		if pg := p.GetPgid(); pg > 0 {
			_ = syscall.Kill(-int(pg), syscall.SIGKILL)
		}
		if pid := p.GetPid(); pid > 0 {
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
	}
	require.Eventually(t, func() bool {
		live, _ := a.g.localState(a.g.runnerFor(sc), sc)
		return !live
	}, 30*time.Second, 20*time.Millisecond, "A saw its runner die")

	// On B: run-1 again (its next attempt: a fresh runner), run-2, and a
	// verified suspension (the scope's checkpoint).
	_, evs = b.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	b.waitDetached(sc)
	served := b.runner(sc).GetRunnerInstanceId()
	require.NotEqual(t, cut.GetRunnerInstanceId(), served)
	b.prior = []*gatewayv1.PriorRun{terminalRun("run-1", in)}
	_, evs = b.turn(ctx, "run-2", nil, prompt("second"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	b.waitDetached(sc)
	cp, err := b.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)

	// Fail-back onto A: the executor's records name B's runner for both
	// runs; A's runner is named nowhere.
	spec := &gatewayv1.RestoreSpec{CheckpointId: cp.GetCheckpoint().GetCheckpointId(), Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId(),
		ServedRunnerIds: []string{served}}
	prior := []*gatewayv1.PriorRun{
		{RunId: "run-2", Status: "succeeded", Terminal: true, Input: prompt("second"), RunnerInstanceId: served},
		{RunId: "run-1", Status: "succeeded", Terminal: true, Input: in, RunnerInstanceId: served},
	}
	opened, err := a.openWith(ctx, "run-3", prompt("third"), spec, prior...)
	require.NoError(t, err)
	require.NotNil(t, opened)
	require.Equal(t, served, opened.GetRunnerInstanceId(), "the checkpoint's runner")
	fv.mu.Lock()
	downloads := fv.downloads
	fv.mu.Unlock()
	require.Equal(t, 1, downloads, "the checkpoint was restored")
	breaks, err := os.ReadDir(filepath.Join(a.cfg.StateRoot, sc, ContinuityBreaksDir))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "the cut-off root was set aside, not deleted")
	_, err = os.Stat(filepath.Join(a.cfg.StateRoot, "quarantine"))
	require.True(t, os.IsNotExist(err), "nothing quarantined")
}

// SPEC F9, R13 (make test-chaos SEED=1, chaos-0 after chaos-0-077: every
// later run failed with native_event_replay_conflict, the session wedged):
// gateway A's runner of a scope still runs while A is judged lost (its
// heartbeat lapsed under load); the scope moves to B from the checkpoint
// and goes on there under the same runner identity, and B checkpoints it.
// When the scope comes back to A, A's live runner is a stale copy whose
// journal reuses source seqs B's copy used: it is stopped, its root set
// aside and B's checkpoint restored. Before, A resumed the live runner.
func TestF9_ALiveRunnerSupersededByACheckpointTakenElsewhereIsStoppedAndTheCheckpointRestored(t *testing.T) {
	t.Parallel()
	fv, client := startFakeVerifier(t)
	withBackup := func(c *Config) { c.Backup = client }
	a, b := newRelay(t, withBackup), newRelay(t, withBackup)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("zombie", "acme", "first")
	sc := scope.Of(in)
	prompt := func(p string) *prpv1.ExecutionInput {
		c := proto.Clone(in).(*prpv1.ExecutionInput)
		c.Task.Prompt = p
		return c
	}
	specOf := func(r *gatewayv1.SuspendRunnerResponse) *gatewayv1.RestoreSpec {
		return &gatewayv1.RestoreSpec{CheckpointId: r.GetCheckpoint().GetCheckpointId(), Stamp: r.GetStamp(), LeaseId: r.GetLeaseId()}
	}
	downloads := func() int {
		fv.mu.Lock()
		defer fv.mu.Unlock()
		return fv.downloads
	}
	var ids []string
	ended := func(id string) {
		ids = append(ids, id)
		var prior []*gatewayv1.PriorRun
		for i := len(ids) - 1; i >= 0; i-- {
			prior = append(prior, &gatewayv1.PriorRun{RunId: ids[i], Status: "succeeded", Terminal: true, Input: prompt(ids[i])})
		}
		a.prior, b.prior = prior, prior
	}
	turn := func(rl *relay, runID string) string {
		_, evs := rl.turn(ctx, runID, nil, prompt(runID), nil)
		term := evs[len(evs)-1].GetPayload().AsMap()
		require.Equal(t, "succeeded", term["runTerminalState"], "%v", term)
		rl.waitDetached(sc)
		ended(runID)
		return term["finalMessage"].(string)
	}

	// On A: a turn, a verified suspension (checkpoint 1), and the next run
	// on the resumed runner, which stays live.
	turn(a, "run-1")
	cp1, err := a.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: prompt("run-1"), Reason: "idle"})
	require.NoError(t, err)
	turn(a, "run-2")
	require.True(t, a.runner(sc).GetConnected(), "A's runner is live")

	// A is judged lost: the scope moves to B from checkpoint 1, runs two
	// turns there and is checkpointed again (checkpoint 2, B's).
	_, err = b.openWith(ctx, "run-3", prompt("run-3"), specOf(cp1), b.prior...)
	require.NoError(t, err)
	b.waitDetached(sc)
	ended("run-3")
	turn(b, "run-4")
	require.Contains(t, turn(b, "run-5"), "4 earlier messages", "checkpoint 1's thread")
	cp2, err := b.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: prompt("run-5"), Reason: "idle"})
	require.NoError(t, err)
	require.Equal(t, 1, downloads())

	// Back on A, whose runner still runs: it is superseded.
	require.True(t, a.runner(sc).GetConnected(), "A's runner still runs")
	opened, err := a.openWith(ctx, "run-6", prompt("run-6"), specOf(cp2), a.prior...)
	require.NoError(t, err)
	require.NotNil(t, opened)
	require.False(t, opened.GetReused(), "not the live runner")
	require.Equal(t, 2, downloads(), "checkpoint 2 restored on A")
	a.waitDetached(sc)
	ended("run-6")
	require.Contains(t, turn(a, "run-7"), "6 earlier messages", "B's thread continued on A")
	breaks, err := os.ReadDir(filepath.Join(a.cfg.StateRoot, sc, ContinuityBreaksDir))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "the live runner's root was set aside, not deleted")
}

// A turn after an idle period checkpointed online (SPEC P6) opens with the
// checkpoint the gateway took from the live runner itself: the gateway
// knows the runner descends from it and needs no read of the root to tell
// (the read of the root's outbox was most of a turn-after-idle's extra
// time). A checkpoint the executor holds more events for than the runner
// produced through this gateway still gets the full check (SPEC F9), and
// the live runner, superseded, is replaced by the checkpoint.
func TestP6_AnOpenWithTheOnlineCheckpointTakenFromTheLiveRunnerReusesItWithoutReadingItsRoot(t *testing.T) {
	t.Parallel()
	fv, client := startFakeVerifier(t)
	rl := newRelay(t, func(c *Config) { c.Backup = client })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("online-own", "acme", "first")
	sc := scope.Of(in)
	r := rl.g.runnerFor(sc)
	scans := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.rootScans
	}
	downloads := func() int {
		fv.mu.Lock()
		defer fv.mu.Unlock()
		return fv.downloads
	}
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	rl.prior = []*gatewayv1.PriorRun{{RunId: "run-1", Status: "succeeded", Terminal: true, Input: in}}
	cp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-1", Reason: "idle", KeepRunning: true})
	require.NoError(t, err)
	require.True(t, cp.GetOnline())
	held := evs[len(evs)-1].GetSourceSeq()
	for _, ev := range cp.GetEvents() {
		held = max(held, ev.GetSourceSeq())
	}
	spec := &gatewayv1.RestoreSpec{CheckpointId: cp.GetCheckpoint().GetCheckpointId(), Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId(), MinSourceSeq: held}

	before := scans()
	opened, err := rl.openWith(ctx, "run-2", in, spec, rl.prior...)
	require.NoError(t, err)
	require.True(t, opened.GetReused(), "the live runner serves on")
	require.Equal(t, before, scans(), "the root was not read: the gateway took the checkpoint from this runner")
	rl.waitDetached(sc)

	// The executor holds more from the runner than this gateway relayed:
	// the scope ran on from the checkpoint elsewhere. Full check, and the
	// live runner is superseded by the checkpoint.
	spec.MinSourceSeq = held + 100
	opened, err = rl.openWith(ctx, "run-3", in, spec, rl.prior...)
	require.NoError(t, err)
	require.False(t, opened.GetReused(), "not the live runner")
	require.Equal(t, before+1, scans())
	require.Equal(t, 1, downloads(), "the checkpoint was restored")
}
