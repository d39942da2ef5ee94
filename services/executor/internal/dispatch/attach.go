package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
	"github.com/tether-run/tether/services/executor/internal/session"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// attachment is one Attach stream of a claimed run: it opens the scope's
// runner under the claim's fencing token, writes the run's bookkeeping,
// pumps the runner's events into the run's log and answers its command
// results until the run is finished or the stream ends. Each step is a
// method; the fields are the state one stream carries between them.
type attachment struct {
	d        *Dispatcher
	c        *store.Claim
	gw       gatewayv1.RunnerGatewayClient // the scope's gateway
	log      *slog.Logger
	cancelCh <-chan *executorv1.Cancellation

	ctx    context.Context // the driver's: writes outlive the stream
	sctx   context.Context // the stream's
	cancel context.CancelFunc
	stream grpc.BidiStreamingClient[gatewayv1.AttachRequest, gatewayv1.AttachResponse]
	sendMu sync.Mutex // a gRPC stream's Send is not safe for concurrent use

	turnCmds []*prpv1.Command
	facts    *store.AttachFacts
	opened   *gatewayv1.Opened
	// early: the turn's commands were pipelined behind the Open.
	early bool
	// replaced, local: a warm session replacement is done, or pending on
	// local state (E10).
	replaced, local bool
	// bookkept delivers the outcome of the bookkeeping written while the
	// runner works on pipelined commands; nil once received.
	bookkept chan error

	live          *liveSession
	msgs          chan *gatewayv1.AttachResponse // read ahead; closed when the stream ends
	recvErr       error                          // why msgs closed
	held          *gatewayv1.AttachResponse      // read while coalescing, handled next
	cancelIntents map[string]string              // cancel command id → intent id, awaiting the runner's answer
	cancelMu      sync.Mutex                     // guards cancelSent (an acknowledgement that failed clears its entry)
	cancelSent    map[string]bool                // cancel command ids sent on this stream, answered or not
	acking        sync.WaitGroup                 // acknowledgements being written
	acks          *ackTracker
	terminalSeen  <-chan time.Time
	// turnStartedAt is when this attachment persisted its run's
	// turn.started (zero: not yet, or the turn started under another).
	turnStartedAt time.Time
}

// attachOnce runs one Attach stream; facts waits for the attach's facts,
// read beside the route (readFacts). done is true when the run needs no
// further driving (terminal, or failed and recorded).
func (d *Dispatcher) attachOnce(ctx context.Context, c *store.Claim, gw gatewayv1.RunnerGatewayClient,
	facts func() (*store.AttachFacts, error), cancelCh <-chan *executorv1.Cancellation, log *slog.Logger) (done bool, err error) {
	a := &attachment{d: d, c: c, gw: gw, log: log, cancelCh: cancelCh, ctx: ctx}
	a.sctx, a.cancel = context.WithCancel(ctx)
	defer a.cancel()
	// Nothing of this attach is written after it ends. Its outcome matters
	// to the events it precedes (onEvents); once the attach ended, a
	// failure (a lost fence) surfaces at the run's next fenced write.
	defer func() { _ = a.awaitBookkeeping() }()
	defer a.acking.Wait()
	if done, err := a.open(facts); done || err != nil {
		return done, err
	}
	if done, err := a.bookkeep(); done || err != nil {
		return done, err
	}
	if stop, err := a.replaceSession(); stop {
		// A failed close through the backup ended the attempt (recorded).
		return failure.CodeOf(err) == failure.WarmSessionCloseBackupFailed, err
	}
	if !a.early {
		if err := a.sendTurn(); err != nil {
			return false, err
		}
	}
	a.live = newLiveSession(c, a.send, a.opened.GetToolAuthorityEpoch())
	defer d.controls.Attach(c.RunID, a.live)()
	return a.pump()
}

func (a *attachment) send(req *gatewayv1.AttachRequest) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(req)
}

func (a *attachment) sendCmd(cmd *prpv1.Command) error {
	return a.send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: cmd}})
}

