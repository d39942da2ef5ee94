package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// Command types.
const (
	CmdRunAttach     = prp.CommandRunAttach
	CmdTurnStart     = prp.CommandTurnStart
	CmdTurnInterrupt = prp.CommandTurnInterrupt
	CmdTurnSteer     = prp.CommandTurnSteer
	CmdSessionClose  = prp.CommandSessionClose
	// CmdRunnerSuspend stops the provider cleanly, keeps the provider
	// thread, records lifecycle suspended and exits once the outbox is
	// acknowledged (SPEC R5): the state dir is then a checkpointable,
	// resumable session.
	CmdRunnerSuspend = prp.CommandRunnerSuspend
)

// cmdError is a command outcome other than success.
type cmdError struct {
	status, code, msg string
}

func (e *cmdError) Error() string { return failure.Message(failure.Reason(e.code), e.msg) }

// FailureReason implements failure.Reasoned.
func (e *cmdError) FailureReason() failure.Reason { return failure.Reason(e.code) }

func rejected(code, format string, args ...any) *cmdError {
	return &cmdError{runnerstate.StatusRejected, code, fmt.Sprintf(format, args...)}
}

func failed(code, format string, args ...any) *cmdError {
	return &cmdError{runnerstate.StatusFailed, code, fmt.Sprintf(format, args...)}
}

// providerFailure maps a provider error to a failed outcome with its code.
func providerFailure(fallback string, err error) *cmdError {
	var pe *ProviderError
	if errors.As(err, &pe) && pe.Code != "" {
		// The message is the provider's own; the code prefixes it once.
		return &cmdError{runnerstate.StatusFailed, pe.Code, pe.Message}
	}
	return &cmdError{runnerstate.StatusFailed, fallback, err.Error()}
}

