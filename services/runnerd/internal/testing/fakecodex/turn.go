package fakecodex

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// activeTurn is the in-memory progress of the one running turn of a thread.
// The fake "model" streams a reply as a list of deltas on a timer driven by
// the Run loop; a steer throws the partial reply away and starts a new one.
type activeTurn struct {
	thread *threadState
	turn   *turnState

	agent     *itemState // reply being streamed; never stored unless completed
	replies   int        // agent items started in this turn (for item ids)
	reply     string
	chunks    []string
	next      int
	delay     time.Duration
	due       time.Time
	scheduled bool
	hold      bool

	phases    []string // server requests still to make before the reply
	waiting   bool     // a server request is open
	waitingID int
	outcomes  []string // answers to this turn's server requests, for the reply
	prompt    string   // the turn's first input (for the [die:…] markers)
	// stallUntil is set while a "[stall:mid-stream]" hold lasts (see
	// StallMidStream): the next delta waits for the release file.
	stallUntil time.Time
}

// ReplyText is the fake model's deterministic answer. prompt is the turn's
// user messages joined with " | ", turnNo the 1-based turn number in the
// thread and earlier the number of user+assistant messages stored in the
// thread's earlier turns, so the text proves the history was reused.
func ReplyText(prompt string, turnNo, earlier int) string {
	return fmt.Sprintf("ECHO: %s (turn %d, %d earlier messages)", prompt, turnNo, earlier)
}

// splitWords cuts text after each run of spaces, like the word-per-delta
// stream the real server relays from a model.
func splitWords(text string) []string {
	var out []string
	start := 0
	for i := 0; i < len(text); i++ {
		if text[i] == ' ' && (i+1 == len(text) || text[i+1] != ' ') {
			out = append(out, text[start:i+1])
			start = i + 1
		}
	}
	if start < len(text) {
		out = append(out, text[start:])
	}
	return out
}

// splitEven cuts text into at most n chunks of (nearly) equal rune length.
func splitEven(text string, n int) []string {
	runes := []rune(text)
	size := (len(runes) + n - 1) / n
	if size == 0 {
		return []string{text}
	}
	var out []string
	for i := 0; i < len(runes); i += size {
		out = append(out, string(runes[i:min(i+size, len(runes))]))
	}
	return out
}

func userText(it *itemState) string { return strings.Join(it.Texts, "\n") }

func itemChars(it *itemState) int {
	if it.Type == itemAgentMessage {
		return utf8.RuneCountInString(it.Text)
	}
	return utf8.RuneCountInString(userText(it))
}

func (s *Server) newTurnID() string {
	if s.opts.DurableTurnIDs {
		s.st.NextTurn++
		return fmt.Sprintf("provider-turn-%d", s.st.NextTurn)
	}
	s.procTurn++
	return fmt.Sprintf("codex-turn-%d", s.procTurn)
}

func turnStartObject(turnID string, startedAt *int64) codexwire.Turn {
	return codexwire.Turn{
		ID:         turnID,
		RootTurnID: turnID,
		Items:      []json.RawMessage{},
		ItemsView:  "notLoaded",
		Status:     statusInProgress,
		StartedAt:  startedAt,
	}
}

