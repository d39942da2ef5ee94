package api

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// GetSession describes a company's session, one entry per scope.
func (s *Server) GetSession(ctx context.Context, req *executorv1.GetSessionRequest) (*executorv1.GetSessionResponse, error) {
	groups, err := s.Store.Sessions(ctx, req.GetCompanyId(), req.GetNormalizedSessionId())
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, failure.New(codes.NotFound, failure.SessionNotFound, "company %q has no session %q", req.GetCompanyId(), req.GetNormalizedSessionId())
	}
	out := &executorv1.GetSessionResponse{}
	for _, g := range groups {
		sess := &executorv1.Session{
			SessionScope: g.Scope, CompanyId: req.GetCompanyId(), NormalizedSessionId: req.GetNormalizedSessionId(),
			AgentId: g.Last.GetInput().GetBinding().GetAgentId(), LastRunId: g.Last.GetRunId(), LastRunState: g.Last.GetState(),
			RunnerInstanceId: g.Last.GetRunnerInstanceId(), RunnerProcess: g.Last.GetRunnerProcess(),
			ProviderProcess: g.Last.GetProviderProcess(), RunCount: g.Count,
		}
		if g.Active != nil {
			sess.ActiveRunId, sess.LiveOwner = g.Active.GetRunId(), g.Active.GetLeaseOwner()
		}
		cp, err := s.Store.LatestCheckpoint(ctx, g.Scope)
		if err != nil {
			return nil, err
		}
		sess.Checkpoint = cp
		if sess.Replacements, err = s.Store.Replacements(ctx, g.Scope); err != nil {
			return nil, err
		}
		if p, err := s.Store.ScopePlacement(ctx, g.Scope, s.gatewayTTL()); err != nil {
			return nil, err
		} else if p != nil {
			sess.GatewayId = p.GatewayID
		}
		if r := s.runner(ctx, g.Scope, g.Last.GetRunnerInstanceId()); r != nil {
			// A connected runner's view is the live one: no provider
			// process once the provider died (not the last run's record
			// of a dead pid).
			sess.Lifecycle, sess.RunnerConnected = r.GetLifecycle(), r.GetConnected()
			if r.GetConnected() || r.GetProviderProcess() != nil {
				sess.ProviderProcess = r.GetProviderProcess()
			}
		}
		out.Sessions = append(out.Sessions, sess)
	}
	return out, nil
}

// gateway returns the gateway session scope sc is placed on.
func (s *Server) gateway(ctx context.Context, sc string) (gatewayv1.RunnerGatewayClient, error) {
	if s.Gateways != nil {
		return s.Gateways.ForScope(ctx, sc)
	}
	if s.Gateway == nil {
		return nil, failure.New(codes.Unavailable, failure.RunnerGatewayUnavailable, "no gateway configured")
	}
	return s.Gateway, nil
}

func (s *Server) runner(ctx context.Context, sc, id string) *gatewayv1.Runner {
	if id == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	gw, err := s.gateway(cctx, sc)
	if err != nil {
		return nil
	}
	resp, err := gw.GetRunner(cctx, &gatewayv1.GetRunnerRequest{RunnerInstanceId: id})
	if err != nil {
		return nil
	}
	return resp.GetRunner()
}

