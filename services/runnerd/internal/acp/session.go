package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/acp/acpwire"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// OpenThread opens the ACP session: threadID "" creates one (session/new)
// under a new record id, which it returns; otherwise threadID must be the
// record id of the state in StateDir, whose identity must match this
// configuration (SPEC R11), and the agent session is loaded (session/load,
// its history replay is not re-emitted). Either way the agent is switched
// to the permission mode's agent mode and the requested model.
func (s *Session) OpenThread(ctx context.Context, threadID string) (string, bool, error) {
	want := Identity{
		Kind: "acpx", Agent: s.cfg.Agent, RecordID: threadID, ProfileDigest: s.cfg.ProfileDigest,
		WorkspaceDigest: WorkspaceDigest(s.cfg.Dir), RequestedModel: s.cfg.Model, PermissionMode: s.cfg.PermissionMode,
	}
	s.mu.Lock()
	open := s.st != nil
	s.mu.Unlock()
	if open {
		return "", false, &Error{Code: failure.ProviderThreadAlreadyOpen, Message: "the ACP session is already open"}
	}
	if threadID == "" {
		return s.newSession(ctx, want)
	}
	return s.loadSession(ctx, want)
}

func (s *Session) newSession(ctx context.Context, want Identity) (string, bool, error) {
	res, rpcErr, err := s.conn.Call(ctx, acpwire.MethodSessionNew, acpwire.NewSessionParams{Cwd: s.cfg.Dir, MCPServers: []json.RawMessage{}}, s.cfg.RequestTimeout, nil)
	if err != nil {
		return "", false, err
	}
	if rpcErr != nil {
		return "", false, &Error{Code: failure.ProviderThreadStartFailed, Message: "session/new: " + rpcErr.String()}
	}
	var ans acpwire.SessionResponse
	if err := json.Unmarshal(res, &ans); err != nil || ans.SessionID == "" {
		return "", false, &Error{Code: failure.ProviderProtocolError, Message: "session/new answered without a sessionId"}
	}
	id := want
	id.RecordID = newRecordID()
	id.AgentSessionID, id.BackendSessionID = ans.SessionID, ans.SessionID
	st := &State{Identity: id}
	if err := s.configure(ctx, st, ans); err != nil {
		return "", false, err
	}
	if err := writeState(s.cfg.StateDir, st); err != nil {
		return "", false, &Error{Code: failure.RunnerStateWriteFailed, Message: "ACP state: " + err.Error()}
	}
	s.opened(st, false)
	return id.RecordID, false, nil
}

func (s *Session) loadSession(ctx context.Context, want Identity) (string, bool, error) {
	st, err := ReadState(s.cfg.StateDir)
	if err != nil {
		return "", false, err
	}
	if st == nil {
		return "", false, &Error{Code: failure.ProviderThreadResumeFailed, Message: "no ACP session record " + want.RecordID + " in the state directory"}
	}
	if err := CheckIdentity(st.Identity, want); err != nil {
		return "", false, err
	}
	if !s.loadable {
		return "", false, &Error{Code: failure.ProviderThreadResumeFailed, Message: "the agent cannot load sessions (agentCapabilities.loadSession is false)"}
	}
	s.mu.Lock()
	s.loading = true
	s.mu.Unlock()
	endLoad := func(*jsonrpc.Reply) {
		s.mu.Lock()
		s.loading = false
		s.mu.Unlock()
	}
	res, rpcErr, err := s.conn.Call(ctx, acpwire.MethodSessionLoad,
		acpwire.LoadSessionParams{SessionID: st.Identity.AgentSessionID, Cwd: s.cfg.Dir, MCPServers: []json.RawMessage{}}, s.cfg.RequestTimeout, endLoad)
	if err != nil {
		endLoad(nil)
		return "", false, err
	}
	if rpcErr != nil {
		return "", false, &Error{Code: failure.ProviderThreadResumeFailed, Message: fmt.Sprintf("session/load %s: %s", st.Identity.AgentSessionID, rpcErr.String())}
	}
	var ans acpwire.SessionResponse
	_ = json.Unmarshal(res, &ans)
	if ans.SessionID != "" && ans.SessionID != st.Identity.AgentSessionID {
		return "", false, &Error{Code: failure.ProviderThreadResumeMismatch,
			Message: fmt.Sprintf("session/load of %s answered for session %s", st.Identity.AgentSessionID, ans.SessionID)}
	}
	if err := s.configure(ctx, st, ans); err != nil {
		return "", false, err
	}
	if err := writeState(s.cfg.StateDir, st); err != nil {
		return "", false, &Error{Code: failure.RunnerStateWriteFailed, Message: "ACP state: " + err.Error()}
	}
	s.opened(st, true)
	return st.Identity.RecordID, true, nil
}

