// Package suspend performs verified suspensions of warm sessions (SPEC R5):
// when a warm session's scope has had no open run for its idle timeout (or
// on CloseSession with suspend), one replica claims the scope's idle period
// in PostgreSQL, asks the runner gateway to suspend the runner and upload a
// checkpoint (RunnerGateway/SuspendRunner), and records the stamped
// checkpoint; a later run of the scope offers it to the gateway as its
// restore spec.
package suspend

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/session"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Suspender claims and suspends idle warm sessions.
type Suspender struct {
	Store *store.Store
	// Gateways gives a scope's gateway (SPEC F2); nil: every scope is on
	// Gateway.
	Gateways Gateways
	Gateway  gatewayv1.RunnerGatewayClient
	// Owner identifies this replica in suspension claims.
	Owner string
	// Interval is how often idle sessions are looked for (default 1s).
	Interval time.Duration
	// CheckpointAfter, when positive and shorter than a session's idle
	// timeout, takes a verified checkpoint of a warm session once it has
	// been idle this long after a settled run (SPEC F3: a lost gateway
	// host loses no turn settled longer ago). The checkpoint is online
	// (SPEC P6): the runner and its provider keep running, so the next run
	// is as warm as one that follows at once; only the idle timeout
	// suspends. A scope whose runner is not running is suspended instead.
	CheckpointAfter time.Duration
	// ClaimTTL bounds a claim; a replica that dies mid-suspension loses it
	// after this and another takes the scope over (default 3m, longer than
	// the gateway's own bound on a suspension).
	ClaimTTL time.Duration
	Logger   *slog.Logger
}