func (a *attachment) sendTurn() error {
	for _, cmd := range a.turnCmds {
		if err := a.sendCmd(cmd); err != nil {
			return err
		}
	}
	return nil
}

// open sends the Open (and, when fencing allows, the turn's commands behind
// it) and reads the gateway's Opened.
func (a *attachment) open(facts func() (*store.AttachFacts, error)) (done bool, err error) {
	c, d := a.c, a.d
	defer synctrace.Step("executor.open", c.RunID)()
	endStream := synctrace.Step("executor.stream", c.RunID)
	a.stream, err = a.gw.Attach(a.sctx)
	endStream()
	if err != nil {
		_, _ = facts()
		return false, err
	}
	resolved, err := d.resolveSecrets(a.ctx, c)
	if err == nil {
		a.turnCmds, err = turnCommands(c, resolved)
	}
	if err != nil {
		_, _ = facts()
		// No attach can send this run's turn: the attempt fails on record
		// (a driver that stopped silently would leave its lease to lapse
		// and the run to be claimed again, without end).
		d.recordFailure(a.ctx, c, err, a.log)
		return true, err
	}
	// One round trip reads what the Open carries and what the warm-session
	// decisions need. R5: the scope's current stamped checkpoint goes with
	// every Open; the gateway restores it only when the scope has no runner
	// state. E13: the gateway resumes the scope's durable root only for this
	// run or a prior run these database records prove terminal, of the same
	// full scope (and whose runner state on disk is suspended). E10: the
	// previous run of the scope pinned the live session's configuration.
	runScope := c.Scope()
	endFacts := synctrace.Step("executor.await_facts", c.RunID)
	a.facts, err = facts()
	endFacts()
	if err != nil {
		return false, err
	}
	open, err := a.buildOpen(runScope)
	if err != nil {
		return false, err
	}
	if err := a.send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil {
		return false, err
	}
	d.mu.Lock()
	a.replaced, a.local = d.replaced[c.RunID], d.localReplace[c.RunID]
	d.mu.Unlock()
	// The turn's commands go as early as fencing allows: the claim is
	// committed, the Open carries its fencing token, and the gateway reads
	// what follows the Open only once it opened the runner under that token
	// (the scope's control plane bound to this run) — it and the runner
	// refuse a lower attempt; the commands' ids carry no attempt, so a
	// takeover gets the runner's stored results, not a second turn. So they
	// are pipelined behind the Open unless the Opened answer may call for
	// closing the live session first (E10): a configuration other than the
	// previous run's, or a replacement on local state pending.
	a.early = a.replaced || (!configChanged(c, a.facts) && !a.local)
	if a.early {
		if err := a.sendTurn(); err != nil {
			return false, err
		}
	}
	return false, a.awaitOpened()
}

// awaitOpened reads the gateway's answer to the Open: Opened, or Closed
// with the reason the gateway refused it.
func (a *attachment) awaitOpened() error {
	endOpened := synctrace.Step("executor.await_opened", a.c.RunID)
	first, err := a.stream.Recv()
	endOpened()
	if err != nil {
		return err
	}
	if a.opened = first.GetOpened(); a.opened == nil {
		if cl := first.GetClosed(); cl != nil {
			return &closedError{cl.GetCode(), cl.GetMessage()}
		}
		return failure.New(codes.Internal, failure.RunnerProtocolError, "gateway answered Open with %T", first.GetKind())
	}
	a.log = a.log.With("runner_instance_id", a.opened.GetRunnerInstanceId())
	a.log.Info("attached", "reused", a.opened.GetReused(), "runner_acked_seq", a.opened.GetRunnerAckedSeq())
	return nil
}

