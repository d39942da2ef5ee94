package runner

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// Emitting events: each takes the next source seq, is journaled (one
// fsync per batch) before it is sent, and stays within the outbox limits
// (backpressure).

// newEvent assigns the next source seq and builds the journaled envelope
// of e (its typed body, else its provider payload). The event is labelled
// with e.runID, or else with the attached run.
func (r *Runner) newEvent(e pendingEvent) (statedir.Record, error) {
	prio, typ, turnID, itemID := e.prio, e.typ, e.turnID, e.itemID
	if prio > P2 {
		prio = P1
	}
	seq := r.st.NextSourceSeq
	ev := &prpv1.Event{
		Schema:              EventSchema,
		SourceInstanceId:    r.st.Identity.RunnerInstanceID,
		SourceEventId:       SourceEventID(r.st.Identity.RunnerInstanceID, seq),
		SourceSeq:           seq,
		SourceKind:          SourceKindRunner,
		NormalizedSessionId: r.st.Identity.NormalizedSessionID,
		TurnId:              turnID,
		ItemId:              itemID,
		EventType:           typ,
		SchemaVersion:       EventSchemaVersion,
		Priority:            prio,
		EmittedAt:           nowTS(time.Now()),
	}
	ev.RunId = eventRun(e.runID, turnID, r.st.ActiveTurn, r.st.CurrentRun)
	var s *structpb.Struct
	var err error
	if e.body != nil {
		s, err = prp.Payload(e.body)
	} else {
		s, err = toStruct(e.payload)
	}
	if err != nil {
		return statedir.Record{}, err
	}
	ev.Payload = s
	env, err := encodeEnvelope(ev)
	if err != nil {
		return statedir.Record{}, err
	}
	if len(env) > maxEnvelopeBytes {
		s, _ := prp.Payload(&prpv1.HarnessDiagnostic{
			Code:              failure.ProviderFrameTooLarge,
			Message:           fmt.Sprintf("%s event of %d bytes exceeds the frame limit", typ, len(env)),
			OriginalEventType: typ,
		})
		ev.EventType, ev.Payload, ev.Priority = prp.EventHarnessDiagnostic, s, P1
		if env, err = encodeEnvelope(ev); err != nil {
			return statedir.Record{}, err
		}
	}
	r.st.NextSourceSeq++
	return statedir.Record{SourceSeq: seq, Priority: ev.Priority, EventType: ev.EventType, Envelope: env}, nil
}

// eventRun is the run an event is labelled with: the one it names, else
// the active turn's run for an event of that turn (a turn belongs to the
// run whose turn.start started it — also after a runnerd restart that cut
// that run's run.attach short, when the attached run is still the previous
// one), else the attached run.
func eventRun(runID, turnID string, active *runnerstate.Turn, current *runnerstate.RunRef) string {
	switch {
	case runID != "":
		return runID
	case active != nil && turnID != "" && turnID == active.TurnID && active.RunID != "":
		return active.RunID
	case current != nil:
		return current.RunID
	}
	return ""
}

type pendingEvent struct {
	prio                uint32
	typ, turnID, itemID string
	// body is the typed payload of an event runnerd itself emits; payload
	// that of a provider's event (opaque).
	body    proto.Message
	payload map[string]any
	// runID labels the event (default: the attached run).
	runID string
}

