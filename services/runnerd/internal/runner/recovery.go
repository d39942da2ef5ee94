package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"

	"google.golang.org/protobuf/proto"
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
const EventTurnLost = prp.EventTurnLost

// recoverTurn reconciles t after its provider was lost; cause is the loss
// (code and message: the provider's own signal or exit status).
func (r *Runner) recoverTurn(t *runnerstate.Turn, code, cause string) {
	r.log.Warn("provider lost during a turn; restarting it to reconcile the turn", "turn_id", t.TurnID, "run_id", t.RunID, "cause", cause)
	r.emitBody(P1, prp.EventProviderRestarting, "", &prpv1.ProviderRestarting{
		Reason: "provider_lost", RunId: t.RunID, TurnId: t.TurnID, ProviderThreadId: r.st.ProviderThreadID,
	})
	if e := r.startProvider(context.Background(), false); e != nil {
		r.loseTurn(t, code, fmt.Sprintf("%s; the provider could not be restarted: %s", cause, e.msg), "restart_failed")
		return
	}
	r.reconcileTurn(t, code, cause)
}

// reconcileTurn settles t, the active turn, on the running provider from
// its thread's record: retained, its recorded result, or lost.
func (r *Runner) reconcileTurn(t *runnerstate.Turn, code, cause string) {
	rp, ok := r.sup.prov.(TurnReconciler)
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
		history := ""
		if outcome == ReconcileMissing {
			// A provider that can drop turns reads its own thread: the
			// turn is not in it. Another (the ACP agents: their driver
			// state only says the turn had not ended) may hold the prompt.
			history = HistoryKept
			if _, ok := r.sup.prov.(TurnDropper); ok {
				history = HistoryAbsent
			}
		}
		r.loseTurnWith(t, code, fmt.Sprintf("%s; reconciling turn %s: %v", cause, t.TurnID, err), outcome, history)
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
	case res = <-r.sup.prov.TurnDone():
	case <-ctx.Done():
		r.loseTurn(t, code, fmt.Sprintf("%s; the reconciled result of turn %s did not arrive", cause, t.TurnID), ReconcileTerminalized)
		return
	}
	if res.Status == "interrupted" && r.interruptAsked != t.TurnID {
		msg := fmt.Sprintf("%s; turn %s was cut off (the provider records it %s)", cause, t.TurnID, status)
		history, why := r.dropTurn(ctx, t.TurnID)
		if why != "" {
			msg += "; " + why
		}
		r.loseTurnWith(t, code, msg, "interrupted", history)
		return
	}
	if u, ok := r.journaledUsage(t.TurnID); ok && res.Usage == (Usage{}) {
		res.Usage = u
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
	if cmd, _ := lt.Payload["commandId"].(string); cmd != "" && cmd != prev.CommandID {
		// The loss is of an earlier turn of that id, another command's
		// (a restarted provider may number its turns anew): this
		// command's turn was not lost.
		return
	}
	r.log.Info("a resent turn.start names a lost turn; announcing the loss again", "turn_id", turnID, "run_id", lt.RunID)
	r.emitAll([]pendingEvent{{prio: P0, typ: EventTurnLost, turnID: turnID, runID: lt.RunID, payload: lt.Payload}})
}

// loseTurn ends the active turn t as lost: the P0 turn.lost (labelled with
// the turn's run) tells the controller to end the attempt retryably; no
// run.terminal is emitted, so the run goes on under its next attempt.
func (r *Runner) loseTurn(t *runnerstate.Turn, code, msg, reconciliation string) {
	r.loseTurnWith(t, code, msg, reconciliation, "")
}

// dropTurn removes the cut-off turn turnID from the provider's history
// before its retry (SPEC R12): HistoryDropped, or HistoryKept with why.
func (r *Runner) dropTurn(ctx context.Context, turnID string) (history, why string) {
	d, ok := r.sup.prov.(TurnDropper)
	if !ok {
		return HistoryKept, "the provider cannot drop a turn from its history: the retry's prompt follows the cut-off one"
	}
	if err := d.DropTurn(ctx, turnID); err != nil {
		r.log.Warn("dropping the cut-off turn from the provider's history failed; the history keeps it", "turn_id", turnID, "err", err)
		return HistoryKept, fmt.Sprintf("dropping it from the provider's history failed: %v", err)
	}
	r.log.Info("the cut-off turn was dropped from the provider's history", "turn_id", turnID)
	return HistoryDropped, ""
}