func (s *Server) handleTurnStart(id json.RawMessage, p params) error {
	th, perr := s.loadedThread(p)
	if perr != nil {
		return s.respondError(id, perr)
	}
	texts, perr := p.inputTexts()
	if perr != nil {
		return s.respondError(id, perr)
	}
	s.dieAt(DieAtTurnStart, strings.Join(texts, "\n"))
	if at, ok := s.active[th.ID]; ok {
		// Like the real server: no second turn; the input joins the active
		// one, which then behaves as if steered.
		if err := s.respond(id, codexwire.TurnStartResponse{Turn: turnStartObject(at.turn.ID, nil)}); err != nil {
			return err
		}
		return s.restart(at, texts)
	}

	if s.replayUsage[th.ID] {
		delete(s.replayUsage, th.ID)
		// After a resume the real server first replays the persisted totals,
		// tagged with the last stored turn, before answering turn/start.
		if th.Usage.Total.TotalTokens > 0 && len(th.Turns) > 0 {
			last := th.Turns[len(th.Turns)-1].ID
			if err := s.notify(codexwire.NotifyTokenUsageUpdated, tokenUsageParams(th.ID, last, th.Usage)); err != nil {
				return err
			}
		}
	}

	if s.opts.DurableTurnIDs {
		// Pick up the counter of any process that used the file since.
		if err := s.refresh(); err != nil {
			return err
		}
	}
	nowMs := s.nowMs()
	t := &turnState{ID: s.newTurnID(), Status: statusInProgress, Items: []*itemState{}, StartedAtMs: nowMs}
	th.Turns = append(th.Turns, t)
	th.UpdatedAt = nowMs / 1000
	at := &activeTurn{thread: th, turn: t, hold: s.opts.HoldTurn, prompt: strings.Join(texts, "\n")}
	user := s.recordUserMessage(at, texts)
	s.active[th.ID] = at
	// Persist before answering: a crash after the response leaves an
	// in-progress turn on disk, which a later resume shows as interrupted.
	if err := s.save(); err != nil {
		return err
	}
	s.stallAt(StallTurnRecorded, at.prompt)
	if err := s.respond(id, codexwire.TurnStartResponse{Turn: turnStartObject(t.ID, nil)}); err != nil {
		return err
	}
	if s.opts.ExitAfterTurnStart {
		return ErrExitAfterTurnStart
	}
	if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: th.ID, Status: threadStatus(true)}); err != nil {
		return err
	}
	if err := s.notify(codexwire.NotifyTurnStarted, codexwire.TurnNotification{
		ThreadID: th.ID,
		Turn:     turnStartObject(t.ID, int64p(t.StartedAtMs/1000)),
	}); err != nil {
		return err
	}
	if err := s.emitUserMessage(at, user); err != nil {
		return err
	}
	at.phases = s.requestPhases(strings.Join(texts, "\n"))
	return s.continueTurn(at)
}

func (s *Server) handleTurnSteer(id json.RawMessage, p params) error {
	th, perr := s.loadedThread(p)
	if perr != nil {
		return s.respondError(id, perr)
	}
	expected, perr := p.str("expectedTurnId")
	if perr != nil {
		return s.respondError(id, perr)
	}
	texts, perr := p.inputTexts()
	if perr != nil {
		return s.respondError(id, perr)
	}
	at, ok := s.active[th.ID]
	if !ok {
		return s.respondError(id, invalidRequest("expected active turn id `%s` but found no active turn", expected))
	}
	if at.turn.ID != expected {
		return s.respondError(id, invalidRequest("expected active turn id `%s` but found `%s`", expected, at.turn.ID))
	}
	if err := s.respond(id, codexwire.TurnSteerResponse{TurnID: at.turn.ID}); err != nil {
		return err
	}
	return s.restart(at, texts)
}

func (s *Server) handleTurnInterrupt(id json.RawMessage, p params) error {
	th, perr := s.loadedThread(p)
	if perr != nil {
		return s.respondError(id, perr)
	}
	turnID, perr := p.str("turnId")
	if perr != nil {
		return s.respondError(id, perr)
	}
	at, ok := s.active[th.ID]
	if !ok {
		// Nothing to interrupt: acknowledge, emit nothing.
		return s.respond(id, struct{}{})
	}
	if at.turn.ID != turnID {
		return s.respondError(id, invalidRequest("expected active turn id `%s` but found `%s`", turnID, at.turn.ID))
	}
	if err := s.markInterrupted(at); err != nil {
		return err
	}
	// An aborted model stream adds no usage, but the real server re-emits
	// the unchanged totals before acknowledging.
	if th.Usage.Total.TotalTokens > 0 {
		if err := s.notify(codexwire.NotifyTokenUsageUpdated, tokenUsageParams(th.ID, at.turn.ID, th.Usage)); err != nil {
			return err
		}
	}
	if err := s.respond(id, struct{}{}); err != nil {
		return err
	}
	return s.finishInterrupted(at)
}

// markInterrupted ends the turn as interrupted in the state.
func (s *Server) markInterrupted(at *activeTurn) error {
	at.scheduled = false
	nowMs := s.nowMs()
	t, th := at.turn, at.thread
	t.Status = statusInterrupted
	t.EndedAtMs = nowMs
	th.UpdatedAt = nowMs / 1000
	delete(s.active, th.ID)
	return s.save()
}