// CloseSession closes the session's idle, connected runners: each stops its
// provider and exits (its state stays on disk, so a later run resumes the
// provider thread); each scope closed (or with nothing live) stops counting
// as a warm session against its company's max_warm_sessions (SPEC Q1).
// With suspend, each scope gets a verified suspension whose stamped
// checkpoint is recorded (SPEC R5). A scope with a run queued or in flight
// refuses with native_session_supervisor_busy and nothing is closed.
func (s *Server) CloseSession(ctx context.Context, req *executorv1.CloseSessionRequest) (*executorv1.CloseSessionResponse, error) {
	groups, err := s.Store.Sessions(ctx, req.GetCompanyId(), req.GetNormalizedSessionId())
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, failure.New(codes.NotFound, failure.SessionNotFound, "company %q has no session %q", req.GetCompanyId(), req.GetNormalizedSessionId())
	}
	for _, g := range groups {
		if g.Open {
			return nil, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
				"session %q has a run queued or in flight; close it after the run ends", req.GetNormalizedSessionId())
		}
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "session closed by request"
	}
	out := &executorv1.CloseSessionResponse{}
	if req.GetSuspend() {
		// R5: a verified suspension per scope, recorded like an idle close.
		if s.Suspender == nil {
			return nil, failure.New(codes.Unavailable, failure.RunnerGatewayUnavailable, "no gateway configured")
		}
		for _, g := range groups {
			cp, err := s.suspendEndedScope(ctx, req, g, reason)
			if failure.CodeOf(err) == failure.RunnerStateMissing {
				continue // the scope never got a runner: nothing to suspend
			}
			if err != nil {
				return nil, err
			}
			out.ClosedRunnerInstanceIds = append(out.ClosedRunnerInstanceIds, cp.GetRunnerInstanceId())
			out.Checkpoints = append(out.Checkpoints, cp)
		}
		return out, nil
	}
	for _, g := range groups {
		id := g.Last.GetRunnerInstanceId()
		r := s.runner(ctx, g.Scope, id)
		switch {
		case r != nil && r.GetConnected():
			if err := s.closeEndedScope(ctx, req, g, reason); err != nil {
				return nil, err
			}
			out.ClosedRunnerInstanceIds = append(out.ClosedRunnerInstanceIds, r.GetRunnerInstanceId())
		case r == nil && id != "":
			continue // its gateway did not answer: it may still run
		case r != nil && r.GetLifecycle() != "exited" && r.GetLifecycle() != "suspended":
			continue // disconnected for now, not gone: it may come back
		}
		// Closed, or nothing live: the session no longer counts as warm
		// against the company's max_warm_sessions (SPEC Q1).
		if err := s.Store.RecordSessionClosed(ctx, g.Scope, g.LastKey); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// closeEndedScope closes the runner of g, a scope whose runs all ended. The
// gateway may still hold the attachment of its last run (the run's terminal
// is persisted before the run detaches) and answer
// native_session_supervisor_busy: that passes, so the close is retried for
// as long as the scope has no run queued or in flight.
func (s *Server) closeEndedScope(ctx context.Context, req *executorv1.CloseSessionRequest, g store.SessionRuns, reason string) error {
	retry := backoff.Backoff{Min: 20 * time.Millisecond, Max: time.Second}
	for {
		err := s.closeRunner(ctx, g.Scope, g.LastKey, g.Last.GetInput(), reason)
		if failure.CodeOf(err) != failure.NativeSessionSupervisorBusy {
			return err
		}
		groups, serr := s.Store.Sessions(ctx, req.GetCompanyId(), req.GetNormalizedSessionId())
		if serr != nil || scopeOpen(groups, g.Scope) || !backoff.Sleep(ctx, retry.Next()) {
			return err
		}
	}
}

// suspendEndedScope is a verified suspension of g, a scope whose runs all
// ended. As for closeEndedScope, the gateway may still hold the attachment
// of its last run and answer native_session_supervisor_busy: the
// suspension is retried for as long as the scope has no run queued or in
// flight (a suspension right after a run ended failed make test-providers'
// codex-stack once in ten runs).
func (s *Server) suspendEndedScope(ctx context.Context, req *executorv1.CloseSessionRequest, g store.SessionRuns, reason string) (*executorv1.SessionCheckpoint, error) {
	retry := backoff.Backoff{Min: 20 * time.Millisecond, Max: time.Second}
	for {
		cp, err := s.Suspender.Suspend(ctx, g.Scope, g.LastKey, g.Last.GetInput(), reason, true)
		if failure.CodeOf(err) != failure.NativeSessionSupervisorBusy {
			return cp, err
		}
		groups, serr := s.Store.Sessions(ctx, req.GetCompanyId(), req.GetNormalizedSessionId())
		if serr != nil || scopeOpen(groups, g.Scope) || lastRunOf(groups, g.Scope) != g.LastKey || !backoff.Sleep(ctx, retry.Next()) {
			return nil, err
		}
	}
}

// lastRunOf is the key of the last run of scope sc among groups.
func lastRunOf(groups []store.SessionRuns, sc string) string {
	for _, g := range groups {
		if g.Scope == sc {
			return g.LastKey
		}
	}
	return ""
}

func scopeOpen(groups []store.SessionRuns, sc string) bool {
	for _, g := range groups {
		if g.Scope == sc {
			return g.Open
		}
	}
	return false
}

// closeRunner closes the scope's live runner through the gateway
// (session.close: the runner settles as suspended, so the scope's next run
// continues it) and files what the runner emitted meanwhile under its runs.
func (s *Server) closeRunner(ctx context.Context, sc, runID string, in *prpv1.ExecutionInput, reason string) error {
	gw, err := s.gateway(ctx, sc)
	if err != nil {
		return err
	}
	resp, err := gw.CloseRunner(ctx, &gatewayv1.CloseRunnerRequest{Input: in, RunId: runID, Reason: reason})
	if err != nil {
		return err
	}
	if evs := resp.GetEvents(); len(evs) > 0 {
		if _, err := s.Store.AppendEvents(ctx, store.Fence{}, evs); err != nil {
			return err
		}
	}
	return nil
}

// ReplaceSession records an operator's decision to give up the provider
// thread of each scope of the session (or the agent's); the scope's next run
// applies it (SPEC F3).
// replaceBusyWait bounds how long ReplaceSession waits for a scope whose
// run is held by a claim: a waiting run's claim lasts milliseconds; a run
// really in flight still refuses after it.
const replaceBusyWait = 3 * time.Second

func (s *Server) ReplaceSession(ctx context.Context, req *executorv1.ReplaceSessionRequest) (*executorv1.ReplaceSessionResponse, error) {
	groups, err := s.Store.Sessions(ctx, req.GetCompanyId(), req.GetNormalizedSessionId())
	if err != nil {
		return nil, err
	}
	out := &executorv1.ReplaceSessionResponse{}
	for _, g := range groups {
		if a := req.GetAgentId(); a != "" && g.Last.GetInput().GetBinding().GetAgentId() != a {
			continue
		}
		rr := store.ReplacementRequest{
			Scope: g.Scope, CompanyID: req.GetCompanyId(), SessionID: req.GetNormalizedSessionId(),
			RequestedBy: authz.Actor(ctx, req.GetRequestedBy()), Caller: authz.Actor(ctx, grpcx.PeerIdentity(ctx)), Reason: req.GetReason(),
		}
		rp, err := s.Store.RecordReplacement(ctx, rr)
		// A run waiting for its lost gateway (the very case a replacement
		// is for, SPEC F7) is claimed now and then and handed straight
		// back; a claim that holds it this moment is not a run in flight:
		// wait it out (briefly) rather than refuse.
		retry := backoff.Backoff{Min: 20 * time.Millisecond, Max: 250 * time.Millisecond}
		for deadline := time.Now().Add(replaceBusyWait); failure.CodeOf(err) == failure.NativeSessionSupervisorBusy &&
			time.Now().Before(deadline) && backoff.Sleep(ctx, retry.Next()); {
			rp, err = s.Store.RecordReplacement(ctx, rr)
		}
		if err != nil {
			return nil, err
		}
		out.Replacements = append(out.Replacements, rp)
	}
	if len(out.Replacements) == 0 {
		return nil, failure.New(codes.NotFound, failure.SessionNotFound, "company %q has no session %q (agent %q)",
			req.GetCompanyId(), req.GetNormalizedSessionId(), req.GetAgentId())
	}
	return out, nil
}