// configure switches the session to the permission mode's agent mode and
// the requested model. It fails closed when the agent offers modes but not
// the one needed, or does not offer the requested model.
func (s *Session) configure(ctx context.Context, st *State, ans acpwire.SessionResponse) error {
	sid := st.Identity.AgentSessionID
	mode := AgentMode(s.cfg.Agent, s.cfg.PermissionMode)
	switch {
	case ans.Modes == nil || mode == "":
		s.send(Event{Type: "harness.diagnostic", Priority: P1, Payload: map[string]any{
			"code": failure.ProviderConfigInvalid, "message": "the agent reports no session modes; permission requests are still answered by " + s.cfg.PermissionMode}})
	case ans.Modes.CurrentModeID != mode:
		if !slices.ContainsFunc(ans.Modes.AvailableModes, func(m acpwire.SessionMode) bool { return m.ID == mode }) {
			return &Error{Code: failure.ProviderConfigInvalid, Message: fmt.Sprintf("the agent offers no mode %q for permission mode %s", mode, s.cfg.PermissionMode)}
		}
		if err := s.set(ctx, acpwire.MethodSessionSetMode, acpwire.SetModeParams{SessionID: sid, ModeID: mode}); err != nil {
			return err
		}
	}
	st.AgentMode = mode
	effective := ""
	if ans.Models != nil {
		effective = ans.Models.CurrentModelID
	}
	if m := s.cfg.Model; m != "" && m != effective {
		var offered []string
		if ans.Models != nil {
			for _, am := range ans.Models.AvailableModels {
				offered = append(offered, am.ModelID)
			}
		}
		if !slices.Contains(offered, m) {
			return &Error{Code: failure.ProviderConfigInvalid, Message: fmt.Sprintf("the agent does not offer model %q (offered: %s)", m, strings.Join(offered, ", "))}
		}
		if err := s.set(ctx, acpwire.MethodSessionSetModel, acpwire.SetModelParams{SessionID: sid, ModelID: m}); err != nil {
			return err
		}
		effective = m
	}
	st.Identity.EffectiveModel = effective
	return nil
}

func (s *Session) set(ctx context.Context, method string, params any) error {
	_, rpcErr, err := s.conn.Call(ctx, method, params, s.cfg.RequestTimeout, nil)
	if err != nil {
		return err
	}
	if rpcErr != nil {
		return &Error{Code: failure.ProviderConfigInvalid, Message: method + ": " + rpcErr.String()}
	}
	return nil
}

func (s *Session) opened(st *State, resumed bool) {
	s.mu.Lock()
	s.st = st
	s.mu.Unlock()
	s.send(Event{Type: "session.started", Priority: P0, Payload: map[string]any{
		"threadId": st.Identity.RecordID, "providerSessionId": st.Identity.RecordID, "agentSessionId": st.Identity.AgentSessionID,
		"resumed": resumed, "model": st.Identity.EffectiveModel, "agent": st.Identity.Agent, "agentMode": st.AgentMode,
		"permissionMode": st.Identity.PermissionMode,
	}})
	s.log.Info("acp: session open", "record_id", st.Identity.RecordID, "agent_session_id", st.Identity.AgentSessionID, "resumed", resumed)
}

// Steer is not possible: ACP has no way to add a message to an active
// turn, so the capability is reported unsupported (SPEC E9, R11).
func (s *Session) Steer(context.Context, string, string) error {
	return &Error{Code: failure.SteeringUnsupported, Message: "ACP agents cannot take a message into an active turn"}
}

// LastTurn is the newest turn the state records ("" for none).
func (s *Session) LastTurn(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil || len(s.st.Turns) == 0 {
		return "", nil
	}
	return s.st.Turns[len(s.st.Turns)-1].TurnID, nil
}

// ReconcileTurn settles a turn that was active when its agent process (or
// runnerd) was lost, from the durable state: still running here →
// retained; recorded as finished → terminalized (its result is delivered
// on TurnDone); recorded as started only → missing (the agent process that
// ran it is gone, and ACP cannot tell how far it got), which the runner
// retries on the loaded session. A terminalized turn's turn.<status>
// event (payload reconciled:true) is emitted before its result is
// delivered, as the codex and OpenCode drivers do: the events the lost
// process emitted for it may never have been journaled.
func (s *Session) ReconcileTurn(_ context.Context, turnID string) (string, string, error) {
	s.mu.Lock()
	if s.active != nil && s.active.id == turnID {
		s.mu.Unlock()
		return ReconcileRetained, "", nil
	}
	var rec *TurnRecord
	if s.st != nil {
		if r := s.st.turn(turnID); r != nil {
			c := *r
			rec = &c
		}
	}
	s.mu.Unlock()
	if rec == nil || rec.Status == "started" {
		return ReconcileMissing, "", &Error{Code: failure.ProviderTurnMissing, Message: "turn " + turnID + " did not finish in the lost agent process"}
	}
	res := TurnResult{TurnID: rec.TurnID, Status: rec.Status, FinalMessage: rec.FinalMessage, ErrorCode: rec.ErrorCode, ErrorMessage: rec.ErrorMessage}
	if rec.Usage != nil {
		res.Usage = *rec.Usage
	}
	if rec.Total != nil {
		total := *rec.Total
		res.Total = &total
	}
	if rec.Cost != nil {
		res.Cost = &provider.Cost{Amount: rec.Cost.Amount, Currency: rec.Cost.Currency}
	}
	s.send(Event{Type: "turn." + res.Status, TurnID: res.TurnID, Priority: P0, Payload: turnPayload(res, rec.StopReason, true)})
	s.deliver(res)
	return ReconcileTerminalized, rec.Status, nil
}

func (s *Session) deliver(r TurnResult) {
	select {
	case s.turnDone <- r:
	case <-time.After(time.Minute):
		s.log.Error("acp: turn result not taken", "turn_id", r.TurnID)
	}
}