// emitAll journals events (one fsync) and then sends them, within the
// outbox limits: a non-P0 event that does not fit below
// MaxOutboxBytes-P0ReserveBytes is rejected and puts the runner in
// backpressure (P0 runner.backpressure, lifecycle backpressure); P0 events
// may use the reserve; a P0 event beyond MaxOutboxBytes is unrecoverable.
// A rejected event takes no source seq, so seqs stay contiguous.
func (r *Runner) emitAll(evs []pendingEvent) {
	if r.j.hold {
		r.j.held = append(r.j.held, evs...)
		return
	}
	if len(r.j.held) > 0 {
		evs = append(r.j.held, evs...)
		r.j.held = nil
	}
	recs := make([]statedir.Record, 0, len(evs))
	opened := false // a runtime request or tool call is announced
	held := r.j.outbox.Bytes()
	soft := r.cfg.MaxOutboxBytes - r.cfg.P0ReserveBytes
	var add func(e pendingEvent) bool
	add = func(e pendingEvent) bool {
		if e.turnID != "" && isTurnEvent(e.typ) && r.turnEventJournaled(e.turnID) {
			// A turn reconciled after a loss (SPEC R7) whose event the
			// live provider's was: its result settles it, the event is
			// not journaled twice (X1).
			te := r.st.LastTurnEvent
			r.log.Info("the turn's event is journaled already; the reconciled one is not journaled again",
				"turn_id", e.turnID, "event_type", e.typ, "journaled", te.EventType, "journaled_seq", te.SourceSeq)
			return true
		}
		rec, err := r.newEvent(e)
		if err != nil {
			r.log.Error("dropping unencodable event", "event_type", e.typ, "err", err)
			return true
		}
		size := uint64(len(rec.Envelope))
		switch {
		case rec.Priority == P0 && held+size > r.cfg.MaxOutboxBytes:
			r.st.NextSourceSeq = rec.SourceSeq
			r.log.Error("durable outbox limit exhausted by a P0 event", "event_type", rec.EventType, "outbox_bytes", held, "event_bytes", size,
				"max_outbox_bytes", r.cfg.MaxOutboxBytes)
			return false
		case rec.Priority != P0 && held+size > soft:
			r.st.NextSourceSeq = rec.SourceSeq
			r.st.BackpressureDropped++
			if !r.st.Backpressure {
				r.st.Backpressure = true
				r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleBackpressure, failure.OutboxSoftLimit
				r.log.Warn("outbox soft limit reached: backpressure; non-P0 events are rejected until acknowledged",
					"outbox_bytes", held, "soft_limit", soft)
				return add(pendingEvent{prio: P0, typ: prp.EventRunnerBackpressure, body: &prpv1.RunnerBackpressure{
					Active: proto.Bool(true), OutboxBytes: float64(held), SoftLimitBytes: float64(soft),
					MaxOutboxBytes: float64(r.cfg.MaxOutboxBytes), RejectedEventType: rec.EventType,
				}})
			}
			return true
		}
		held += size
		r.st.PeakOutboxBytes = max(r.st.PeakOutboxBytes, held)
		recs = append(recs, rec)
		r.noteTurnEvent(rec.EventType, e.turnID, rec.SourceSeq, e.payload)
		label := e.runID
		if label == "" && r.st.CurrentRun != nil {
			label = r.st.CurrentRun.RunID
		}
		if r.trackRequest(e, label) {
			r.requestsDirty = true
			opened = opened || e.typ == prp.EventRuntimeRequestCreated || e.typ == prp.EventToolInput
		}
		return true
	}
	entered := r.st.Backpressure
	for _, e := range evs {
		if !add(e) {
			r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleUnrecoverable, failure.P0StorageExhausted
			r.journal(recs)
			_ = r.j.save()
			r.setExit(ExitError, failure.P0StorageExhausted, true)
			return
		}
	}
	if opened {
		// The state knows an announced request before the controller
		// does: a restarted runnerd announces it expired (SPEC R8).
		r.requestsDirty = false
		r.mustSave()
	}
	r.journal(recs)
	if r.st.Backpressure && !entered {
		r.mustSave()
	}
}

// journal appends recs to the outbox (one fsync) and sends them.
func (r *Runner) journal(recs []statedir.Record) {
	if len(recs) == 0 {
		return
	}
	if err := r.j.append(recs); err != nil {
		r.log.Error("cannot journal events", "err", err)
		r.st.NextSourceSeq = recs[0].SourceSeq
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleUnrecoverable, failure.OutboxWriteFailed
		_ = r.j.save()
		r.setExit(ExitError, failure.OutboxWriteFailed, true)
		return
	}
	r.sendRecords(recs)
}

// relieveBackpressure leaves backpressure once acknowledgements brought the
// outbox to half the soft limit (hysteresis, so it does not flap).
func (r *Runner) relieveBackpressure() {
	if !r.st.Backpressure {
		return
	}
	soft := r.cfg.MaxOutboxBytes - r.cfg.P0ReserveBytes
	if r.j.outbox.Bytes() > soft/2 {
		return
	}
	dropped := r.st.BackpressureDropped
	r.st.Backpressure, r.st.BackpressureDropped = false, 0
	if r.st.Lifecycle == runnerstate.LifecycleBackpressure {
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleConnecting, ""
		if r.link.connected() {
			r.st.Lifecycle = runnerstate.LifecycleReady
		}
	}
	r.log.Info("backpressure relieved", "outbox_bytes", r.j.outbox.Bytes(), "rejected_events", dropped)
	r.emitBody(P0, prp.EventRunnerBackpressure, "", &prpv1.RunnerBackpressure{
		Active: proto.Bool(false), OutboxBytes: float64(r.j.outbox.Bytes()), RejectedEvents: float64(dropped),
	})
	r.mustSave()
}

