package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// Online checkpoints (SPEC P6): the live runner of an idle session stages
// a consistent copy of its profile directories (runner.checkpoint: it runs
// on runnerd's loop, so nothing is written meanwhile, and answers once the
// copy is complete); the gateway archives the copy exactly as it archives
// a suspended root, uploads it, marks the root as descending from the
// checkpoint and removes the copy. The runner and its provider keep
// running. The scope's op lock is held throughout: a run that opens
// meanwhile waits for the checkpoint to end (a turn is never started
// against a half-taken snapshot), and a run already attached makes the
// runner refuse (turn_already_active) or the gateway refuse (the scope is
// serving a run): the checkpoint is abandoned, nothing is stored.

// checkpointStageDir is runnerd's stage of an online checkpoint inside
// the runner directory (runner.CheckpointStageDir).
const checkpointStageDir = "checkpoint-stage"

// checkpointOnline takes an online checkpoint of scope sc (root dir),
// whose runner r is connected, bound to lease.
func (g *Gateway) checkpointOnline(ctx context.Context, r *runner, dir, sc, lease string, in *prpv1.ExecutionInput, prof persistence, reason string) (*gatewayv1.SuspendRunnerResponse, error) {
	log := g.log.With("session_scope", sc)
	start := time.Now()
	r.mu.Lock()
	gen := r.gen
	r.mu.Unlock()
	body := &prpv1.RunnerCheckpoint{
		Reason: reason, Dirs: prof.dirs, Home: prof.home,
		Exclude: prof.exclude, Anywhere: prof.anywhere, Skip: runnerExclusions,
	}
	stageRoot := filepath.Join(dir, durable.RunnerDir, checkpointStageDir)
	events, res, err := g.command(ctx, r, sc, body, false)
	if err != nil {
		_ = os.RemoveAll(stageRoot)
		log.Warn("online checkpoint abandoned", "code", failure.CodeOf(err), "err", err)
		return nil, err
	}
	defer os.RemoveAll(stageRoot)
	staged := time.Since(start)
	checkpointHold("staged")
	rel := filepath.Clean(res.GetFields()["stage"].GetStringValue())
	if !strings.HasPrefix(rel, filepath.Join(durable.RunnerDir, checkpointStageDir)+string(filepath.Separator)) ||
		strings.Count(rel, string(filepath.Separator)) != 2 || strings.Contains(rel, "..") {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed,
			"the runner staged its checkpoint at %q, not under %s", rel, filepath.Join(durable.RunnerDir, checkpointStageDir))
	}
	stage := filepath.Join(dir, rel)
	st, err := readRunnerState(stage)
	if err != nil || st == nil {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed,
			"the staged checkpoint holds no readable runner state (%v)", err)
	}
	if st.Lifecycle != runnerstate.LifecycleSuspended || st.RunnerProcess != nil || st.ProviderProcess != nil {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed,
			"the staged runner state is %q with a recorded process; a checkpoint holds a suspended state", st.Lifecycle)
	}
	if st.Identity.SessionScope != sc {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessIdentityMismatch,
			"the runner state of scope %s names scope %s", sc, st.Identity.SessionScope)
	}
	receipt, err := g.upload(ctx, stage, sc, lease, in, st, prof)
	if err != nil {
		log.Warn("online checkpoint abandoned: upload failed", "code", failure.CodeOf(err), "err", err)
		return nil, err
	}
	id := receipt.GetCheckpoint().GetCheckpointId()
	checkpointHold("uploaded")
	if err := markCheckpoint(dir, id); err != nil {
		// The live root descends from the checkpoint either way; without
		// the mark a later Open with it restores it instead (F9 order).
		log.Warn("marking the checkpoint", "checkpoint_id", id, "err", err)
	} else {
		r.mu.Lock()
		if r.gen == gen && r.conn != nil {
			r.online = onlineCheckpoint{id: id, gen: gen, instanceID: st.Identity.RunnerInstanceID}
		}
		r.mu.Unlock()
	}
	log.Info("online checkpoint stored; the runner keeps running", "runner_instance_id", st.Identity.RunnerInstanceID,
		"checkpoint_id", id, "manifest_digest", receipt.GetCheckpoint().GetManifestDigest(), "lease_id", lease,
		"provider_thread_id", st.ProviderThreadID, "staged_in", staged.Round(time.Microsecond), "took", time.Since(start).Round(time.Microsecond))
	return &gatewayv1.SuspendRunnerResponse{
		SessionScope: sc, RunnerInstanceId: st.Identity.RunnerInstanceID, LeaseId: lease,
		ProviderThreadId: st.ProviderThreadID, Checkpoint: receipt.GetCheckpoint(), Stamp: receipt.GetStamp(),
		Events: events, Online: true,
	}, nil
}

// CheckpointHoldEnv names a directory for the crash tests of online
// checkpoints (a test hook; never set in production): at each phase
// (staged: runnerd answered with its copy; uploaded: the verifier stored
// it) for which <dir>/hold-<phase> exists, the gateway writes
// <dir>/at-<phase> and waits (at most a minute) for <dir>/release-<phase>,
// holding the scope's op lock as it does.
const CheckpointHoldEnv = "TETHER_RUNNERGW_TEST_CHECKPOINT_HOLD_DIR"

// The paths are under the test hook's directory (gosec G703 below).
func checkpointHold(phase string) {
	dir := os.Getenv(CheckpointHoldEnv)
	if dir == "" {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "hold-"+phase)); err != nil { //nolint:gosec // test hook
		return
	}
	_ = os.WriteFile(filepath.Join(dir, "at-"+phase), nil, 0o600) //nolint:gosec // test hook
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "release-"+phase)); err == nil { //nolint:gosec // test hook
			return
		}
	}
}