// finishInterrupted withdraws an open server request and announces the
// interrupted turn.
func (s *Server) finishInterrupted(at *activeTurn) error {
	th := at.thread
	if at.waiting {
		at.waiting = false
		delete(s.pending, at.waitingID)
		if err := s.notify(codexwire.NotifyServerRequestResolved, requestResolved(th.ID, at.waitingID)); err != nil {
			return err
		}
	}
	if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: th.ID, Status: threadStatus(false)}); err != nil {
		return err
	}
	obj := historyTurn(at.turn, false)
	return s.notify(codexwire.NotifyTurnCompleted, codexwire.TurnNotification{ThreadID: th.ID, Turn: obj})
}

// interruptTurn ends the turn on the server's own account (a cancel
// decision).
func (s *Server) interruptTurn(at *activeTurn) error {
	if err := s.markInterrupted(at); err != nil {
		return err
	}
	return s.finishInterrupted(at)
}

// recordUserMessage stores a user message in the active turn (state only).
func (s *Server) recordUserMessage(at *activeTurn, texts []string) *itemState {
	n := 0
	for _, it := range at.turn.Items {
		if it.Type == itemUserMessage {
			n++
		}
	}
	nowMs := s.nowMs()
	it := &itemState{
		Type:          itemUserMessage,
		ID:            fmt.Sprintf("%s-user-%d", at.turn.ID, n+1),
		Texts:         append([]string(nil), texts...),
		StartedAtMs:   nowMs,
		CompletedAtMs: nowMs,
	}
	at.turn.Items = append(at.turn.Items, it)
	return it
}

func (s *Server) emitUserMessage(at *activeTurn, it *itemState) error {
	if err := s.notify(codexwire.NotifyItemStarted, codexwire.ItemStarted{
		Item:        rawItem(userMessageObject(it, false)),
		ThreadID:    at.thread.ID,
		TurnID:      at.turn.ID,
		StartedAtMs: it.StartedAtMs,
	}); err != nil {
		return err
	}
	return s.notify(codexwire.NotifyItemCompleted, codexwire.ItemCompleted{
		Item:          rawItem(userMessageObject(it, true)),
		ThreadID:      at.thread.ID,
		TurnID:        at.turn.ID,
		CompletedAtMs: it.CompletedAtMs,
	})
}

// restart implements steering: the partial reply is abandoned (its item never
// completes and is not stored), the new input becomes another user message of
// the same turn, and a fresh reply covering all of the turn's input streams.
func (s *Server) restart(at *activeTurn, texts []string) error {
	at.scheduled = false
	at.hold = false
	at.agent = nil
	at.phases = nil
	if at.waiting {
		// The open server request is withdrawn; a late answer is only logged.
		at.waiting = false
		delete(s.pending, at.waitingID)
	}
	th := at.thread
	user := s.recordUserMessage(at, texts)
	if err := s.save(); err != nil {
		return err
	}
	if th.Usage.Total.TotalTokens > 0 {
		if err := s.notify(codexwire.NotifyTokenUsageUpdated, tokenUsageParams(th.ID, at.turn.ID, th.Usage)); err != nil {
			return err
		}
	}
	if err := s.emitUserMessage(at, user); err != nil {
		return err
	}
	return s.beginReply(at)
}

// beginReply computes the reply for the turn's input so far, announces the
// agentMessage item and schedules its deltas.
func (s *Server) beginReply(at *activeTurn) error {
	th := at.thread
	var prompts []string
	lastUser := ""
	for _, it := range at.turn.Items {
		if it.Type == itemUserMessage {
			lastUser = userText(it)
			prompts = append(prompts, lastUser)
		}
	}
	earlier := 0
	for _, t := range th.Turns[:len(th.Turns)-1] {
		earlier += len(t.Items)
	}
	at.reply = ReplyText(strings.Join(prompts, " | "), len(th.Turns), earlier)
	if len(at.outcomes) > 0 {
		at.reply += " [" + strings.Join(at.outcomes, "; ") + "]"
	}
	for _, o := range probes(lastUser) {
		at.reply += " [" + o + "]"
	}
	if strings.Contains(lastUser, "[slow]") {
		at.chunks = splitEven(at.reply, SlowChunks)
		at.delay = s.opts.SlowDeltaDelay
	} else {
		at.chunks = splitWords(at.reply)
		at.delay = s.opts.DeltaDelay
	}
	at.replies++
	nowMs := s.nowMs()
	at.agent = &itemState{
		Type:        itemAgentMessage,
		ID:          fmt.Sprintf("msg-%s-%d", at.turn.ID, at.replies),
		StartedAtMs: nowMs,
	}
	at.next = 0
	at.due = time.Now().Add(at.delay)
	at.scheduled = true
	if err := s.planAtStart(at); err != nil {
		return err
	}
	return s.notify(codexwire.NotifyItemStarted, codexwire.ItemStarted{
		Item:        rawItem(agentMessageObject(at.agent, false)),
		ThreadID:    th.ID,
		TurnID:      at.turn.ID,
		StartedAtMs: nowMs,
	})
}