// flushHeld journals (and sends) the held events.
func (r *Runner) flushHeld() {
	if len(r.j.held) == 0 {
		return
	}
	hold := r.j.hold
	r.j.hold = false
	r.emitAll(nil)
	r.j.hold = hold
}

// emitBody emits runnerd's own event typ with its typed payload body.
func (r *Runner) emitBody(prio uint32, typ, turnID string, body proto.Message) {
	r.emitAll([]pendingEvent{{prio: prio, typ: typ, turnID: turnID, body: body}})
}

// pumpProviderEvents journals (one fsync) and sends every provider event
// queued so far.
func (r *Runner) pumpProviderEvents() {
	evs, cursor := r.providerEvents()
	r.journalProvider(evs, cursor)
}

// pumpQueued is the loop's pumpProviderEvents. When the events queued end
// the active turn (its turn.<status>), the turn's result, which every
// provider driver delivers right behind that event, is awaited (at most
// TurnEndFollowWindow) so that the event and the turn's run.terminal are
// journaled together: one outbox fsync and one batch, which the executor
// persists in one commit (SPEC P2). Journaled as they came, they were
// often two of each (the loop woke on the event before the result was
// delivered), the terminal's commit queued behind the event's. Nothing is
// journaled in another order: the events still precede the terminal.
func (r *Runner) pumpQueued(turnDone <-chan TurnResult, exited <-chan struct{}) {
	evs, cursor := r.providerEvents()
	if t := r.st.ActiveTurn; t != nil && endsTurn(evs, t.TurnID) {
		timer := time.NewTimer(r.cfg.TurnEndFollowWindow)
		defer timer.Stop()
		select {
		case res := <-turnDone:
			r.endTurn(evs, cursor, res)
			return
		case <-exited: // the loop takes the exit (and a result it left) next
		case <-timer.C:
		}
	}
	r.journalProvider(evs, cursor)
}

// endsTurn reports whether evs hold turn turnID's turn.<status> event.
func endsTurn(evs []pendingEvent, turnID string) bool {
	for i := len(evs) - 1; i >= 0; i-- {
		if isTurnEvent(evs[i].typ) && evs[i].turnID == turnID {
			return true
		}
	}
	return false
}

// providerEvents drains the provider events queued so far, and the
// provider host cursor they reach (0: none).
func (r *Runner) providerEvents() ([]pendingEvent, uint64) {
	evs, cursor, any := r.sup.events()
	if any {
		r.lastActivity = time.Now()
	}
	return evs, cursor
}

// journalProvider journals provider events and the events derived from
// them (one group commit: one fsync, then sent together).
func (r *Runner) journalProvider(evs []pendingEvent, cursor uint64) {
	if len(evs) == 0 && cursor == 0 && len(r.j.held) == 0 {
		return
	}
	// Held events go first, in the same fsync. The cursor is journaled
	// with the batch's last record: after a crash the host replays
	// exactly the lines after it.
	hold := r.j.hold
	r.j.hold = false
	r.j.cursor = cursor
	r.emitAll(evs)
	r.j.cursor = 0
	r.j.hold = hold
	if cursor > 0 && (r.exit == nil || !r.exit.immediate) {
		// A mark no journaled event carried (it came after its line's
		// events were journaled, or for a line without events) is
		// journaled on its own: a restart must not replay its line.
		if err := r.j.outbox.MarkCursor(cursor); err != nil {
			r.log.Warn("journaling the provider host cursor", "cursor", cursor, "err", err)
		}
		r.st.ProviderCursor = max(r.st.ProviderCursor, cursor)
	}
	if r.requestsDirty && !hold && r.exit == nil {
		// A request opened or settled: the state follows soon, so that a
		// restart knows what to announce expired (SPEC R8).
		r.requestsDirty = false
		r.saveSoon()
	}
}