// buildOpen is the run's Open: its identity, fencing token, target and
// input, the prior runs and continuity the attach facts hold, the one turn
// the attach may start and, when the scope has a stamped checkpoint, the
// restore it allows (or the operator's replacement).
func (a *attachment) buildOpen(runScope string) (*gatewayv1.Open, error) {
	c, d := a.c, a.d
	// F3: a scope a runner served before must find its state (on the
	// gateway's disk, or restored from the checkpoint) unless an operator
	// replaced the session, whose next run starts a fresh provider session.
	open := &gatewayv1.Open{
		RunId:              c.RunID,
		Fence:              &gatewayv1.FencingToken{Owner: c.Owner, Attempt: c.Attempt},
		Target:             RunnerTarget(c.Input),
		Input:              c.Input,
		PriorRuns:          store.PriorRunsProto(a.facts.PriorRuns),
		ContinuityRequired: a.facts.ContinuityRequired,
		// The one turn the attach may start, named in its grant (SPEC T4).
		Turn: grant.TurnDigest(commandID(c, prp.CommandTurnStart), c.Input.GetTask().GetPrompt()),
	}
	cp := a.facts.Checkpoint
	if cp == nil {
		// A run that was in flight on a gateway since lost restores the
		// checkpoint its attempt started from on its new gateway.
		cp = a.facts.Restorable
	}
	if rp := a.facts.Replacement; rp != nil {
		open.ReplacementId, open.ContinuityRequired = rp.GetReplacementId(), false
	} else if cp != nil && cp.GetStamp().GetSessionScope() == runScope {
		open.Restore = &gatewayv1.RestoreSpec{CheckpointId: cp.GetCheckpointId(), Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId()}
		// The highest seq held from the checkpoint's runner: a restored
		// runner continues above it (its runner may have emitted events
		// after the checkpoint, on a gateway since lost), and the gateway
		// orders a local root of that runner against it (SPEC F9: a root
		// that produced at least this much is not older than the
		// checkpoint and is resumed, R13). The runners that ever served
		// the scope let it tell a root left behind by a move, however
		// many runs ago, from a foreign one.
		// Read with the attach facts when cp is the current checkpoint (a
		// turn after an online checkpoint, SPEC P6: no round trip of its
		// own before the Open).
		var order store.RestoreOrder
		if co := a.facts.CheckpointOrder; co != nil && cp == a.facts.Checkpoint && co.RunnerInstanceID == cp.GetRunnerInstanceId() {
			order = co.RestoreOrder
		} else {
			var err error
			if order, err = d.store.RestoreOrderOf(a.ctx, runScope, cp.GetRunnerInstanceId()); err != nil {
				return nil, err
			}
		}
		open.Restore.MinSourceSeq, open.Restore.ServedRunnerIds = order.MinSourceSeq, order.ServedRunnerIDs
	}
	return open, nil
}

// localReplaced: the suspension for a configuration change stopped the
// runner but the checkpoint could not be stored; the runner came back on
// its local state with this run's configuration.
func (a *attachment) localReplaced() bool {
	return a.local && !a.replaced && !a.opened.GetReused()
}