// ProviderErrorCode returns the stable code of a provider error, or "".
func ProviderErrorCode(err error) string {
	var pe *ProviderError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// Fingerprint is sha256 of the canonical {type, payload, runId}, payload
// being the command's body in its Struct form (prp.LegacyPayload): a typed
// command and an older peer's Struct payload of the same fields have one
// fingerprint. The attempt
// is deliberately left out: a newer attempt of the same run (an executor that
// took the run over) that resends a command id gets the stored result instead
// of a second effect, so a provider turn starts at most once per command id.
// Fencing of lower attempts is checked separately.
//
// The values of a run.attach's configured provider environment are left
// out too (their names stay in): they are credentials the executor
// resolves afresh for each attempt (SPEC T3), so a secret rotated between
// two attempts of a run is the same command, and no digest of a credential
// is journaled.
func Fingerprint(c *prpv1.Command) (string, error) {
	return fingerprintOf(c, true)
}

// legacyFingerprint is the fingerprint of a runnerd that hashed the
// configured values too: a command journaled by it, resent to this one
// (an upgrade during a takeover), is still recognized.
func legacyFingerprint(c *prpv1.Command) (string, error) {
	return fingerprintOf(c, false)
}

// fingerprintOf hashes c's payload (its configured environment's values
// blanked when blank) as parsed from its protojson form: the typed body's
// own (prp.LegacyPayloadJSON), not a Struct made of it and written again
// — the canonical form of both is the same, keys sorted and numbers
// written afresh.
func fingerprintOf(c *prpv1.Command, blank bool) (string, error) {
	raw, err := prp.LegacyPayloadJSON(c)
	if err != nil {
		return "", err
	}
	var payload any = map[string]any{}
	if raw != nil {
		if payload, err = digest.ParseJSON(raw); err != nil {
			return "", err
		}
	}
	if blank {
		blankEnvironmentValues(payload)
	}
	b, err := digest.Canonical(map[string]any{
		"type":    c.GetType(),
		"payload": payload,
		"runId":   c.GetRunId(),
	})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// blankEnvironmentValues blanks the values of payload's
// input.environment.configured (a parsed JSON object), in place.
func blankEnvironmentValues(payload any) {
	obj := func(v any, k string) map[string]any {
		m, _ := v.(map[string]any)
		o, _ := m[k].(map[string]any)
		return o
	}
	conf := obj(obj(obj(payload, "input"), "environment"), "configured")
	for k := range conf {
		conf[k] = ""
	}
}

func (r *Runner) sendResult(rec *runnerstate.CommandRecord) {
	res := &prpv1.CommandResult{
		CommandId:     rec.CommandID,
		ControllerSeq: rec.ControllerSeq,
		CommandType:   rec.CommandType,
		Status:        rec.Status,
		Code:          rec.Code,
		Message:       rec.Message,
		RunId:         rec.RunID,
	}
	if rec.Result != nil {
		if s, err := toStruct(rec.Result); err == nil {
			res.Result = s
		}
	}
	r.write(&prpv1.Frame{Kind: &prpv1.Frame_CommandResult{CommandResult: res}})
}

// maxCommandBatch bounds the commands journaled together.
const maxCommandBatch = 32

// commandSlot is one received command's place in the answer order.
type commandSlot struct {
	c *prpv1.Command
	// rec is the outcome to send; for a new command it is its journal
	// record, which the effect completes.
	rec *runnerstate.CommandRecord
	// run: the command's intent is journaled and its effect is to run.
	run bool
	// done: rec is final (the answer may go once it is durable).
	done bool
}

// onCommands applies the journal rules to commands received together, runs
// their effects in order and answers them in order, with as few syncs as the
// contract allows: a command's intent is durable before any of its effects,
// and its outcome is durable before it is answered.
//
// The intents of the commands at hand are made durable together (one
// append to the intent log and one fdatasync; without a log, one save of
// the state); those commands then run one after the other. Commands that
// arrived meanwhile (drained from the connection) are journaled the same
// way before they run. When nothing is left to run, the outcomes are made
// durable together: for the warm path's commands (outcomeRecordable) one
// outcome record in the intent log (one fdatasync) holds them and the
// state they left, the answers go out at once, and the state document
// catches up later (the turn's end saves it; Runner.checkTimers bounds the
// wait); otherwise one save of the state holds every outcome (and
// everything else the commands changed), written while the loop goes on —
// the turn's events are not held up — and the answers go out once it is
// durable.
func (r *Runner) onCommands(connID int, cmds []*prpv1.Command) {
	defer r.pongIfDue()
	defer synctrace.Step("runnerd.commands", cmds[0].GetRunId())()
	b := &commandBatch{r: r, byOutcome: r.j.intents != nil}
	// Answers still waiting for a snapshot go first (in order).
	if r.j.settleSaves() != nil {
		return
	}
	b.admit(cmds)
	wait := time.Duration(0)
	if last := b.slots[len(b.slots)-1]; last.run && last.c.GetType() == CmdRunAttach {
		// The executor sends a run's turn.start right behind its
		// run.attach: a short wait lets both intents share one sync.
		wait = r.cfg.AttachFollowWindow
	}
	for {
		b.admit(r.drainCommands(connID, maxCommandBatch-len(b.slots), wait))
		wait = 0
		if b.next == len(b.slots) {
			// Nothing left to run: persist and answer.
			b.persistAndAnswer()
			return
		}
		if !b.journalFresh() || !b.runJournaled() {
			return
		}
	}
}

// commandBatch is one onCommands call's batch of commands, admitted in
// order into slots, journaled, run and answered.
type commandBatch struct {
	r       *Runner
	slots   []*commandSlot
	next    int               // first slot not yet run (or passed, when it needs no run)
	answerd int               // slots answered so far
	changed bool              // the state changed (beyond fresh intents) since the last save
	fresh   []statedir.Intent // intents not yet durable
	// byOutcome: every change is a command's run whose outcome an
	// outcome record can carry (see outcomeRecordable).
	byOutcome bool
	attached  bool // a run.attach ran (its input goes on the record)
}

// admit admits cs into the batch's slots.
func (b *commandBatch) admit(cs []*prpv1.Command) {
	for _, c := range cs {
		s, ch := b.r.admitCommand(c)
		b.slots = append(b.slots, s)
		if s.run {
			b.fresh = append(b.fresh, statedir.IntentOf(s.rec))
			if !outcomeRecordable(c.GetType()) {
				b.byOutcome = false
			}
			b.attached = b.attached || c.GetType() == CmdRunAttach
		} else if ch {
			b.changed = true
			b.byOutcome = false
		}
	}
}

// answerUpTo answers the slots from answerd up to n.
func (b *commandBatch) answerUpTo(n int) {
	for ; b.answerd < n; b.answerd++ {
		b.r.sendResult(b.slots[b.answerd].rec)
	}
}

// persistAndAnswer makes the batch's outcomes durable and answers them,
// once nothing is left to run: at once when nothing changed; from one
// outcome record in the intent log when every change is a recordable
// command's outcome (the state document catches up later, its snapshot is
// off the turn's path); else once a save of the state holds them.
func (b *commandBatch) persistAndAnswer() {
	r := b.r
	if !b.changed && len(b.fresh) == 0 {
		b.answerUpTo(len(b.slots))
		return
	}
	if b.byOutcome && len(b.fresh) == 0 {
		var ran []*runnerstate.CommandRecord
		for _, sl := range b.slots {
			if sl.run {
				ran = append(ran, sl.rec)
			}
		}
		if r.j.journalOutcomes(ran, b.attached) != nil {
			return // nothing whose outcome is not durable is answered
		}
		if r.requestsDirty {
			// A request the turn opened: the state follows soon
			// (as the provider's events have it, emit.go).
			r.requestsDirty = false
			r.saveSoon()
		}
		b.answerUpTo(len(b.slots))
		return
	}
	gen, err := r.j.saveAsync()
	if err != nil {
		r.log.Error("cannot persist runner state", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
		return
	}
	recs := make([]*runnerstate.CommandRecord, 0, len(b.slots)-b.answerd)
	for _, sl := range b.slots[b.answerd:] {
		recs = append(recs, sl.rec)
	}
	r.j.answerWhenSaved(gen, recs)
}

// journalFresh journals the fresh intents (intents before effects); false
// when that failed: nothing unjournaled runs, nothing unsaved is
// answered.
func (b *commandBatch) journalFresh() bool {
	r := b.r
	if len(b.fresh) == 0 {
		return true
	}
	if r.j.intents == nil {
		b.changed = false // the save holds everything
		// (and what is final so far may be answered after it)
	}
	if r.j.journalIntents(b.fresh) != nil {
		return false
	}
	b.fresh = nil
	if r.j.intents == nil {
		for b.answerd < len(b.slots) && b.slots[b.answerd].done {
			r.sendResult(b.slots[b.answerd].rec)
			b.answerd++
		}
	}
	return true
}

// runJournaled runs every slot up to len(slots), all journaled durably
// now. The events they emit are held and journaled with the provider
// events of a turn one of them starts (one fsync for run.attached and
// turn.started), before any state save, and at the latest when they have
// run. False when the runner is exiting at once.
func (b *commandBatch) runJournaled() bool {
	r := b.r
	r.j.hold = true
	for ; b.next < len(b.slots); b.next++ {
		sl := b.slots[b.next]
		if !sl.run {
			continue
		}
		r.runCommand(sl)
		b.changed = true
		if r.exit != nil && r.exit.immediate {
			break
		}
	}
	r.j.hold = false
	r.flushHeld()
	return r.exit == nil || !r.exit.immediate
}

// outcomeRecordable reports whether a command of type typ changes nothing
// in the state but its own record and what an outcome record carries (the
// attached run, its input, the active and last turn) and what is saved on
// its own when it changes (the provider process and thread): its outcome
// may be journaled in the intent log and answered before the state
// document holds it. These are the commands of a warm turn's path.
func outcomeRecordable(typ string) bool { return typ == CmdRunAttach || typ == CmdTurnStart }

// pongIfDue tells the gateway of a provider started by the commands just
// handled, after their events were flushed (an unsolicited pong sent in the
// middle of them split the first turn's group commit).
func (r *Runner) pongIfDue() {
	if r.pongDue {
		r.pongDue = false
		r.pong(0)
	}
}

// drainCommands returns the commands of connection connID already waiting
// behind the one being handled (at most max), waiting up to wait for the
// first of them. A frame of another kind ends the batch and is kept in
// r.held, handled next by the loop.
func (r *Runner) drainCommands(connID, max int, wait time.Duration) []*prpv1.Command {
	var cmds []*prpv1.Command
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for len(cmds) < max && r.held == nil {
		var in inbound
		select {
		case in = <-r.link.inbound:
		default:
			if timeout == nil {
				return cmds
			}
			select {
			case in = <-r.link.inbound:
			case <-timeout:
				return cmds
			}
		}
		timeout = nil
		if cmd := in.f.GetCommand(); in.err == nil && r.link.current(connID) && in.connID == connID && cmd != nil {
			cmds = append(cmds, cmd)
			continue
		}
		r.held = &in
	}
	return cmds
}

// admitCommand applies the journal rules to one command: an invalid or
// refused command, or a duplicate (its stored result is resent), is done at
// once; a new one is journaled as pending (in memory: the caller saves) and
// is to run. changed says the state changed.
func (r *Runner) admitCommand(c *prpv1.Command) (_ *commandSlot, changed bool) {
	st := r.st
	base := &runnerstate.CommandRecord{
		CommandID:     c.GetCommandId(),
		ControllerSeq: c.GetControllerSeq(),
		CommandType:   c.GetType(),
		RunID:         c.GetRunId(),
		Attempt:       c.GetAttempt(),
		ReceivedAt:    time.Now().UTC(),
	}
	reply := func(status, code, msg string) *commandSlot {
		rec := *base
		rec.Status, rec.Code, rec.Message = status, code, msg
		return &commandSlot{c: c, rec: &rec, done: true}
	}
	if c.GetCommandId() == "" || len(c.GetCommandId()) > 160 || c.GetType() == "" {
		return reply(runnerstate.StatusRejected, failure.CommandInvalid, "command needs a command id (1..160) and a type"), false
	}
	fp, err := Fingerprint(c)
	if err != nil {
		return reply(runnerstate.StatusRejected, failure.CommandInvalid, "payload cannot be fingerprinted: "+err.Error()), false
	}
	base.Fingerprint = fp
	// consumeSeq advances the controller cursor when this command holds the
	// next seq, whatever its outcome.
	consumeSeq := func() bool {
		if c.GetControllerSeq() == st.LastControllerCommandSeq+1 {
			st.LastControllerCommandSeq++
			return true
		}
		return false
	}

	if prev, ok := st.ProcessedCommands[c.GetCommandId()]; ok {
		changed = consumeSeq()
		if prev.Fingerprint != fp {
			if legacy, err := legacyFingerprint(c); err == nil && legacy == prev.Fingerprint {
				fp = legacy
			}
		}
		if prev.Fingerprint == fp {
			if runID := c.GetRunId(); runID != "" {
				if hi := st.HighestAttempts[runID]; c.GetAttempt() < hi {
					return reply(runnerstate.StatusRejected, failure.RunnerAttemptFenced,
						fmt.Sprintf("attempt %d is fenced by attempt %d of run %s", c.GetAttempt(), hi, runID)), changed
				} else if c.GetAttempt() > hi {
					st.NoteAttempt(runID, c.GetAttempt())
					changed = true
				}
			}
			if prev.Status == runnerstate.StatusUnexecuted {
				// A restart cut it short before it took effect: it runs
				// now (its intent journaled again before its effect).
				r.log.Info("a command a restart cut short before it took effect runs now", "command_id", prev.CommandID)
				prev.Reopen(runnerstate.StatusPending, failure.ExecutionIndeterminate, "", nil)
				prev.Attempt, prev.ReceivedAt = c.GetAttempt(), time.Now().UTC()
				return &commandSlot{c: c, rec: prev, run: true}, true
			}
			r.log.Info("duplicate command; resending the stored result", "command_id", prev.CommandID, "status", prev.Status)
			r.reannounceLost(prev)
			// prev is final when this slot's turn to be answered comes (a
			// command is answered after every earlier one).
			return &commandSlot{c: c, rec: prev, done: true}, changed
		}
		return reply(runnerstate.StatusRejected, failure.CommandIDReused, "commandId was reused with different command data"), changed
	}
	if c.GetControllerSeq() != st.LastControllerCommandSeq+1 {
		return reply(runnerstate.StatusRejected, failure.ControllerSeqNotContiguous, fmt.Sprintf("controller sequence must be contiguous: expected %d, received %d",
			st.LastControllerCommandSeq+1, c.GetControllerSeq())), false
	}
	consumeSeq()
	rec := base
	st.ProcessedCommands[rec.CommandID] = rec

	if runID := c.GetRunId(); runID != "" {
		if hi := st.HighestAttempts[runID]; c.GetAttempt() < hi {
			rec.Status, rec.Code = runnerstate.StatusRejected, failure.RunnerAttemptFenced
			rec.Message = fmt.Sprintf("attempt %d is fenced by attempt %d of run %s", c.GetAttempt(), hi, runID)
			return &commandSlot{c: c, rec: rec, done: true}, true
		}
		st.NoteAttempt(runID, c.GetAttempt())
	}
	// The intent, journaled before any effect.
	rec.Status, rec.Code, rec.Message = runnerstate.StatusPending, failure.ExecutionIndeterminate, ""
	return &commandSlot{c: c, rec: rec, run: true}, true
}

// runCommand runs the effect of a command whose intent is durable and
// records its outcome (in memory: the caller saves before answering).
func (r *Runner) runCommand(sl *commandSlot) {
	c, rec := sl.c, sl.rec
	// The command's span joins the trace it carries (the gateway's relay
	// span); provider calls made for it are its children.
	ctx, span := telemetry.StartCommand(context.Background(), "runnerd", c)
	result, cerr := r.execute(ctx, c)
	if cerr != nil {
		telemetry.End(span, errors.New(cerr.code+": "+cerr.msg))
	} else {
		span.End()
	}
	if cerr != nil {
		rec.Status, rec.Code, rec.Message = cerr.status, cerr.code, cerr.msg
	} else {
		rec.Status, rec.Code, rec.Message, rec.Result = runnerstate.StatusCompleted, "", "", outcomeMap(result)
	}
	sl.done = true
	if c.GetType() == CmdSessionClose && cerr == nil {
		r.setExit(ExitOK, failure.SessionClosed, false)
	}
	if c.GetType() == CmdRunnerSuspend && cerr == nil {
		r.setExit(ExitOK, "suspended", false)
	}
}

// outcomeMap is a command's result as its record keeps it (the JSON
// object CommandResult.result carries); nil for none.
func outcomeMap(result proto.Message) map[string]any {
	if result == nil {
		return nil
	}
	s, err := prp.Payload(result)
	if err != nil {
		return nil
	}
	return s.AsMap()
}

func (r *Runner) execute(ctx context.Context, c *prpv1.Command) (proto.Message, *cmdError) {
	switch c.GetType() {
	case CmdRunAttach:
		return r.cmdRunAttach(c)
	case CmdTurnStart:
		return r.cmdTurnStart(ctx, c)
	case CmdTurnInterrupt:
		return r.cmdTurnInterrupt(ctx, c)
	case CmdTurnSteer:
		return r.cmdTurnSteer(ctx, c)
	case CmdSessionClose:
		return r.cmdSessionClose(c)
	case CmdRunnerSuspend:
		return r.cmdRunnerSuspend(c)
	case CmdRunnerCheckpoint:
		return r.cmdRunnerCheckpoint(c)
	case CmdRequestResolve:
		return r.cmdRequestResolve(c)
	case CmdToolResult:
		return r.cmdToolResult(c)
	}
	return nil, rejected(failure.CommandUnsupported, "command type %q is not supported", c.GetType())
}

// bodyInvalid is the refusal of a command whose body does not read.
func bodyInvalid(err error) *cmdError {
	return rejected(failure.CommandInvalid, "%v", err)
}

func (r *Runner) stoppedErr() *cmdError {
	switch r.st.Lifecycle {
	case runnerstate.LifecycleStopped, runnerstate.LifecycleDraining, runnerstate.LifecycleSuspended, runnerstate.LifecycleRevoked:
		return rejected(failure.RunnerStopped, "runner is %s", r.st.Lifecycle)
	}
	if r.exit != nil {
		return rejected(failure.RunnerStopped, "runner is exiting (%s)", r.exit.reason)
	}
	return nil
}

// requireRun checks the command targets the attached run.
func (r *Runner) requireRun(c *prpv1.Command) *cmdError {
	cur := r.st.CurrentRun
	if cur == nil {
		return rejected(failure.RunNotAttached, "no run is attached")
	}
	if c.GetRunId() != "" && c.GetRunId() != cur.RunID {
		return rejected(failure.RunNotAttached, "run %s is not attached (attached: %s)", c.GetRunId(), cur.RunID)
	}
	if c.GetRunId() != "" && c.GetAttempt() < cur.Attempt {
		return rejected(failure.RunnerAttemptFenced, "attempt %d is fenced by attempt %d", c.GetAttempt(), cur.Attempt)
	}
	return nil
}

func (r *Runner) cmdRunAttach(c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.stoppedErr(); e != nil {
		return nil, e
	}
	if c.GetRunId() == "" {
		return nil, rejected(failure.CommandInvalid, "run.attach needs a run id")
	}
	body, err := prp.RunAttachOf(c)
	if err != nil {
		return nil, rejected(failure.CommandInvalid, "payload.input is not an ExecutionInput: %v", err)
	}
	in := body.GetInput()
	if in == nil {
		return nil, rejected(failure.CommandInvalid, "run.attach needs payload.input (ExecutionInput)")
	}
	if sid := in.GetSession().GetNormalizedSessionId(); sid != "" && sid != r.st.Identity.NormalizedSessionID {
		return nil, rejected(failure.CommandInvalid, "input session %q does not match the runner's session %q", sid, r.st.Identity.NormalizedSessionID)
	}
	if t := r.st.ActiveTurn; t != nil && t.RunID != c.GetRunId() {
		return nil, rejected(failure.TurnAlreadyActive, "turn %s of run %s is still active", t.TurnID, t.RunID)
	}
	r.sup.configuredEnv = in.GetEnvironment().GetConfigured()
	persisted := proto.Clone(in).(*prpv1.ExecutionInput)
	if persisted.Environment != nil {
		persisted.Environment.Configured = nil
	}
	canon, err := (protojson.MarshalOptions{}).Marshal(persisted)
	if err != nil {
		return nil, failed(failure.CommandInvalid, "re-encode input: %v", err)
	}
	prev := r.st.CurrentRun
	r.st.CurrentRun = &runnerstate.RunRef{RunID: c.GetRunId(), Attempt: c.GetAttempt()}
	r.st.SessionInput = compactJSON(canon)
	if t := r.st.ActiveTurn; t != nil {
		t.Attempt = c.GetAttempt()
	}
	// A run declaring another tool contract than the live provider's
	// thread was opened with gets a fresh provider: the next turn resumes
	// the same thread with the run's dynamic tools.
	if r.sup.prov != nil && r.st.ActiveTurn == nil && toolContract(in) != r.sup.tools {
		r.log.Info("the run's tool contract differs from the live provider's; restarting the provider", "run_id", c.GetRunId())
		r.closeProvider()
		r.emitBody(P1, prp.EventProviderRestarting, "", &prpv1.ProviderRestarting{
			Reason: "tool_contract_changed", RunId: c.GetRunId(), ProviderThreadId: r.st.ProviderThreadID,
		})
	}
	// The attached run is persisted with the command's outcome, before the
	// answer; run.attached is journaled (fsync) before it is sent.
	reused := r.sup.prov != nil
	attached := &prpv1.RunAttached{
		RunId: c.GetRunId(), Attempt: uint32(c.GetAttempt()), RunnerInstanceId: r.st.Identity.RunnerInstanceID,
		ProviderRunning: proto.Bool(reused), ProviderThreadId: r.st.ProviderThreadID,
	}
	if prev != nil {
		attached.PreviousRunId = prev.RunID
	}
	r.emitBody(P0, prp.EventRunAttached, "", attached)
	return &prpv1.CommandOutcome{
		RunId: c.GetRunId(), Attempt: proto.Uint32(uint32(c.GetAttempt())), ProviderRunning: proto.Bool(reused),
		ProviderThreadId: proto.String(r.st.ProviderThreadID),
	}, nil
}

func compactJSON(b []byte) json.RawMessage {
	out, err := prp.CanonicalJSON(json.RawMessage(b))
	if err != nil {
		return b
	}
	return out
}

func (r *Runner) sessionInput() *prpv1.ExecutionInput {
	in := &prpv1.ExecutionInput{}
	if len(r.st.SessionInput) > 0 {
		_ = (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(r.st.SessionInput, in)
	}
	return in
}

func (r *Runner) cmdTurnStart(ctx context.Context, c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.stoppedErr(); e != nil {
		return nil, e
	}
	if e := r.requireRun(c); e != nil {
		return nil, e
	}
	body, err := prp.TurnStartOf(c)
	if err != nil {
		return nil, bodyInvalid(err)
	}
	text := body.GetText()
	if text == "" || len(text) > 1<<20 {
		return nil, rejected(failure.CommandInvalid, "turn.start needs payload.text (1 byte..1 MiB)")
	}
	if t := r.st.ActiveTurn; t != nil {
		return nil, rejected(failure.TurnAlreadyActive, "turn %s is still active", t.TurnID)
	}
	if r.st.Backpressure {
		return nil, rejected(failure.RunnerBackpressure, "the outbox holds %d unacknowledged bytes; no new turn until it drains", r.j.outbox.Bytes())
	}
	if end, ok := r.journaledRunEnd(c.GetRunId()); ok && c.GetAttempt() > r.turnStartAttempt(c.GetRunId(), end.TurnID) {
		// The run ended here (its run.terminal is journaled, not yet
		// acknowledged) and a later attempt of it asks for a turn: the
		// controller retried the run under a new turn generation before
		// it persisted the end. No second turn: its events, labelled with
		// a run already ended, would be filed under the scope's next run
		// (SPEC R9). The answer names the ended turn; the replayed
		// run.terminal ends the run.
		r.log.Warn("turn.start of a run whose run.terminal is journaled; answering with its ended turn",
			"run_id", c.GetRunId(), "command_id", c.GetCommandId(), "turn_id", end.TurnID)
		return &prpv1.CommandOutcome{TurnId: end.TurnID, ProviderThreadId: proto.String(r.st.ProviderThreadID), RunEnded: true}, nil
	}
	// A provider that exited between turns, its exit not handled yet (the
	// loop took this command first), is replaced now: the turn starts on a
	// live one (SPEC R7).
	r.takeProviderExit()
	if e := r.ensureProvider(ctx); e != nil {
		return nil, e
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	endStart := synctrace.Step("runnerd.provider_turn_start", c.GetRunId())
	turnID, err := r.sup.prov.StartTurn(ctx, text)
	if exitErr := r.sup.prov.ExitErr(); err != nil && exitErr != nil && errors.Is(err, exitErr) {
		// The provider refused the turn because it had exited just
		// before: nothing was sent. Once on a restarted one.
		r.log.Warn("the provider exited just before the turn started; restarting it for the turn", "run_id", c.GetRunId(), "err", err)
		r.takeProviderExit()
		if e := r.ensureProvider(ctx); e != nil {
			endStart()
			return nil, e
		}
		turnID, err = r.sup.prov.StartTurn(ctx, text)
	}
	endStart()
	var startLost *TurnStartLost
	if errors.As(err, &startLost) && startLost.TurnID != "" {
		// Lost during the start: the turn is recorded under its id and
		// reconciled once the loop takes the provider's exit (the prompt
		// reached the provider or not; recoverTurn tells).
		r.log.Warn("the provider was lost while the turn was being started; the turn is reconciled on a restarted provider",
			"run_id", c.GetRunId(), "turn_id", startLost.TurnID, "err", startLost.Err)
		turnID, err = startLost.TurnID, nil
	}
	r.reportExecution(c, turnID, err)
	if err == nil && startLost == nil {
		defer synctrace.Step("runnerd.await_turn_started", c.GetRunId())()
		r.sup.awaitTurnStarted(r.cfg.TurnStartedWait)
	}
	r.pumpProviderEvents()
	if err != nil {
		return nil, providerFailure(failure.ProviderTurnStartFailed, err)
	}
	cur := r.st.CurrentRun
	// Persisted with the command's outcome, before the answer.
	r.st.ActiveTurn = &runnerstate.Turn{TurnID: turnID, RunID: cur.RunID, Attempt: cur.Attempt, CommandID: c.GetCommandId(), StartedAt: time.Now().UTC()}
	r.st.LastTurnID = turnID
	// An interrupt asked of an earlier turn is not this one's, whatever its
	// id (a restarted provider may number its turns anew).
	r.interruptAsked = ""
	return &prpv1.CommandOutcome{TurnId: turnID, ProviderThreadId: proto.String(r.st.ProviderThreadID)}, nil
}

// staleTurn refuses a command that names turn given while active is the
// active turn: the caller's turn first, then the one that is active.
func staleTurn(code, given, active string) *cmdError {
	return rejected(code, "turn %s is not the active turn (the active turn is %s)", given, active)
}

// EventCommandExecuted reports that runnerd executed a command's effect:
// the one record of an execution the executor's audit counts (SPEC X1:
// each turn command id is executed by a runner at most once). It is held
// and journaled with the turn's first provider events (no fsync of its
// own).
const EventCommandExecuted = prp.EventCommandExecuted

// reportExecution emits command.executed for c, whose effect was just
// tried: the provider turn it started, or that the provider refused it.
func (r *Runner) reportExecution(c *prpv1.Command, turnID string, err error) {
	p := &prpv1.CommandExecuted{CommandId: c.GetCommandId(), CommandType: c.GetType(), Attempt: uint32(c.GetAttempt()), TurnId: turnID}
	if err != nil {
		// The provider's answer is in the command's result; its code and
		// message too, so that a runnerd restarted before it saved that
		// result settles the command as this one would have: a provider
		// lost during the start (a retryable code) is not a refusal.
		fe := providerFailure(failure.ProviderTurnStartFailed, err)
		p.Failed, p.Code, p.Message = true, fe.code, fe.msg
	}
	r.emitBody(P0, EventCommandExecuted, turnID, p)
}

// providerEnv is the provider process's environment (SPEC E2), built by
// provenv from the policy the run input carries: the provider host context
// is runnerd's own choice — PATH from its configuration, HOME and
// CODEX_HOME inside its state directory — never runnerd's environment,
// which holds its bootstrap credentials; the workspace pinned is the one
// the runner serves.
func (r *Runner) providerEnv(in *prpv1.ExecutionInput, codexHome string) []string {
	if r.sup.configuredEnv != nil {
		if in.Environment == nil {
			in.Environment = &prpv1.ProviderEnvironment{}
		}
		in.Environment.Configured = r.sup.configuredEnv
	}
	host := map[string]string{"PATH": r.cfg.PathEnv, "HOME": r.cfg.StateDir, "CODEX_HOME": codexHome}
	env := provenv.ForRun(in, host, r.cfg.Workspace)
	if len(env.Dropped) > 0 {
		r.log.Warn("configured provider environment names refused", "names", env.Dropped)
	}
	return env.List()
}

// ensureProvider starts the provider and opens (or resumes) the thread;
// ctx carries the trace of the command it is started for.
func (r *Runner) ensureProvider(ctx context.Context) *cmdError {
	if r.sup.prov != nil {
		return nil
	}
	return r.startProvider(ctx, false)
}

// recoverProvider re-attaches to the provider a crashed runnerd left under
// its host; the active turn goes on. If that fails the provider is lost:
// what is left of it is killed and an active turn is reconciled on a
// restarted provider (recoverTurn).
func (r *Runner) recoverProvider() {
	lost, turn := r.st.ProviderProcess, r.st.ActiveTurn
	// Requests the dead runnerd announced: its driver held them, and the
	// host answers them with an error (the replayed ones, after the
	// journaled cursor, are announced afresh by the new driver).
	stale := r.openRequestKeys()
	e := r.startProvider(context.Background(), true)
	if e == nil {
		r.log.Info("re-attached to the provider that survived the runnerd restart",
			"pid", r.st.ProviderProcess.PID, "provider_cursor", r.st.ProviderCursor, "active_turn", turn != nil)
		r.expireRequests(stale, failure.DurableHandoff)
		rr, ok := r.sup.prov.(ReattachReconciler)
		switch {
		case turn == nil:
		case ok && rr.ReconcileOnReattach():
			r.reconcileTurn(turn, failure.ProviderProcessLost, "runnerd restarted during the turn")
		case r.turnEventJournaled(turn.TurnID):
			// The provider ended the turn and its turn.<status> is
			// journaled, with the host cursor past its line: the host
			// replays nothing of it, and the dead runnerd never took
			// its result. The provider's record gives the result (the
			// reconciled event is not journaled again).
			r.log.Info("the active turn's end is journaled, not its result; reconciling it on the re-attached provider", "turn_id", turn.TurnID)
			r.reconcileTurn(turn, failure.ProviderProcessLost, "runnerd restarted after the turn ended")
		}
		return
	}
	r.expireRequests(stale, failure.ProviderProcessLost)
	r.log.Warn("the provider did not survive the runnerd restart", "code", e.code, "err", e.msg)
	if lost != nil && sameProcessAlive(lost.PID, lost.StartTicks, lost.BootID) && lost.PGID > 0 {
		procgroup.Kill(lost.PGID)
	}
	r.st.ProviderProcess = nil
	r.mustSave()
	msg := "provider process did not survive the runnerd restart: " + e.msg
	if lost != nil {
		r.emitBody(P0, prp.EventHarnessExited, "", &prpv1.HarnessExited{
			Code: failure.ProviderProcessLost, Message: msg, Pid: int32(lost.PID), Pgid: int32(lost.PGID),
		})
	}
	if turn != nil {
		r.recoverTurn(turn, failure.ProviderProcessLost, msg)
	}
}

// startProvider starts the provider (or, with reattach, re-attaches to the
// hosted one) and opens or resumes the thread. Its provider calls
// (initialize, thread/start or thread/resume) are spans of trace's trace
// — the command that needed the provider, so one trace per run covers them
// (SPEC D6) — bounded by their own timeout, not by trace's deadline.
func (r *Runner) startProvider(trace context.Context, reattach bool) *cmdError {
	in := r.sessionInput()
	if kind := providerlaunch.Name(in.GetProvider()); kind != r.cfg.Provider && (kind != "" || r.cfg.Provider != providerlaunch.Codex) {
		return failed(failure.ProviderConfigInvalid, "this runner drives provider %q, the run names %q", r.cfg.Provider, kind)
	}
	codexHome := filepath.Join(r.cfg.StateDir, "codex-home")
	cfg := ProviderConfig{
		Kind:           r.cfg.Provider,
		StateDir:       r.cfg.StateDir,
		HomeTemplate:   r.cfg.ProviderHomeTemplate,
		PermissionMode: in.GetProvider().GetPermissionMode(),
		Agent:          in.GetProvider().GetAgent(),
		Command:        r.cfg.ProviderCommand,
		Args:           append([]string(nil), r.cfg.ProviderArgs...),
		Env:            r.providerEnv(in, codexHome),
		Dir:            r.cfg.Workspace,
		CodexHome:      codexHome,
		Model:          in.GetProvider().GetModel(),
		ApprovalPolicy: in.GetProvider().GetApprovalPolicy(),
		Sandbox:        in.GetProvider().GetSandbox(),
		DynamicTools:   dynamicTools(in),
		ToolTimeout:    r.cfg.SemanticToolTimeout,
		RequestTimeout: r.cfg.RequestTimeout,
		Logger:         r.log.With("component", "provider"),
		Hosted:         r.cfg.ProviderHost,
		HostDir:        r.j.store.Dir,
		Reattach:       reattach,
		ResumeAfter:    r.st.ProviderCursor,
		DetachTimeout:  r.cfg.ProviderDetachTimeout,
		CloseGrace:     r.cfg.ProviderCloseGrace,
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(trace), 2*r.cfg.RequestTimeout)
	defer cancel()
	p, err := r.sup.launch(ctx, cfg)
	if err != nil {
		r.pumpProviderEvents()
		return providerFailure(failure.ProviderStartFailed, err)
	}
	pi := p.Process()
	r.st.ProviderProcess = &runnerstate.Process{PID: pi.PID, PGID: pi.PGID, StartTicks: pi.StartTicks, BootID: r.boot, StartedAt: pi.StartedAt.UTC()}
	r.mustSave()
	r.pongDue = true // once the command's events are out (onCommands)
	r.pumpProviderEvents()
	r.emitBody(P1, prp.EventHarnessReady, "", &prpv1.HarnessReady{
		Pid: int32(pi.PID), Pgid: int32(pi.PGID), StartTicks: float64(pi.StartTicks), Reattached: proto.Bool(reattach),
	})
	tid, resumed, err := p.OpenThread(ctx, r.st.ProviderThreadID)
	r.pumpProviderEvents()
	if err != nil {
		r.log.Error("provider thread could not be opened; stopping the provider", "err", err)
		r.closeProvider()
		return providerFailure("provider_thread_open_failed", err)
	}
	if tid != r.st.ProviderThreadID {
		// A fresh thread: its turns are its own (their ids may repeat an
		// earlier thread's).
		r.st.LastTurnID = ""
	}
	r.st.ProviderThreadID = tid
	r.sup.tools = toolContract(in)
	r.mustSave()
	r.log.Info("provider ready", "pid", pi.PID, "thread_id", tid, "resumed", resumed)
	return nil
}

func (r *Runner) cmdTurnInterrupt(ctx context.Context, c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.requireRun(c); e != nil {
		return nil, e
	}
	t := r.st.ActiveTurn
	if t == nil || r.sup.prov == nil {
		return nil, rejected(failure.NoActiveTurn, "no turn is active")
	}
	body, err := prp.TurnInterruptOf(c)
	if err != nil {
		return nil, bodyInvalid(err)
	}
	if want := body.GetTurnId(); want != "" && want != t.TurnID {
		return nil, staleTurn(failure.TurnMismatch, want, t.TurnID)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	if err := r.sup.prov.Interrupt(ctx, t.TurnID); err != nil {
		return nil, providerFailure(failure.ProviderInterruptFailed, err)
	}
	r.interruptAsked = t.TurnID
	return &prpv1.CommandOutcome{TurnId: t.TurnID}, nil
}

func (r *Runner) cmdTurnSteer(ctx context.Context, c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.requireRun(c); e != nil {
		return nil, e
	}
	t := r.st.ActiveTurn
	if t == nil || r.sup.prov == nil {
		return nil, rejected(failure.NoActiveTurn, "no turn is active")
	}
	body, err := prp.TurnSteerOf(c)
	if err != nil {
		return nil, bodyInvalid(err)
	}
	text := body.GetText()
	if text == "" {
		return nil, rejected(failure.CommandInvalid, "turn.steer needs payload.text")
	}
	if want := body.GetExpectedTurnId(); want != "" && want != t.TurnID {
		return nil, staleTurn(failure.TurnMismatch, want, t.TurnID)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	if err := r.sup.prov.Steer(ctx, t.TurnID, text); err != nil {
		return nil, providerFailure(failure.ProviderSteerFailed, err)
	}
	return &prpv1.CommandOutcome{TurnId: t.TurnID}, nil
}

// cmdSessionClose closes the session: a turn in progress is interrupted
// (its terminal is interrupted/cancelled, code session_closed). Closing is a
// clean, resumable settlement, so the runner is then suspended (see suspend:
// lifecycle suspended, reason session_closed, provider thread kept), the
// state a later run may continue (SPEC E13); a revoked or unrecoverable
// runner stops instead. A suspension that cannot be persisted fails the
// command. The runner exits after answering.
func (r *Runner) cmdSessionClose(c *prpv1.Command) (proto.Message, *cmdError) {
	const reason = failure.SessionClosed
	r.interruptActiveTurn(reason)
	if r.suspendRefusal() != nil {
		r.stopSession(reason)
	} else if err := r.suspend(reason); err != nil {
		return nil, failed(failure.RunnerStateWriteFailed, "%v", err)
	}
	return &prpv1.CommandOutcome{Lifecycle: r.st.Lifecycle, ProviderThreadId: proto.String(r.st.ProviderThreadID)}, nil
}

// cmdRunnerSuspend suspends the runner (see suspend) before answering, so
// whoever sees the answer (and the runner's exit) may checkpoint the state
// dir. A turn in progress refuses: suspension is for an idle session.
func (r *Runner) cmdRunnerSuspend(c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.suspendRefusal(); e != nil {
		return nil, e
	}
	body, err := prp.RunnerSuspendOf(c)
	if err != nil {
		return nil, bodyInvalid(err)
	}
	reason := body.GetReason()
	if reason == "" {
		reason = "suspended"
	}
	if err := r.suspend(reason); err != nil {
		return nil, failed(failure.RunnerStateWriteFailed, "%v", err)
	}
	return &prpv1.CommandOutcome{
		Lifecycle: r.st.Lifecycle, ProviderThreadId: proto.String(r.st.ProviderThreadID),
		RunnerInstanceId: r.st.Identity.RunnerInstanceID,
	}, nil
}

// suspendRefusal says why the runner cannot be suspended now: a turn is
// active, or the runner is revoked or unrecoverable.
func (r *Runner) suspendRefusal() *cmdError {
	if t := r.st.ActiveTurn; t != nil {
		return rejected(failure.TurnAlreadyActive, "turn %s of run %s is still active; suspend an idle session", t.TurnID, t.RunID)
	}
	switch r.st.Lifecycle {
	case runnerstate.LifecycleRevoked, runnerstate.LifecycleUnrecoverable:
		return rejected(failure.RunnerStopped, "runner is %s", r.st.Lifecycle)
	}
	return nil
}

// suspend is the durable suspension of a settled runner (runner.suspend,
// session.close and the idle timeout): it stops the provider cleanly (stdin closed, grace, then
// TERM and KILL of its group), keeps the provider thread id, persists
// lifecycle suspended with the reason and emits the P0 runner.suspended. A
// failure to persist the suspension sets an immediate error exit and is
// returned; nothing is emitted then. Callers check suspendRefusal first.
func (r *Runner) suspend(reason string) error {
	r.closeProvider()
	r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleSuspended, reason
	if err := r.j.save(); err != nil {
		r.log.Error("cannot persist the suspension", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
		return err
	}
	r.log.Info("runner suspended", "reason", reason, "provider_thread_id", r.st.ProviderThreadID)
	r.emitBody(P0, prp.EventRunnerSuspended, "", &prpv1.RunnerLifecycle{Reason: reason, ProviderThreadId: r.st.ProviderThreadID})
	return nil
}

// ---- provider lifecycle ----

// closeProvider stops the provider (if any) and forgets it.
func (r *Runner) closeProvider() {
	p := r.sup.release()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*r.cfg.ProviderCloseGrace)
	if err := p.Close(ctx, r.cfg.ProviderCloseGrace); err != nil {
		r.log.Warn("provider close", "err", err)
	}
	cancel()
	r.pumpProviderEvents()
	r.st.ProviderProcess = nil
	r.mustSave()
}

// stopProvider ends an active turn and stops the provider (fatal paths).
func (r *Runner) stopProvider(code string) {
	if t := r.st.ActiveTurn; t != nil {
		r.closeProvider()
		r.emitTerminal(t, TurnResult{TurnID: t.TurnID, Status: "failed", ErrorCode: code, ErrorMessage: "runner is stopping"})
		r.st.ActiveTurn = nil
		r.mustSave()
		return
	}
	r.closeProvider()
}

// interruptActiveTurn ends a turn in progress, if any: the provider is
// stopped and the turn's terminal is interrupted/cancelled with the reason
// as its code. Without an active turn it does nothing.
func (r *Runner) interruptActiveTurn(reason string) {
	t := r.st.ActiveTurn
	if t == nil {
		return
	}
	r.closeProvider()
	r.emitTerminal(t, TurnResult{TurnID: t.TurnID, Status: "interrupted", ErrorCode: reason, ErrorMessage: "the session was stopped during the turn"})
	r.st.ActiveTurn = nil
	r.mustSave()
}

// stopSession stops the provider, records lifecycle stopped and emits
// runner.stopped; an active turn ends as interrupted/cancelled.
func (r *Runner) stopSession(reason string) {
	r.interruptActiveTurn(reason)
	r.closeProvider()
	r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleStopped, reason
	r.mustSave()
	r.emitBody(P0, prp.EventRunnerStopped, "", &prpv1.RunnerLifecycle{Reason: reason})
}

// onTurnDone ends the active turn: the provider events still queued and
// the turn's run.terminal are journaled together (one fsync) and sent in
// one batch. The state that clears the active turn is saved once the
// controller acknowledged them (saveWhenAcked).
func (r *Runner) onTurnDone(res TurnResult) {
	r.endTurn(nil, 0, res)
}

// endTurn is onTurnDone with provider events already drained (evs, up to
// cursor) ahead of the ones still queued.
func (r *Runner) endTurn(evs []pendingEvent, cursor uint64, res TurnResult) {
	r.lastActivity = time.Now()
	more, c := r.providerEvents()
	evs, cursor = append(evs, more...), max(cursor, c)
	t := r.st.ActiveTurn
	if t == nil || (res.TurnID != "" && res.TurnID != t.TurnID) {
		r.journalProvider(evs, cursor)
		r.log.Warn("turn result for a turn that is not active; ignored", "turn_id", res.TurnID)
		return
	}
	r.journalProvider(append(evs, r.terminalEvent(t, res)), cursor)
	r.st.ActiveTurn = nil
	r.saveWhenAcked(r.st.NextSourceSeq - 1)
}

// takeProviderExit handles the live provider's exit now if it exited
// (onProviderExit), instead of at the loop's next turn.
func (r *Runner) takeProviderExit() {
	if r.sup.prov == nil {
		return
	}
	select {
	case <-r.sup.prov.Exited():
		r.onProviderExit()
	default:
	}
}

// onProviderExit handles a provider that exited under a live runnerd: its
// last events and a turn it finished just before are taken, harness.exited
// names the provider's own cause, and an active turn is reconciled on a
// restarted provider (recoverTurn, SPEC R7). Without an active turn the
// next turn.start restarts the provider and resumes the thread.
func (r *Runner) onProviderExit() {
	r.pumpProviderEvents()
	p := r.sup.prov
	// A turn that finished just before the exit still counts as finished.
	select {
	case res := <-p.TurnDone():
		r.onTurnDone(res)
	default:
	}
	err := p.ExitErr()
	code := ProviderErrorCode(err)
	if code == "" {
		code = failure.ProviderProcessExited
	}
	msg := "provider exited"
	if err != nil {
		msg = err.Error()
	}
	pi := p.Process()
	r.log.Warn("provider exited unexpectedly", "code", code, "err", err, "pid", pi.PID)
	r.closeProvider()
	r.emitBody(P0, prp.EventHarnessExited, "", &prpv1.HarnessExited{Code: code, Message: msg, Pid: int32(pi.PID), Pgid: int32(pi.PGID)})
	if t := r.st.ActiveTurn; t != nil {
		r.recoverTurn(t, code, msg)
	}
	// The gateway's view (ListRunners, GetSession) drops the dead process
	// (or shows its replacement) now, not at its next ping.
	r.pongDue = false
	r.pong(0)
	r.lastActivity = time.Now()
}

// emitTerminal emits the P0 run.terminal event for a finished turn.
func (r *Runner) emitTerminal(t *runnerstate.Turn, res TurnResult) {
	r.emitAll([]pendingEvent{r.terminalEvent(t, res)})
}

// terminalEvent is the P0 run.terminal event for a finished turn, labelled
// with the turn's run.
func (r *Runner) terminalEvent(t *runnerstate.Turn, res TurnResult) pendingEvent {
	turnState := res.Status
	runState := "failed"
	switch res.Status {
	case "completed":
		runState = "succeeded"
	case "interrupted":
		runState = "cancelled"
	default:
		turnState = "failed"
	}
	body := &prpv1.RunTerminal{
		TurnTerminalState: turnState,
		RunTerminalState:  runState,
		FinalMessage:      res.FinalMessage,
		Usage:             usageReport(res),
		ProviderTurnId:    t.TurnID,
		ProviderThreadId:  r.st.ProviderThreadID,
		Code:              res.ErrorCode,
		Message:           res.ErrorMessage,
	}
	if res.Status == "interrupted" {
		body.FinalMessage = r.streamed.partialOutput(t.TurnID, res.FinalMessage)
		body.Partial = true
	}
	for _, a := range res.Artifacts {
		body.Artifacts = append(body.Artifacts, &prpv1.ResultArtifact{Kind: a.Kind, Ref: a.Ref})
	}
	// The run the turn belongs to labels the event.
	return pendingEvent{prio: P0, typ: prp.EventRunTerminal, turnID: t.TurnID, body: body, runID: t.RunID}
}

// usageReport is the runner's usage report of a finished turn (SPEC E1):
// {runDelta, total[, cost]}, runDelta the turn's own usage, total the
// provider session's cumulative usage (omitted when the provider reported
// none) and cost the turn's cost {amount, currency} when it reported one.
func usageReport(res TurnResult) *prpv1.TurnUsage {
	counters := func(u Usage) *prpv1.UsageCounters {
		return &prpv1.UsageCounters{
			InputTokens:       proto.Float64(float64(u.InputTokens)),
			CachedInputTokens: proto.Float64(float64(u.CachedInputTokens)),
			OutputTokens:      proto.Float64(float64(u.OutputTokens)),
		}
	}
	out := &prpv1.TurnUsage{RunDelta: counters(res.Usage)}
	if res.Total != nil {
		out.Total = counters(*res.Total)
	}
	if res.Cost != nil {
		// The ACPX cost shape {amount, currency} (SPEC E1).
		out.Cost = &prpv1.Cost{Amount: res.Cost.Amount, Currency: res.Cost.Currency}
	}
	return out
}

// toolContract is a digest of the run's declared dynamic tools (empty for
// none): runs with equal contracts share a live provider. The built-in
// tools are the same for every run and are not part of it.
func toolContract(in *prpv1.ExecutionInput) string {
	tools := declaredTools(in)
	if len(tools) == 0 {
		return ""
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// dynamicTools are the tools the provider is offered: the run's declared
// tools, followed by the built-in tether_ask_user (SPEC E4) unless the run
// declares a tool of that name itself.
func dynamicTools(in *prpv1.ExecutionInput) []provider.DynamicTool {
	out := declaredTools(in)
	for _, t := range in.GetDynamicTools() {
		if t.GetName() == askuser.ToolName {
			return out
		}
	}
	schema, err := json.Marshal(askuser.InputSchema())
	if err != nil {
		return out
	}
	return append(out, provider.DynamicTool{Type: "function", Name: askuser.ToolName, Description: askuser.Description(), InputSchema: schema})
}

// declaredTools renders the run's declared tools in codex's thread/start
// shape: {type:"function", name, description, inputSchema}.
func declaredTools(in *prpv1.ExecutionInput) []provider.DynamicTool {
	var out []provider.DynamicTool
	for _, t := range in.GetDynamicTools() {
		schema := json.RawMessage(`{"type":"object"}`)
		if t.GetInputSchema() != nil {
			if b, err := json.Marshal(t.GetInputSchema().AsMap()); err == nil {
				schema = b
			}
		}
		out = append(out, provider.DynamicTool{Type: "function", Name: t.GetName(), Description: t.GetDescription(), InputSchema: schema})
	}
	return out
}