// loseTurnWith is loseTurn recording what became of the turn in the
// provider's history (providerHistory; "" when unknown).
func (r *Runner) loseTurnWith(t *runnerstate.Turn, code, msg, reconciliation, history string) {
	r.log.Warn("turn lost with its provider; the controller retries it", "turn_id", t.TurnID, "run_id", t.RunID,
		"reconciliation", reconciliation, "cause", msg)
	body := &prpv1.TurnLost{
		Code: code, Message: msg, ProviderTurnId: t.TurnID, ProviderThreadId: r.st.ProviderThreadID,
		Reconciliation: reconciliation, Retryable: true, Attempt: uint32(t.Attempt), CommandId: t.CommandID,
		ProviderHistory: history,
	}
	r.emitAll([]pendingEvent{{prio: P0, typ: EventTurnLost, turnID: t.TurnID, runID: t.RunID, body: body}})
	// The state keeps the payload to announce the loss again (its JSON
	// form, as the event carries it).
	var payload map[string]any
	if s, err := prp.Payload(body); err == nil {
		payload = s.AsMap()
	}
	r.st.NoteLostTurn(t.TurnID, &runnerstate.LostTurn{RunID: t.RunID, Payload: payload, LostAt: time.Now().UTC()})
	if r.st.ActiveTurn == t {
		r.st.ActiveTurn = nil
	}
	r.mustSave()
	r.lastActivity = time.Now()
}

// reconcileCutTurnStart settles a turn.start whose intent was journaled but
// whose outcome was not, because runnerd died in between (SPEC R8: a crash
// at any moment). The provider (re-attached, or restarted on the thread)
// tells from its thread whether the turn/start reached it: when the
// thread's newest turn is one runnerd already knows, it did not, and the
// command is marked unexecuted so the controller's resent one runs (the
// provider turn still starts once); otherwise that newest turn is this
// command's: it is recorded as the command's result and reconciled like a
// turn lost with its provider (retained, its recorded result, or lost and
// retried under a new command id). When the provider cannot tell, the
// command stays indeterminate (never executed again).
func (r *Runner) reconcileCutTurnStart(rec *runnerstate.CommandRecord) {
	log := r.log.With("command_id", rec.CommandID, "run_id", rec.RunID)
	if r.st.ActiveTurn != nil {
		return // a turn is known active: the command's answer is indeterminate
	}
	if ex, ok := r.journaledExecution(rec.CommandID); ok {
		// runnerd reported the execution (command.executed, journaled
		// with the turn's first events) before it died: the report is
		// the command's outcome, whatever the thread reads back now — an
		// id is executed once (SPEC X1).
		if ex.turnID == "" {
			// The start failed: the command keeps the outcome it had
			// before runnerd died — a refusal by the provider stays
			// permanent, a provider lost during the start (its host died
			// with runnerd's) stays retryable: the controller retries
			// the turn under a new command id (SPEC R7, R13).
			code, msg := ex.code, ex.msg
			if code == "" {
				code, msg = failure.ProviderTurnStartFailed, "the provider refused the turn before runnerd restarted"
			}
			log.Info("a turn.start cut short by the runnerd restart had failed at the provider; it stays failed", "code", code)
			rec.Reopen(runnerstate.StatusFailed, code, msg, nil)
			r.mustSave()
			return
		}
		if e := r.ensureProvider(context.Background()); e != nil {
			log.Warn("a turn.start cut short by the runnerd restart stays indeterminate: no provider", "err", e.msg)
			return
		}
		r.adoptCutTurn(rec, ex.turnID)
		return
	}
	if r.st.ProviderThreadID == "" {
		// turn/start follows the thread's opening, which is saved first.
		log.Info("a turn.start cut short by the runnerd restart never reached the provider (no thread yet); it runs when resent")
		rec.Reopen(runnerstate.StatusUnexecuted, "", "", nil)
		r.mustSave()
		return
	}
	if e := r.ensureProvider(context.Background()); e != nil {
		log.Warn("a turn.start cut short by the runnerd restart stays indeterminate: no provider", "err", e.msg)
		return
	}
	rp, ok := r.sup.prov.(TurnReconciler)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	last, err := rp.LastTurn(ctx)
	cancel()
	if err != nil {
		r.pumpProviderEvents()
		log.Warn("a turn.start cut short by the runnerd restart stays indeterminate: thread/read failed", "err", err)
		return
	}
	if last == "" || r.knownTurn(last) {
		r.pumpProviderEvents()
		log.Info("a turn.start cut short by the runnerd restart never reached the provider; it runs when resent", "newest_turn", last)
		rec.Reopen(runnerstate.StatusUnexecuted, "", "", nil)
		r.mustSave()
		return
	}
	// The provider events queued meanwhile (the adopted turn's, replayed by
	// the provider host) are taken once the turn is adopted: they are the
	// cut command's run's, whatever run the state still names attached.
	r.adoptCutTurn(rec, last)
}