// bookkeep records which runner and processes serve the run and the
// control plane (checkpoints superseded, the authority rotation and a
// session replacement on record). With the turn's commands pipelined, it is
// written while the runner works on them and committed before any of the
// runner's events is persisted (they follow it in the run's log; see
// awaitBookkeeping). Otherwise it is written before the live session may be
// closed.
func (a *attachment) bookkeep() (done bool, err error) {
	c, d, opened := a.c, a.d, a.opened
	var supersede string
	if a.facts.Checkpoint != nil || a.facts.Replacement != nil {
		// A runner serves this run now: its state moves on from the
		// checkpoint, which can no longer stand for the session.
		supersede = c.Scope()
	}
	var control []store.ControlEvent
	if rp := a.facts.Replacement; rp != nil {
		// F3: the operator's decision, applied: a fresh provider session,
		// on record as a legitimate continuity break (once per run).
		control = append(control, store.ControlEvent{Type: session.EventContinuityBreak, Replacement: rp.GetReplacementId(), Payload: &prpv1.SessionContinuityBreak{
			Reason: session.ReasonReplaced, ReplacementId: rp.GetReplacementId(), RequestedBy: rp.GetRequestedBy(),
			Caller: rp.GetCaller(), Why: rp.GetReason(), RequestedAt: rp.GetRequestedAt().AsTime().UTC().Format(time.RFC3339Nano),
			RunnerInstanceId: opened.GetRunnerInstanceId(),
		}})
	}
	if prev := opened.GetPreviousRunId(); prev != "" && prev != c.RunID {
		// E10: this run took the scope's run authority over from prev (a
		// live warm runner, or a verified continuation of prev's suspended
		// runner); prev's tool authority epoch is revoked.
		control = append(control, store.ControlEvent{Type: prp.EventSessionAuthorityRotated, Payload: &prpv1.SessionAuthorityRotated{
			Reason: session.ReasonAuthorityRotated, PreviousRunId: prev,
			RunnerInstanceId: opened.GetRunnerInstanceId(), ToolAuthorityEpoch: float64(opened.GetToolAuthorityEpoch()),
			DurableSource: opened.GetDurableSource(),
		}})
	}
	if a.localReplaced() {
		control = append(control, store.ControlEvent{Type: prp.EventSessionClosed, Payload: &prpv1.SessionClosed{Reason: CloseReasonConfigChanged}})
	}
	// One transaction: the control plane, then the runner serving the run.
	record := func() error {
		return d.store.RecordAttach(a.ctx, c.Fence, supersede, control, store.RunnerRecord{
			InstanceID: opened.GetRunnerInstanceId(), Runner: opened.GetRunnerProcess(), Provider: opened.GetProviderProcess()})
	}
	if a.early {
		a.bookkept = make(chan error, 1)
		go func() { a.bookkept <- record() }()
		return false, nil
	}
	if err := record(); err != nil {
		return failure.CodeOf(err) == failure.NativeSessionLeaseLost, err
	}
	return false, nil
}

// awaitBookkeeping waits for the pipelined bookkeeping, once.
func (a *attachment) awaitBookkeeping() error {
	if a.bookkept == nil {
		return nil
	}
	err := <-a.bookkept
	a.bookkept = nil
	return err
}

// replaceSession closes a warm provider session that serves another
// pinned configuration (E10: model, approval or permission, lifecycle,
// runtime context); the runner comes back with this run's configuration
// and resumes the same provider thread. stop is true when this attach ends
// here.
func (a *attachment) replaceSession() (stop bool, err error) {
	c, d := a.c, a.d
	if a.localReplaced() {
		d.mu.Lock()
		d.replaced[c.RunID] = true
		d.mu.Unlock()
	}
	if a.replaced || !configChanged(c, a.facts) {
		return false, nil
	}
	if !a.opened.GetReused() {
		// A runner launched for this run on the local state of a session
		// whose configuration changed, with no checkpoint to restore (the
		// runner had exited idle or crashed, or an earlier attempt's
		// suspension stopped it but its checkpoint failed), goes through
		// the backup too, never silently on the local state.
		cp := a.facts.Checkpoint
		restored := cp != nil && cp.GetStamp().GetSessionScope() == c.Scope()
		if restored || a.local || a.opened.GetDurableSource() == durableSourceFresh {
			return false, nil
		}
	}
	if !a.local {
		a.cancel() // detach: the scope's runner is suspended next
		err := d.replaceThroughBackup(a.ctx, c, a.gw, a.log)
		if failure.CodeOf(err) == failure.WarmSessionCloseBackupFailed {
			// Visible and retryable: the attempt ends here; the next one
			// closes the session through the backup again.
			d.recordFailure(a.ctx, c, err, a.log)
		}
		return true, err
	}
	return true, d.closeForReplacement(a.ctx, c, a.send, a.stream.Recv, a.opened.GetRunnerAckedSeq(), a.log)
}

