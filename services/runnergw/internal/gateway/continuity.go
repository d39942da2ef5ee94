package gateway

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// Continuity of a session scope's provider thread across gateways (SPEC
// F3). The executor knows whether a runner served the scope before; this
// gateway knows whether the scope's state is on its disk. A scope that
// should have state but has none here, and no verified checkpoint to
// restore, fails closed: starting a fresh provider session would silently
// drop the thread. Only an operator's ReplaceSession starts a fresh one.

// ContinuityBreaksDir holds the durable roots moved aside by a
// ReplaceSession, under the state root.
const ContinuityBreaksDir = "continuity-breaks"

// prepareContinuity applies the Open's continuity rules to scope sc under
// the scope's op lock, before any runner is launched: a pending replacement
// moves the scope's state aside; a restore spec restores the checkpoint
// when the scope has no state here; a scope that must have state and has
// none fails with runner_harness_state_mismatch.
func (g *Gateway) prepareContinuity(ctx context.Context, r *runner, sc string, open *gatewayv1.Open, log *slog.Logger) error {
	runID := open.GetRunId()
	if id := open.GetReplacementId(); id != "" {
		return g.replaceSession(ctx, r, sc, runID, id, log)
	}
	spec := open.GetRestore()
	live, hasState := g.localState(r, sc)
	if live {
		if spec == nil || !g.supersededLive(r, sc, spec, open.GetPriorRuns()) {
			return nil
		}
		log.Warn("the scope's live runner is not its current state: a checkpoint taken elsewhere while it ran here supersedes it; stopping it",
			"checkpoint_id", spec.GetCheckpointId(), "runner_instance_id", spec.GetStamp().GetRunnerInstanceId())
		if err := g.stopLiveRunner(ctx, r, sc); err != nil {
			return err
		}
		hasState = true
	}
	stale := hasState && spec != nil && g.olderStateOf(sc, spec, open.GetPriorRuns())
	if hasState && !stale {
		return nil
	}
	if !hasState && g.hasLegacyRoot(runID, open) {
		// The scope's state is under a legacy root name: durable.Prepare
		// migrates it into the scope (SPEC C4), nothing is restored.
		return nil
	}
	if spec != nil {
		if stale {
			log.Warn("the scope's local runner state is not its current checkpoint (it ran elsewhere since); restoring the checkpoint",
				"checkpoint_id", spec.GetCheckpointId())
		}
		if err := g.restore(ctx, r, sc, runID, open.GetInput().GetProvider().GetKind(), spec, stale); err != nil {
			log.Warn("restore refused", "checkpoint_id", spec.GetCheckpointId(), "err", err)
			return err
		}
		return nil
	}
	if open.GetContinuityRequired() && !g.hasLegacyRoot(runID, open) {
		log.Warn("session scope has no state here and no verified checkpoint; refusing a fresh provider session")
		err := failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch,
			"session scope %s served earlier runs, but its runner state is not on this gateway and it has no verified checkpoint; "+
				"nothing was started (ReplaceSession starts a fresh provider session)", sc)
		g.metrics.refused(err)
		return err
	}
	return nil
}

// hasLegacyRoot reports whether a legacy root of the run's session exists
// (durable.Prepare migrates it into the scope).
func (g *Gateway) hasLegacyRoot(runID string, open *gatewayv1.Open) bool {
	for _, name := range scope.FromRun(runID, open.GetInput()).LegacyRootNames() {
		if _, err := os.Lstat(filepath.Join(g.cfg.StateRoot, name)); err == nil {
			return true
		}
	}
	return false
}

