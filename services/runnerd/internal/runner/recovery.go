package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-run/tether/pkg/runnerstate"
)

// Provider loss mid-turn (SPEC R7). When the provider of an active turn is
// lost — it exited under a live runnerd, or it did not survive a runnerd
// restart — the turn is never failed for good on the spot and never started
// a second time behind the controller's back: the provider is restarted,
// the thread resumed, and the turn reconciled from the provider's own
// record (thread/read):
//
//   - finished (completed, or failed by the provider) → its recorded result
//     is the turn's result; no new turn/start;
//   - still in progress → retained, tracked as the active turn;
//   - missing, or cut off by the crash (it reads back interrupted without an
//     interrupt having been asked), or the provider cannot be restarted →
//     the turn is lost: runnerd emits the P0 turn.lost event (no
//     run.terminal) and the controller ends the attempt retryably
//     (native_session_interrupted); its retry starts the turn under a new
//     command id on the resumed thread.

// EventTurnLost is the P0 event of a turn lost with its provider.
const EventTurnLost = "turn.lost"

// recoverTurn reconciles t after its provider was lost; cause is the loss
// (code and message: the provider's own signal or exit status).
func (r *Runner) recoverTurn(t *runnerstate.Turn, code, cause string) {
	r.log.Warn("provider lost during a turn; restarting it to reconcile the turn", "turn_id", t.TurnID, "run_id", t.RunID, "cause", cause)
	r.emit(P1, "provider.restarting", "", "", map[string]any{
		"reason": "provider_lost", "runId": t.RunID, "turnId": t.TurnID, "providerThreadId": r.st.ProviderThreadID,
	})
	if e := r.startProvider(false); e != nil {
		r.loseTurn(t, code, fmt.Sprintf("%s; the provider could not be restarted: %s", cause, e.msg), "restart_failed")
		return
	}
	rp, ok := r.prov.(TurnReconciler)
	if !ok {
		r.loseTurn(t, code, cause+"; the provider cannot reconcile turns", "unsupported")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	outcome, status, err := rp.ReconcileTurn(ctx, t.TurnID)
	r.pumpProviderEvents()
	switch {
	case err != nil:
		if outcome == "" {
			outcome = "failed"
		}
		r.loseTurn(t, code, fmt.Sprintf("%s; reconciling turn %s: %v", cause, t.TurnID, err), outcome)
	case outcome == ReconcileRetained:
		r.log.Info("the restarted provider still runs the turn; retained", "turn_id", t.TurnID)
	case outcome == ReconcileTerminalized:
		r.settleReconciled(ctx, t, code, cause, status)
	default:
		r.loseTurn(t, code, fmt.Sprintf("%s; reconciliation of turn %s: %s", cause, t.TurnID, outcome), outcome)
	}
}

// settleReconciled takes the result of a turn the provider recorded as
// finished: completed or failed is the turn's result (one run.terminal, no
// new turn/start); interrupted without an interrupt asked is a turn cut off
// by the loss, which is lost.
func (r *Runner) settleReconciled(ctx context.Context, t *runnerstate.Turn, code, cause, status string) {
	var res TurnResult
	select {
	case res = <-r.prov.TurnDone():
	case <-ctx.Done():
		r.loseTurn(t, code, fmt.Sprintf("%s; the reconciled result of turn %s did not arrive", cause, t.TurnID), ReconcileTerminalized)
		return
	}
	if res.Status == "interrupted" && r.interruptAsked != t.TurnID {
		r.loseTurn(t, code, fmt.Sprintf("%s; turn %s was cut off (the provider records it %s)", cause, t.TurnID, status), "interrupted")
		return
	}
	r.log.Info("the provider had finished the turn; its recorded result ends it", "turn_id", t.TurnID, "status", res.Status)
	r.onTurnDone(res)
}

// reannounceLost emits turn.lost again for the turn a resent turn.start
// (prev, its stored outcome) started, when that turn was lost: the
// controller that resends it took the run over and may not have recorded
// the loss (it persisted the event, then died).
func (r *Runner) reannounceLost(prev *runnerstate.CommandRecord) {
	if prev.CommandType != CmdTurnStart || prev.Status != runnerstate.StatusCompleted {
		return
	}
	turnID, _ := prev.Result["turnId"].(string)
	lt := r.st.LostTurns[turnID]
	if lt == nil || (r.st.ActiveTurn != nil && r.st.ActiveTurn.TurnID == turnID) {
		return
	}
	r.log.Info("a resent turn.start names a lost turn; announcing the loss again", "turn_id", turnID, "run_id", lt.RunID)
	r.emitAll([]pendingEvent{{prio: P0, typ: EventTurnLost, turnID: turnID, runID: lt.RunID, payload: lt.Payload}})
}

// loseTurn ends the active turn t as lost: the P0 turn.lost (labelled with
// the turn's run) tells the controller to end the attempt retryably; no
// run.terminal is emitted, so the run goes on under its next attempt.
func (r *Runner) loseTurn(t *runnerstate.Turn, code, msg, reconciliation string) {
	r.log.Warn("turn lost with its provider; the controller retries it", "turn_id", t.TurnID, "run_id", t.RunID,
		"reconciliation", reconciliation, "cause", msg)
	payload := map[string]any{
		"code": code, "message": msg, "providerTurnId": t.TurnID, "providerThreadId": r.st.ProviderThreadID,
		"reconciliation": reconciliation, "retryable": true, "attempt": float64(t.Attempt),
	}
	r.emitAll([]pendingEvent{{prio: P0, typ: EventTurnLost, turnID: t.TurnID, runID: t.RunID, payload: payload}})
	r.st.NoteLostTurn(t.TurnID, &runnerstate.LostTurn{RunID: t.RunID, Payload: payload, LostAt: time.Now().UTC()})
	if r.st.ActiveTurn == t {
		r.st.ActiveTurn = nil
	}
	r.mustSave()
	r.lastActivity = time.Now()
}