// readAhead reads everything the gateway relays into msgs, so a group
// commit takes every batch that arrived while the previous one was being
// persisted. msgs is closed (after its last message) when the stream ends;
// recvErr says why.
func (a *attachment) readAhead() {
	a.msgs = make(chan *gatewayv1.AttachResponse, maxReadAhead)
	go func() {
		defer close(a.msgs)
		for {
			m, err := a.stream.Recv()
			if err != nil {
				a.recvErr = err
				return
			}
			select {
			case a.msgs <- m:
			case <-a.sctx.Done():
				a.recvErr = a.sctx.Err()
				return
			}
		}
	}()
}

// dispatchCancel sends a pending durable cancellation (E6) on this stream
// by command id (the runner executes an id at most once); it is sent again
// on every re-attach while pending, and acknowledged under the fence.
func (a *attachment) dispatchCancel(rec *executorv1.Cancellation) error {
	if rec == nil || rec.GetDispatchState() != "pending" {
		return nil
	}
	cmd := newCommand(a.c, &prpv1.TurnInterrupt{Reason: rec.GetReason()})
	cmd.CommandId = fmt.Sprintf("%s/cancel/%s", a.c.RunID, rec.GetIntentId())
	a.cancelMu.Lock()
	sent := a.cancelSent[cmd.CommandId]
	a.cancelSent[cmd.CommandId] = true
	a.cancelMu.Unlock()
	if sent {
		// A second kick (the local one and the notification), or one
		// that read the record before this stream's acknowledgement of
		// it committed: sent on this stream already. (An
		// acknowledgement that could not be written clears the entry:
		// the next CancelRun dispatches again.)
		return nil
	}
	a.cancelIntents[cmd.CommandId] = rec.GetIntentId()
	a.log.Info("dispatching cancellation", "intent_id", rec.GetIntentId())
	a.d.metrics.cancellations.WithLabelValues(cancelDispatched).Inc()
	return a.sendCmd(cmd)
}

// resetCancels starts the stream's cancellation bookkeeping.
func (a *attachment) resetCancels() {
	a.cancelMu.Lock()
	defer a.cancelMu.Unlock()
	a.cancelIntents, a.cancelSent = map[string]string{}, map[string]bool{}
}

// pump handles what the runner relays until the run is finished or the
// stream ends.
func (a *attachment) pump() (done bool, err error) {
	a.readAhead()
	a.resetCancels()
	a.acks = newAckTracker()
	// A cancellation recorded since facts were read kicks cancelCh.
	if err := a.dispatchCancel(a.facts.Cancellation); err != nil {
		return false, err
	}
	for {
		msg := a.held
		if msg != nil {
			a.held = nil
		} else {
			select {
			case <-a.ctx.Done():
				return true, context.Cause(a.ctx)
			case <-a.terminalSeen:
				a.log.Warn("cancellation dispatch unanswered after the terminal event; it stays pending")
				return a.finish()
			case rec := <-a.cancelCh:
				if rec == nil {
					var err error
					if rec, err = a.d.store.Cancellation(a.ctx, a.c.RunID); err != nil {
						return false, err
					}
				}
				if err := a.dispatchCancel(rec); err != nil {
					return false, err
				}
				continue
			case m, ok := <-a.msgs:
				if !ok {
					if a.terminalSeen != nil {
						return true, nil
					}
					return false, a.recvErr
				}
				msg = m
			}
		}
		var (
			stop bool
			done bool
			err  error
		)
		switch k := msg.GetKind().(type) {
		case *gatewayv1.AttachResponse_Events:
			stop, done, err = a.onEvents(k.Events.GetEvents())
		case *gatewayv1.AttachResponse_CommandResult:
			stop, done, err = a.onResult(k.CommandResult)
		case *gatewayv1.AttachResponse_Closed:
			return false, &closedError{k.Closed.GetCode(), k.Closed.GetMessage()}
		}
		if stop {
			return done, err
		}
	}
}