func (s *Suspender) defaults() {
	if s.Interval <= 0 {
		s.Interval = time.Second
	}
	if s.ClaimTTL <= 0 {
		s.ClaimTTL = 3 * time.Minute
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
}

// Gateways gives the gateway a session scope is placed on (fleet.Router).
type Gateways interface {
	ForScope(ctx context.Context, scope string) (gatewayv1.RunnerGatewayClient, error)
}

// ForScope returns the gateway of scope sc.
func (s *Suspender) ForScope(ctx context.Context, sc string) (gatewayv1.RunnerGatewayClient, error) {
	if s.Gateways == nil {
		if s.Gateway == nil {
			return nil, failure.New(codes.Unavailable, failure.RunnerGatewayUnavailable, "no gateway configured")
		}
		return s.Gateway, nil
	}
	return s.Gateways.ForScope(ctx, sc)
}

// Run sweeps for idle sessions every Interval until ctx ends.
func (s *Suspender) Run(ctx context.Context) {
	s.defaults()
	Every(ctx, s.Interval, s.Logger, "idle session sweep failed", s.Sweep)
}

// Every calls sweep every interval until ctx ends, logging a failed sweep
// as msg (the executor's background sweeps: idle suspensions, drains).
func Every(ctx context.Context, interval time.Duration, log *slog.Logger, msg string, sweep func(context.Context) (int, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := sweep(ctx); err != nil && ctx.Err() == nil {
			log.Error(msg, "err", err)
		}
	}
}

// Sweep suspends every warm session whose idle timeout has passed (one at
// a time); it returns how many it suspended.
func (s *Suspender) Sweep(ctx context.Context) (int, error) {
	s.defaults()
	idle, err := s.Store.IdleWarmSessions(ctx, 32)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, is := range idle {
		after, reason := s.suspendAfter(is)
		if is.IdleFor < after {
			continue
		}
		var (
			cp  *executorv1.SessionCheckpoint
			err error
		)
		if reason == session.ReasonCheckpoint {
			cp, err = s.Checkpoint(ctx, is.Scope, is.LastRunID, is.Input)
		} else {
			cp, err = s.suspend(ctx, nil, is.Scope, is.LastRunID, is.Input, reason, false, is.Checkpointed)
		}
		if err != nil {
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
			continue // logged and recorded; retried later
		}
		if cp != nil {
			n++
		}
	}
	return n, nil
}

// DefaultCheckpointAfter is the executor's -checkpoint-after default.
const DefaultCheckpointAfter = 5 * time.Second

// suspendAfter is how long the idle session waits for what is next in
// its idle period, and what that is: an online checkpoint after
// CheckpointAfter when shorter than its idle timeout
// (session.ReasonCheckpoint), its suspension at the idle timeout
// otherwise, and always once the period has its checkpoint.
func (s *Suspender) suspendAfter(is store.IdleSession) (time.Duration, string) {
	timeout := scope.ParamsOf(is.LastRunID, is.Input).Lifecycle.EffectiveIdleTimeout()
	if s.CheckpointAfter > 0 && s.CheckpointAfter < timeout && !is.Checkpointed && is.IdleFor < timeout {
		return s.CheckpointAfter, session.ReasonCheckpoint
	}
	return timeout, session.ReasonIdleTimeout
}

// Checkpoint takes an online checkpoint (SPEC P6) of scope's idle period
// that began when lastRunID ended, under a claim: the gateway has the live
// runner stage a copy of its state, stores and stamps it, and the runner
// and its provider keep running; the idle period is then checkpointed, and
// suspended only at its idle timeout. A scope whose runner is not running
// is suspended instead (the period is then suspended). It returns the
// recorded checkpoint; nil with a nil error when another replica holds the
// claim or there was nothing to claim.
func (s *Suspender) Checkpoint(ctx context.Context, sc, lastRunID string, in *prpv1.ExecutionInput) (*executorv1.SessionCheckpoint, error) {
	s.defaults()
	return s.claimed(ctx, nil, sc, lastRunID, in, session.ReasonCheckpoint, false, false, true)
}

// Suspend performs one verified suspension of scope's idle period that
// began when lastRunID ended, under a claim (force: also an idle period
// already suspended, for CloseSession). It returns the recorded checkpoint;
// nil with a nil error when another replica holds the claim or there was
// nothing to claim (not forced).
func (s *Suspender) Suspend(ctx context.Context, sc, lastRunID string, in *prpv1.ExecutionInput, reason string, force bool) (*executorv1.SessionCheckpoint, error) {
	return s.suspend(ctx, nil, sc, lastRunID, in, reason, force, false)
}

// SuspendToMove is Suspend (forced) on gateway gw for moving the scope off
// it (SPEC F4): after the checkpoint is stored the gateway moves the
// scope's runner state aside, so nothing stale is resumed there should the
// scope ever come back.
func (s *Suspender) SuspendToMove(ctx context.Context, gw gatewayv1.RunnerGatewayClient, sc, lastRunID string, in *prpv1.ExecutionInput, reason string) (*executorv1.SessionCheckpoint, error) {
	return s.suspend(ctx, gw, sc, lastRunID, in, reason, true, false)
}

// suspend suspends on gw (nil: the scope's gateway), with archive when gw
// is given; afterCheckpoint: the idle period has an online checkpoint.
func (s *Suspender) suspend(ctx context.Context, gw gatewayv1.RunnerGatewayClient, sc, lastRunID string, in *prpv1.ExecutionInput, reason string, force, afterCheckpoint bool) (*executorv1.SessionCheckpoint, error) {
	s.defaults()
	return s.claimed(ctx, gw, sc, lastRunID, in, reason, force, afterCheckpoint, false)
}

// claimed claims the idle period and suspends it (online: checkpoints it
// online, SPEC P6).
func (s *Suspender) claimed(ctx context.Context, gw gatewayv1.RunnerGatewayClient, sc, lastRunID string, in *prpv1.ExecutionInput, reason string, force, afterCheckpoint, online bool) (*executorv1.SessionCheckpoint, error) {
	log := s.Logger.With("session_scope", sc, "last_run_id", lastRunID)
	ok, err := s.Store.ClaimIdlePeriod(ctx, sc, lastRunID, s.Owner, s.ClaimTTL, force, afterCheckpoint)
	if err != nil {
		return nil, err
	}
	if !ok {
		if force {
			return nil, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
				"session scope %s is being suspended elsewhere, or a newer run took it", sc)
		}
		return nil, nil
	}
	finish := func(state, msg, checkpointID string) {
		if err := s.Store.FinishSuspension(context.WithoutCancel(ctx), sc, lastRunID, s.Owner, state, msg, checkpointID); err != nil {
			log.Error("recording the suspension outcome", "state", state, "err", err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.ClaimTTL)
	defer cancel()
	archive := gw != nil
	if gw == nil {
		gw, err = s.ForScope(cctx, sc)
	}
	var resp *gatewayv1.SuspendRunnerResponse
	if err == nil {
		resp, err = gw.SuspendRunner(cctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: lastRunID, Reason: reason, ArchiveState: archive, KeepRunning: online})
	}
	if err != nil {
		state := store.SuspensionFailed
		if failure.CodeOf(err) == failure.RunnerStateMissing {
			state = store.SuspensionSkipped
		}
		log.Warn("suspension failed", "state", state, "code", failure.CodeOf(err), "err", err)
		finish(state, err.Error(), "")
		return nil, err
	}
	cp, err := Record(ctx, s.Store, store.Fence{}, resp, sc, lastRunID, in, reason, log)
	if err != nil {
		log.Error("recording the checkpoint", "checkpoint_id", resp.GetCheckpoint().GetCheckpointId(), "err", err)
		finish(store.SuspensionFailed, err.Error(), "")
		return nil, err
	}
	if resp.GetOnline() {
		finish(store.SuspensionCheckpointed, "", cp.GetCheckpointId())
		log.Info("session checkpointed online; its runner keeps running", "checkpoint_id", cp.GetCheckpointId(),
			"manifest_digest", cp.GetManifestDigest(), "runner_instance_id", cp.GetRunnerInstanceId(), "lease_id", cp.GetLeaseId(), "reason", reason)
		return cp, nil
	}
	finish(store.SuspensionSuspended, "", cp.GetCheckpointId())
	log.Info("session suspended", "checkpoint_id", cp.GetCheckpointId(), "manifest_digest", cp.GetManifestDigest(),
		"runner_instance_id", cp.GetRunnerInstanceId(), "lease_id", cp.GetLeaseId(), "reason", reason)
	return cp, nil
}

// Record files what the runner emitted during a verified suspension under
// fence (SPEC R9: the run driving a configuration change) or, with a zero
// fence (an idle suspension: no run of the scope is open), parks it for the
// scope's next run; and records the suspension's stamped checkpoint as
// scope sc's, after run lastRunID of input in.
func Record(ctx context.Context, st *store.Store, fence store.Fence, resp *gatewayv1.SuspendRunnerResponse, sc, lastRunID string,
	in *prpv1.ExecutionInput, reason string, log *slog.Logger) (*executorv1.SessionCheckpoint, error) {
	if evs := resp.GetEvents(); len(evs) > 0 {
		if _, err := st.AppendEvents(ctx, fence, evs); err != nil {
			log.Warn("filing the suspension's events", "events", len(evs), "err", err)
		}
	}
	return st.RecordCheckpoint(ctx, store.CheckpointRecord{
		Scope: sc, CompanyID: in.GetBinding().GetCompanyId(), SessionID: in.GetSession().GetNormalizedSessionId(),
		LastRunID: lastRunID, GatewayScope: resp.GetSessionScope(), Stamp: resp.GetStamp(),
		CheckpointID: resp.GetCheckpoint().GetCheckpointId(), ManifestDigest: resp.GetCheckpoint().GetManifestDigest(),
		LeaseID: resp.GetLeaseId(), RunnerInstanceID: resp.GetRunnerInstanceId(), ProviderThreadID: resp.GetProviderThreadId(),
		Reason: reason,
	})
}