// replaceSession applies ReplaceSession decision id for run runID: unless
// the scope's control plane already names the run (an earlier attempt
// applied it), a live runner of the scope is closed and the scope's
// durable root is moved to <state-root>/continuity-breaks/, so the run
// starts a fresh provider session on a fresh root.
func (g *Gateway) replaceSession(ctx context.Context, r *runner, sc, runID, id string, log *slog.Logger) error {
	root := g.stateDir(sc)
	cur, _, err := durable.ReadControlPlaneIdentity(root)
	if err == nil && cur != nil && cur.RunID == runID {
		return nil
	}
	r.mu.Lock()
	live := r.conn != nil
	r.mu.Unlock()
	if live {
		evs, err := g.controlCommand(ctx, r, sc, &prpv1.SessionClose{Reason: "warm native session replaced by operator"})
		if err != nil {
			return err
		}
		log.Info("live runner closed for a session replacement", "events_dropped", len(evs))
	}
	stopOrphanProviderHost(root)
	fi, err := os.Lstat(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
		return failure.New(codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe,
			"durable state root %s is a symlink or not a directory; it is left untouched", root)
	}
	dir := filepath.Join(g.cfg.StateRoot, ContinuityBreaksDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerContinuityBreakArchiveFailed, "%v", err)
	}
	dest := filepath.Join(dir, sc+"."+time.Now().UTC().Format("20060102T150405.000Z")+"."+id)
	if err := os.Rename(root, dest); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerContinuityBreakArchiveFailed,
			"moving the durable root of scope %s aside: %v", sc, err)
	}
	r.mu.Lock()
	r.ackedSeq, r.lastCmdSeq, r.instanceID = 0, 0, ""
	r.bound, r.attachSent = nil, 0
	r.mu.Unlock()
	log.Info("session replaced: the durable root was moved aside; a fresh provider session starts", "replacement_id", id, "archive", dest)
	return nil
}

// supersededLive reports whether the scope's live runner is a stale copy of
// the scope (SPEC F9, R13): its root is older than the Open's checkpoint by
// recorded order (olderStateOf) and that checkpoint was completed after the
// runner process started here — while it ran, the scope ran on from the
// same checkpoint line elsewhere (this gateway was judged lost under load
// and its run moved, make test-chaos SEED=1: chaos-0), so a checkpoint this
// gateway never took names the scope's state. Resuming the live runner
// would relay its journal, whose source seqs the moved runner reused, and
// every later run of the scope failed with native_event_replay_conflict.
func (g *Gateway) supersededLive(r *runner, sc string, spec *gatewayv1.RestoreSpec, prior []*gatewayv1.PriorRun) bool {
	r.mu.Lock()
	started := r.hello.GetRunnerProcess().GetStartedAt().AsTime()
	if r.hello.GetRunnerProcess().GetStartedAt() == nil {
		started = r.connectedAt
	}
	own := r.online.covers(r, spec)
	r.mu.Unlock()
	done := spec.GetStamp().GetCompletedAt()
	if done == nil || started.IsZero() || !done.AsTime().After(started) || own {
		return false
	}
	r.mu.Lock()
	r.rootScans++
	r.mu.Unlock()
	return g.olderStateOf(sc, spec, prior)
}

// onlineCheckpoint is a checkpoint this gateway took online from a live
// runner and marked in its root (SPEC P6).
type onlineCheckpoint struct {
	id         string
	gen        uint64
	instanceID string
}

// covers reports, with r.mu held, whether spec names the checkpoint this
// gateway took online from r's current connection, and the executor holds
// nothing from the runner beyond what it acknowledged through this gateway:
// the live runner then is the checkpoint or descends from it and produced
// at least spec.MinSourceSeq, which is what olderStateOf would find in the
// root (StaleRoot: same instance, marked checkpoint, Produced ≥
// MinSourceSeq), without reading the root's outbox. A connection since
// (another generation), another instance, another checkpoint or a higher
// MinSourceSeq (the scope ran on elsewhere) takes the full check.
func (o onlineCheckpoint) covers(r *runner, spec *gatewayv1.RestoreSpec) bool {
	return o.id != "" && r.conn != nil && o.gen == r.gen && o.id == spec.GetCheckpointId() &&
		o.instanceID != "" && o.instanceID == spec.GetStamp().GetRunnerInstanceId() &&
		spec.GetMinSourceSeq() <= r.ackedSeq
}

// stopLiveRunner stops the scope's live runner (its runnerd process group
// and its provider host) and waits until the gateway sees it gone, so that
// its root can be set aside.
func (g *Gateway) stopLiveRunner(ctx context.Context, r *runner, sc string) error {
	r.mu.Lock()
	child, hello := r.child, r.hello
	r.mu.Unlock()
	if child != nil {
		stopGroup(child.cmd.Process.Pid, child.done, time.Second)
	} else if p := hello.GetRunnerProcess(); processAlive(p) {
		stopGroup(int(p.GetPid()), pollExit(p), time.Second)
	}
	stopOrphanProviderHost(g.stateDir(sc))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if live, _ := g.localState(r, sc); !live {
			return nil
		}
		if time.Now().After(deadline) {
			return failure.New(codes.Unavailable, failure.NativeSessionSupervisorBusy,
				"the superseded live runner of scope %s did not stop", sc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