// nextDue is the earliest pending step over all active turns.
func (s *Server) nextDue() (time.Time, bool) {
	at := s.earliest()
	if at == nil {
		return time.Time{}, false
	}
	return at.due, true
}

func (s *Server) earliest() *activeTurn {
	var best *activeTurn
	for _, at := range s.active {
		if !at.scheduled {
			continue
		}
		if best == nil || at.due.Before(best.due) || (at.due.Equal(best.due) && at.thread.Seq < best.thread.Seq) {
			best = at
		}
	}
	return best
}

// runDue performs every step whose time has come, in due order.
func (s *Server) runDue() error {
	for {
		at := s.earliest()
		if at == nil || at.due.After(time.Now()) {
			return nil
		}
		if err := s.step(at); err != nil {
			return err
		}
	}
}

func (s *Server) step(at *activeTurn) error {
	if s.stalled(at) {
		at.due = time.Now().Add(stallPoll)
		return nil
	}
	delta := at.chunks[at.next]
	at.next++
	if err := s.notify(codexwire.NotifyAgentMessageDelta, codexwire.Delta{
		ThreadID: at.thread.ID,
		TurnID:   at.turn.ID,
		ItemID:   at.agent.ID,
		Delta:    delta,
	}); err != nil {
		return err
	}
	if at.next == 1 {
		s.dieAt(DieMidStream, at.prompt)
		s.stallMidStream(at)
	}
	if at.next < len(at.chunks) {
		at.due = time.Now().Add(at.delay)
		return nil
	}
	at.scheduled = false
	if at.hold {
		return nil // --hold-turn: wait for a steer or an interrupt
	}
	return s.completeTurn(at)
}

func (s *Server) completeTurn(at *activeTurn) error {
	th, t, agent := at.thread, at.turn, at.agent
	nowMs := s.nowMs()
	agent.Text = at.reply
	agent.CompletedAtMs = nowMs

	// Deterministic usage: the "model input" is every stored message of the
	// earlier turns plus this turn's user messages; the earlier turns' part
	// is a prompt-cache hit (cached input). The thread total grows by it, so
	// from the second turn on a turn's usage and the thread total differ.
	chars := 0
	for _, prev := range th.Turns[:len(th.Turns)-1] {
		for _, it := range prev.Items {
			chars += itemChars(it)
		}
	}
	cached := int64(chars / 4)
	for _, it := range t.Items {
		chars += itemChars(it)
	}
	input := int64(chars/4 + 1)
	output := int64(utf8.RuneCountInString(at.reply)/4 + 1)
	last := codexwire.TokenCounts{TotalTokens: input + output, InputTokens: input, CachedInputTokens: cached, OutputTokens: output}
	th.Usage.Total.Add(last)
	th.Usage.Last = last

	t.Items = append(t.Items, agent)
	t.Status = statusCompleted
	t.EndedAtMs = nowMs
	th.UpdatedAt = nowMs / 1000
	delete(s.active, th.ID)
	// Durable before the client can observe the completion.
	if err := s.save(); err != nil {
		return err
	}
	s.dieAt(DieAfterCompletion, at.prompt)

	if err := s.planAtEnd(at); err != nil {
		return err
	}
	if err := s.notify(codexwire.NotifyItemCompleted, codexwire.ItemCompleted{
		Item:          rawItem(agentMessageObject(agent, true)),
		ThreadID:      th.ID,
		TurnID:        t.ID,
		CompletedAtMs: nowMs,
	}); err != nil {
		return err
	}
	if err := s.notify(codexwire.NotifyTokenUsageUpdated, tokenUsageParams(th.ID, t.ID, th.Usage)); err != nil {
		return err
	}
	if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: th.ID, Status: threadStatus(false)}); err != nil {
		return err
	}
	obj := historyTurn(t, false)
	obj.Items = []json.RawMessage{rawItem(agentMessageObject(agent, true))}
	obj.ItemsView = "summary"
	return s.notify(codexwire.NotifyTurnCompleted, codexwire.TurnNotification{ThreadID: th.ID, Turn: obj})
}