// coalesce adds every batch already waiting to evs (a group commit: the
// runner sends events as they happen); a message of another kind is held
// for the next turn of the pump.
func (a *attachment) coalesce(evs []*prpv1.Event) []*prpv1.Event {
	for len(evs) < maxCoalescedEvents {
		select {
		case m, ok := <-a.msgs:
			if !ok {
				return evs // the stream ended; handled next
			}
			if more := m.GetEvents(); more != nil {
				evs = append(evs, more.GetEvents()...)
				continue
			}
			a.held = m
			return evs
		default:
			return evs
		}
	}
	return evs
}

// onEvents persists a group of the runner's events, acknowledges them to
// the runner and ends the attach on the run's terminal or a lost turn.
func (a *attachment) onEvents(evs []*prpv1.Event) (stop, done bool, err error) {
	c, d := a.c, a.d
	evs = a.coalesce(evs)
	if err := a.awaitBookkeeping(); err != nil {
		return true, failure.CodeOf(err) == failure.NativeSessionLeaseLost, err
	}
	// The live session follows the runner's events before they are
	// persisted: a watcher may act on them (e.g. answer a runtime request
	// of the active turn) as soon as they are committed.
	for _, ev := range evs {
		a.live.observe(ev)
	}
	// Cancellations dispatched here are acknowledged with the run's
	// terminal, should this batch persist it (SPEC P2).
	var intents []string
	for _, intent := range a.cancelIntents {
		intents = append(intents, intent)
	}
	res, err := d.store.AppendEventsAcking(a.ctx, c.Fence, evs, intents)
	if err != nil {
		switch failure.CodeOf(err) {
		case failure.NativeEventReplayConflict:
			a.log.Error("replay conflict", "err", err)
			d.recordFailure(a.ctx, c, err, a.log)
			return true, true, err
		case failure.NativeSessionLeaseLost:
			return true, true, err
		}
		return true, false, err
	}
	for _, m := range res.RuntimeInputs {
		adapter := m.Adapter
		if adapter == runtimeq.Unknown {
			adapter = c.Input.GetProvider().GetKind() // the run's adapter
		}
		d.metrics.runtimeQuestions.WithLabelValues(m.Outcome, adapter).Inc()
	}
	for inst, seq := range a.acks.persisted(a.opened.GetRunnerAckedSeq(), evs) {
		if err := a.send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
			SourceInstanceId: inst, PersistedThroughSeq: seq,
		}}}); err != nil {
			return true, false, err
		}
	}
	if lost := lostTurn(evs, c.RunID, commandID(c, "turn.start")); lost != nil {
		// The runner lost the turn with its provider (SPEC R7): the attempt
		// ends retryably and the retry starts the turn again.
		d.recordFailure(a.ctx, c, lost, a.log)
		return true, true, lost
	}
	a.observeLatency(res)
	if res.Terminal {
		a.log.Info("run terminal persisted", "events", res.Inserted)
		// The run ended: its lease is no longer renewed (a renewal would
		// find it ended and stop this driver, which may still be reading
		// the runner's answer to a cancellation: the acknowledgement was
		// never written). What it writes from now on is a cancellation's
		// acknowledgement, under the database's fence.
		d.leases.remove(c.RunID)
		a.acknowledged(res.Acknowledged, res.AcknowledgedRecord)
		if len(a.cancelIntents) == 0 {
			done, err := a.finish()
			return true, done, err
		}
		// Keep reading (bounded) until outstanding cancellation dispatches
		// are answered, so their acknowledgement is recorded.
		a.terminalSeen = time.After(5 * time.Second)
	}
	return false, false, nil
}

// observeLatency feeds the outcome and latency metrics from what one append
// filed: the first attempt's turn.started ends the run's submit → turn
// latency, its run.terminal ends the turn this attachment saw start.
func (a *attachment) observeLatency(res store.AppendResult) {
	m, now := a.d.metrics, a.d.cfg.Clock()
	if res.TurnStarted {
		if a.c.Attempt == 1 && !a.c.SubmittedAt.IsZero() {
			m.submitToTurn.Observe(max(now.Sub(a.c.SubmittedAt), 0).Seconds())
		}
		if a.turnStartedAt.IsZero() {
			a.turnStartedAt = now
		}
	}
	if !res.Terminal {
		return
	}
	m.outcomes.WithLabelValues(res.Outcome.State, outcomeCode(res.Outcome.Code)).Inc()
	if !a.turnStartedAt.IsZero() {
		m.turnSeconds.WithLabelValues(res.Outcome.State).Observe(now.Sub(a.turnStartedAt).Seconds())
	}
}