// adoptCutTurn records turn last, which the cut turn.start rec started, as
// the command's result, and reconciles it unless its end is journaled.
func (r *Runner) adoptCutTurn(rec *runnerstate.CommandRecord, last string) {
	log := r.log.With("command_id", rec.CommandID, "run_id", rec.RunID)
	rec.Reopen(runnerstate.StatusCompleted, "", "", outcomeMap(&prpv1.CommandOutcome{TurnId: last, ProviderThreadId: proto.String(r.st.ProviderThreadID)}))
	r.st.LastTurnID = last
	if r.turnEndJournaled(last) {
		// The turn ran to its end (or its loss) before runnerd died; only
		// the command's outcome had not been saved.
		log.Info("a turn.start cut short by the runnerd restart had started a turn that already ended", "turn_id", last)
		r.mustSave()
		return
	}
	log.Warn("a turn.start cut short by the runnerd restart had started a turn; reconciling it", "turn_id", last)
	t := &runnerstate.Turn{TurnID: last, RunID: rec.RunID, Attempt: rec.Attempt, CommandID: rec.CommandID, StartedAt: time.Now().UTC()}
	r.st.ActiveTurn = t
	r.mustSave()
	r.reconcileTurn(t, failure.ProviderProcessLost, "runnerd restarted while the turn was being started") // takes the queued events first
}

// execution is what a journaled command.executed reports.
type execution struct {
	turnID string // the turn the command started; empty when the start failed
	// code and msg are the failed start's outcome ("" in a journal written
	// before runnerd reported them: a refusal).
	code, msg string
}

// journaledExecution returns the execution of command commandID the outbox
// holds (its command.executed event), if any.
func (r *Runner) journaledExecution(commandID string) (execution, bool) {
	for _, rec := range r.j.outbox.After(0) {
		if rec.EventType != EventCommandExecuted {
			continue
		}
		var env struct {
			Payload struct {
				CommandID string `json:"commandId"`
				TurnID    string `json:"turnId"`
				Failed    bool   `json:"failed"`
				Code      string `json:"code"`
				Message   string `json:"message"`
			} `json:"payload"`
		}
		if json.Unmarshal(rec.Envelope, &env) != nil || env.Payload.CommandID != commandID {
			continue
		}
		if env.Payload.Failed {
			return execution{code: env.Payload.Code, msg: env.Payload.Message}, true
		}
		return execution{turnID: env.Payload.TurnID}, true
	}
	return execution{}, false
}

// turnEndJournaled reports whether the outbox holds the end of turn turnID
// (its run.terminal or turn.lost).
func (r *Runner) turnEndJournaled(turnID string) bool {
	_, ok := r.journaledTurnEnd(turnID)
	return ok
}

