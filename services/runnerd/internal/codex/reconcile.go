package codex

import (
	"context"
	"strconv"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// Reconciliation outcomes (see package provider).
const (
	ReconcileRetained     = provider.ReconcileRetained
	ReconcileTerminalized = provider.ReconcileTerminalized
	ReconcileMissing      = provider.ReconcileMissing
)

// Reconciliation is the result of ReconcileTurn.
type Reconciliation struct {
	TurnID       string
	Outcome      string // retained | terminalized | missing
	Status       string // provider status: inProgress | completed | failed | interrupted | ""
	FinalMessage string
}

// ReconcileTurn reads the open thread (thread/read includeTurns:true) and
// settles a turn that the caller persisted as active before a provider or
// runner restart: retained when the provider still runs it, terminalized
// when the provider finished it (completed, failed or interrupted — a turn
// cut off by a provider crash reads back as interrupted), and a recoverable
// provider_turn_missing error when the thread has no such turn.
func (s *Session) ReconcileTurn(ctx context.Context, turnID string) (Reconciliation, error) {
	rec := Reconciliation{TurnID: turnID}
	if turnID == "" {
		return rec, errorf(failure.ProviderReconcileFailed, "no turn id to reconcile")
	}
	thread, turns, err := s.readTurns(ctx)
	if err != nil {
		return rec, err
	}
	var turn *codexwire.Turn
	for i := range turns {
		if turns[i].ID == turnID {
			turn = &turns[i]
		}
	}
	if turn == nil {
		rec.Outcome = ReconcileMissing
		return rec, errorf(failure.ProviderTurnMissing, "thread %s has no turn %s; the turn was never recorded by the provider (recoverable)", thread, turnID)
	}
	rec.Status = turn.Status
	rec.FinalMessage = lastAgentText(turn.Items)
	if rec.Status == "inProgress" {
		s.mu.Lock()
		switch {
		case s.turn == nil:
			s.turn = &turnState{id: turnID, started: true}
		case s.turn.id != turnID:
			other := s.turn.id
			s.mu.Unlock()
			return rec, errorf(failure.ProviderTurnActive, "turn %s is active, not %s", other, turnID)
		}
		s.mu.Unlock()
		rec.Outcome = ReconcileRetained
		return rec, nil
	}

	res2 := TurnResult{TurnID: turnID, FinalMessage: rec.FinalMessage}
	evType := "turn.failed"
	switch rec.Status {
	case TurnCompleted:
		res2.Status, evType = TurnCompleted, "turn.completed"
	case TurnInterrupted:
		res2.Status, evType = TurnInterrupted, "turn.interrupted"
	default:
		res2.Status = TurnFailed
		res2.ErrorCode = failure.ProviderTurnFailed
		res2.ErrorMessage = "provider reported turn status " + strconv.Quote(rec.Status)
		if e := turn.Error; e != nil && e.Message != "" {
			res2.ErrorMessage = truncate(e.Message, 4096)
		}
	}
	payload := map[string]any{"status": res2.Status, "finalMessage": rec.FinalMessage, "reconciled": true,
		"usage": map[string]any{"inputTokens": int64(0), "cachedInputTokens": int64(0), "outputTokens": int64(0)}}
	if res2.Status == TurnFailed {
		payload["error"] = map[string]any{"code": res2.ErrorCode, "message": res2.ErrorMessage}
	}

	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	if s.failErr != nil {
		err := s.failErr
		s.mu.Unlock()
		return rec, err
	}
	if s.turn != nil && s.turn.id == turnID {
		s.turn = nil
	}
	s.mu.Unlock()
	s.expireRequests(turnID, failure.TurnEnded, true)
	s.emitFn(Event{Type: evType, TurnID: turnID, Priority: PriorityP0, Payload: payload})
	s.deliverTurn(res2)
	rec.Outcome = ReconcileTerminalized
	return rec, nil
}

// readTurns reads the open thread's turns, oldest first (thread/read
// includeTurns:true).
func (s *Session) readTurns(ctx context.Context) (string, []codexwire.Turn, error) {
	thread, err := s.openThread()
	if err != nil {
		return "", nil, err
	}
	raw, rpcErr, err := s.call(ctx, codexwire.MethodThreadRead, codexwire.ThreadReadParams{ThreadID: thread, IncludeTurns: true}, s.cfg.RequestTimeout, nil)
	if err != nil {
		return thread, nil, err
	}
	if rpcErr != nil {
		return thread, nil, errorf(failure.ProviderReconcileFailed, "thread/read: %s", rpcErr.Describe())
	}
	var res struct {
		Thread struct {
			Turns []codexwire.Turn `json:"turns"`
		} `json:"thread"`
	}
	if !isObject(raw) || decodeParams(raw, &res) != nil {
		return thread, nil, errorf(failure.ProviderProtocolError, "thread/read result is not a JSON object")
	}
	return thread, res.Thread.Turns, nil
}

// LastTurn returns the id of the open thread's newest turn ("" when the
// thread has none): after a runnerd restart that cut a turn/start short,
// it tells whether the provider recorded a turn for it.
func (s *Session) LastTurn(ctx context.Context) (string, error) {
	_, turns, err := s.readTurns(ctx)
	if err != nil || len(turns) == 0 {
		return "", err
	}
	return turns[len(turns)-1].ID, nil
}

// DropTurn removes turnID and every later turn from the open thread's
// durable history (thread/revert, codex 0.169.0: "replace a paginated
// thread's durable history with the prefix before one turn"; local file
// changes are not reverted). SPEC R12: a cut-off turn is dropped before its
// retry so the thread holds the user's message once.
func (s *Session) DropTurn(ctx context.Context, turnID string) error {
	thread, err := s.openThread()
	if err != nil {
		return err
	}
	_, rpcErr, err := s.call(ctx, codexwire.MethodThreadRevert, codexwire.ThreadRevertParams{ThreadID: thread, BeforeTurnID: turnID}, s.cfg.RequestTimeout, nil)
	if err != nil {
		return err
	}
	if rpcErr != nil {
		return errorf(failure.ProviderError, "thread/revert: %s", rpcErr.Describe())
	}
	return nil
}