// acknowledged takes the cancellation intents acknowledged with the run's
// terminal off the dispatches awaiting the runner's answer, whose answer is
// then not waited for; rec is the record as that commit left it (nil: not
// at hand), which CancelRun answers from.
func (a *attachment) acknowledged(intents []string, rec *executorv1.Cancellation) {
	for _, intent := range intents {
		for cmdID, in := range a.cancelIntents {
			if in == intent {
				delete(a.cancelIntents, cmdID)
			}
		}
		a.d.metrics.cancellations.WithLabelValues(cancelAcknowledged).Inc()
		a.log.Info("cancellation acknowledged with the run's terminal", "intent_id", intent)
		a.d.cancellationAcked(a.c.RunID, rec)
	}
}

// onResult handles a command result the live session did not wait for: a
// cancellation dispatch's, or a refusal of the turn's commands.
func (a *attachment) onResult(r *prpv1.CommandResult) (stop, done bool, err error) {
	if a.live.result(r) {
		return false, false, nil
	}
	if intent, ok := a.cancelIntents[r.GetCommandId()]; ok {
		// completed, or the turn had already ended: either way the
		// provider has nothing left to do for this run.
		if r.GetStatus() == "completed" || r.GetCode() == failure.NoActiveTurn {
			a.d.metrics.cancellations.WithLabelValues(cancelAcknowledged).Inc()
			// Written beside the pump, which may be persisting the
			// turn's last events meanwhile (SPEC P2: the acknowledgement
			// does not queue behind them); the attach ends after it.
			a.acking.Add(1)
			go func() {
				defer a.acking.Done()
				if !a.d.acknowledgeCancellation(a.ctx, a.c, intent, a.log) {
					a.cancelMu.Lock()
					delete(a.cancelSent, r.GetCommandId())
					a.cancelMu.Unlock()
				}
			}()
		} else {
			a.d.metrics.cancellations.WithLabelValues(cancelRefused).Inc()
			a.log.Error("cancellation dispatch refused", "code", r.GetCode(), "msg", r.GetMessage())
		}
		delete(a.cancelIntents, r.GetCommandId())
		if a.terminalSeen != nil && len(a.cancelIntents) == 0 {
			done, err := a.finish()
			return true, done, err
		}
		return false, false, nil
	}
	switch r.GetStatus() {
	case "completed", "pending":
		return false, false, nil
	}
	if r.GetCode() == failure.TurnAlreadyActive && r.GetCommandType() == "run.attach" {
		// The runner still runs a turn of an earlier run of the scope
		// (that run ended while its turn went on): this attempt ends
		// retryably, the retry finds the turn over.
		err = failure.New(codes.Unavailable, failure.NativeSessionSupervisorBusy, "run.attach refused: %s", r.GetMessage())
		a.log.Warn("the runner still runs another run's turn", "msg", r.GetMessage())
		a.d.recordFailure(a.ctx, a.c, err, a.log)
		return true, true, err
	}
	if r.GetCode() == failure.TurnAlreadyActive {
		return false, false, nil // a re-attach found its turn still running
	}
	code := failure.Reason(r.GetCode())
	if code == "" {
		code = failure.RunnerCommandFailed
	}
	msg := fmt.Sprintf("%s %s: %s", r.GetCommandType(), r.GetStatus(), r.GetMessage())
	a.log.Error("command refused", "code", code, "msg", msg)
	err = failure.New(codes.FailedPrecondition, code, "%s", msg)
	a.d.recordFailure(a.ctx, a.c, err, a.log)
	return true, true, err
}