// journaledTurnEnd returns the journaled end of turn turnID: its
// run.terminal or turn.lost (the event type, its run and payload). Only an
// end journaled after the turn's newest turn.started counts: a restarted
// provider may give a later turn the id of an ended one (the fake codex
// without durable ids, an ACP session's acp-turn-1), and that turn has not
// ended with the earlier one's end.
func (r *Runner) journaledTurnEnd(turnID string) (turnEnd, bool) {
	var found turnEnd
	ok := false
	for _, rec := range r.j.outbox.After(0) {
		if rec.EventType != prp.EventRunTerminal && rec.EventType != EventTurnLost && rec.EventType != "turn.started" {
			continue
		}
		var env turnEnd
		if json.Unmarshal(rec.Envelope, &env) != nil || env.TurnID != turnID {
			continue
		}
		if rec.EventType == prp.EventTurnStarted {
			found, ok = turnEnd{}, false
			continue
		}
		env.EventType = rec.EventType
		found, ok = env, true
	}
	return found, ok
}

// journaledRunEnd returns the run.terminal of run runID the outbox holds
// (journaled, not yet acknowledged), if any.
func (r *Runner) journaledRunEnd(runID string) (turnEnd, bool) {
	if runID == "" {
		return turnEnd{}, false
	}
	for _, rec := range r.j.outbox.After(0) {
		if rec.EventType != "run.terminal" {
			continue
		}
		var env turnEnd
		if json.Unmarshal(rec.Envelope, &env) == nil && env.RunID == runID {
			env.EventType = rec.EventType
			return env, true
		}
	}
	return turnEnd{}, false
}

// turnStartAttempt is the attempt of run runID whose turn.start started
// turn turnID (the command journal's record), or the highest attempt when
// no record names it (nothing is later).
func (r *Runner) turnStartAttempt(runID, turnID string) uint64 {
	var at uint64
	found := false
	for _, rec := range r.st.ProcessedCommands {
		if rec.CommandType != CmdTurnStart || rec.RunID != runID || rec.Status != runnerstate.StatusCompleted {
			continue
		}
		if id, _ := rec.Result["turnId"].(string); id == turnID {
			at, found = max(at, rec.Attempt), true
		}
	}
	if !found {
		return ^uint64(0)
	}
	return at
}

// turnEnd is the part of a journaled turn end runnerd reads back.
type turnEnd struct {
	EventType string         `json:"-"`
	TurnID    string         `json:"turnId"`
	RunID     string         `json:"runId"`
	Payload   map[string]any `json:"payload"`
}

// settleEndedTurn clears an active turn whose end the previous runnerd
// process journaled (and sent) before it died, before saving the state that
// clears it (SPEC R8: a crash at any moment). The turn is over: reconciling
// it again would end it a second time, and keeping it active would refuse
// the session's next run. A journaled turn.lost is noted as lost, as
// loseTurn would have saved it.
func (r *Runner) settleEndedTurn() {
	t := r.st.ActiveTurn
	if t == nil {
		return
	}
	end, ok := r.journaledTurnEnd(t.TurnID)
	if !ok {
		return
	}
	r.log.Info("the active turn had ended before the restart (its end is journaled); it is no longer active",
		"turn_id", t.TurnID, "run_id", t.RunID, "end", end.EventType)
	if end.EventType == EventTurnLost {
		r.st.NoteLostTurn(t.TurnID, &runnerstate.LostTurn{RunID: t.RunID, Payload: end.Payload, LostAt: time.Now().UTC()})
	}
	r.st.ActiveTurn = nil
}

// isTurnEvent reports whether typ is the event a provider driver emits
// when a turn ends (live, or reconciled after a loss): turn.<status>.
func isTurnEvent(typ string) bool {
	// (turn.cancelled, an older runner's, is no turn event of this one)
	return typ == prp.EventTurnCompleted || typ == prp.EventTurnFailed || typ == prp.EventTurnInterrupted
}

// turnEventJournaled reports whether turn turnID's turn.<status> event is
// journaled.
func (r *Runner) turnEventJournaled(turnID string) bool {
	te := r.st.LastTurnEvent
	return te != nil && te.TurnID == turnID
}