// finish ends a run whose terminal is persisted: a per-turn session is
// closed (closePerTurn), and the stream is closed for sending.
func (a *attachment) finish() (bool, error) {
	if a.c.Input.GetSession().GetLifecycle().GetMode() != prpv1.LifecycleMode_LIFECYCLE_MODE_WARM {
		a.closePerTurn()
		return true, nil
	}
	_ = a.stream.CloseSend()
	return true, nil
}

// CloseReasonPerTurn is the reason of the session.close that ends a
// per-turn run's session once the run settled.
const CloseReasonPerTurn = "per_turn run ended"

// perTurnCloseWait bounds how long a per-turn run's driver waits for its
// runner to answer session.close and for the gateway to end the stream:
// above the runner's provider close (3 × its 5 s grace at most).
const perTurnCloseWait = 20 * time.Second

// closePerTurn closes the session of a per-turn run whose terminal is
// persisted (SPEC E10: a per-turn run keeps no runner or provider). The
// session belongs to this run alone, so nothing waits for its runner but
// its idle timeout: the close is sent and its answer awaited, and what the
// runner emits meanwhile (runner.suspended: it settles suspended, so a
// later run of the scope continues it) is filed for the scope's next run
// (parked: the run ended, SPEC R9) and acknowledged, so the runner exits at
// once with an empty outbox. The stream is then half-closed and read to its
// end: the gateway has relayed every request sent before it ends the
// stream, where cancelling it at once could drop the close (and the last
// acknowledgement) on the way — most per-turn runners then lived until the
// gateway's idle timeout. A runner that does not answer in time ends at its
// idle timeout, as before.
func (a *attachment) closePerTurn() {
	cmd := newCommand(a.c, &prpv1.SessionClose{Reason: CloseReasonPerTurn})
	if err := a.sendCmd(cmd); err != nil {
		a.log.Warn("per-turn session close not sent; the runner ends at its idle timeout", "err", err)
		return
	}
	timeout := time.NewTimer(perTurnCloseWait)
	defer timeout.Stop()
	answered, sendClosed := false, false
	for {
		if answered && !sendClosed {
			_ = a.stream.CloseSend()
			sendClosed = true
		}
		msg := a.held
		a.held = nil
		if msg == nil {
			var ok bool
			select {
			case msg, ok = <-a.msgs:
				if !ok {
					if !answered {
						a.log.Warn("the stream ended before the runner answered the per-turn session close", "err", a.recvErr)
					}
					return
				}
			case <-timeout.C:
				a.log.Warn("no answer to the per-turn session close; the runner ends at its idle timeout", "answered", answered)
				return
			case <-a.ctx.Done():
				return
			}
		}
		switch {
		case len(msg.GetEvents().GetEvents()) > 0:
			if !a.fileAfterTerminal(msg.GetEvents().GetEvents(), sendClosed) {
				return
			}
		case msg.GetCommandResult().GetCommandId() == cmd.GetCommandId():
			if r := msg.GetCommandResult(); r.GetStatus() != "completed" {
				a.log.Warn("per-turn session close refused", "code", r.GetCode(), "msg", r.GetMessage())
			}
			answered = true
		case msg.GetClosed() != nil:
			return
		}
	}
}

// fileAfterTerminal files events the runner emitted after the run's
// terminal for the scope's next run (parked) and, unless the stream is
// closed for sending, acknowledges them. It reports whether they were
// filed.
func (a *attachment) fileAfterTerminal(evs []*prpv1.Event, sendClosed bool) bool {
	if _, err := a.d.store.AppendEvents(a.ctx, store.Fence{}, evs); err != nil {
		a.log.Warn("filing the events of a closing per-turn runner failed; its outbox keeps them", "err", err)
		return false
	}
	if sendClosed {
		return true
	}
	for inst, seq := range a.acks.persisted(a.opened.GetRunnerAckedSeq(), evs) {
		if err := a.send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
			SourceInstanceId: inst, PersistedThroughSeq: seq,
		}}}); err != nil {
			return false
		}
	}
	return true
}