// recallTurnEvent takes the newest turn.<status> event the outbox holds
// into the state (LastTurnEvent), for a recovered state: the previous
// runnerd process may have journaled it after the last snapshot, and died
// before the turn's run.terminal; the turn's reconciliation must then not
// journal a second one (SPEC R7, X1). An event no longer in the outbox was
// acknowledged, so a snapshot written after it was journaled holds it. The
// rule is emitAll's (noteTurnEvent): the fact is the newest turn's.
func (r *Runner) recallTurnEvent() {
	for _, rec := range r.j.outbox.After(0) {
		if te := r.st.LastTurnEvent; te != nil && te.SourceSeq >= rec.SourceSeq {
			continue
		}
		if rec.EventType != prp.EventTurnStarted && !isTurnEvent(rec.EventType) {
			continue
		}
		var env struct {
			TurnID  string         `json:"turnId"`
			Payload map[string]any `json:"payload"`
		}
		if json.Unmarshal(rec.Envelope, &env) == nil {
			r.noteTurnEvent(rec.EventType, env.TurnID, rec.SourceSeq, env.Payload)
		}
	}
}

// noteTurnEvent keeps LastTurnEvent as the journal has it once an event of
// type typ (turn turnID, source seq, payload) is journaled: a turn.started
// clears it — a new turn, which a restarted provider may give the same id
// — and a turn.<status> names its turn. emitAll applies it as events are
// journaled, recallTurnEvent to what a previous process journaled.
func (r *Runner) noteTurnEvent(typ, turnID string, seq uint64, payload map[string]any) {
	r.streamed.note(typ, turnID, payload)
	switch {
	case typ == prp.EventTurnStarted:
		r.st.LastTurnEvent = nil
	case turnID != "" && isTurnEvent(typ):
		r.st.LastTurnEvent = &runnerstate.TurnEvent{TurnID: turnID, EventType: typ, SourceSeq: seq, Usage: turnUsageOf(payload)}
	}
}

// turnUsageOf reads the turn's own usage from a turn.<status> payload
// (usage: {inputTokens, cachedInputTokens, outputTokens}, as every driver
// reports it); nil when it has none.
func turnUsageOf(payload map[string]any) *runnerstate.TurnUsage {
	m, ok := payload["usage"].(map[string]any)
	if !ok {
		return nil
	}
	n := func(k string) int64 {
		switch v := m[k].(type) {
		case int64:
			return v
		case int:
			return int64(v)
		case float64:
			return int64(v)
		}
		return 0
	}
	return &runnerstate.TurnUsage{InputTokens: n("inputTokens"), CachedInputTokens: n("cachedInputTokens"), OutputTokens: n("outputTokens")}
}

// journaledUsage is the usage the journaled turn.<status> event of turnID
// reported, for a reconciled result that carries none (a provider's record
// may keep no usage: codex's thread/read does not): the turn's run.terminal
// then reports what its turn event did, not zero (SPEC E1).
func (r *Runner) journaledUsage(turnID string) (Usage, bool) {
	te := r.st.LastTurnEvent
	if te == nil || te.TurnID != turnID || te.Usage == nil {
		return Usage{}, false
	}
	return Usage{InputTokens: te.Usage.InputTokens, CachedInputTokens: te.Usage.CachedInputTokens, OutputTokens: te.Usage.OutputTokens}, true
}

// knownTurn reports whether a turn of the thread is one runnerd started (or
// learnt of) before.
func (r *Runner) knownTurn(id string) bool {
	if id == r.st.LastTurnID {
		return true
	}
	// Turn ids are the thread's: a fresh thread may number its turns anew
	// (an ACP session's acp-turn-1), so a turn of another thread with the
	// same id is not this one.
	ofThread := func(thread any) bool {
		t, _ := thread.(string)
		return t == "" || t == r.st.ProviderThreadID
	}
	if lt := r.st.LostTurns[id]; lt != nil && ofThread(lt.Payload["providerThreadId"]) {
		return true
	}
	for _, rec := range r.st.ProcessedCommands {
		if tid, _ := rec.Result["turnId"].(string); tid == id && ofThread(rec.Result["providerThreadId"]) {
			return true
		}
	}
	return false
}
