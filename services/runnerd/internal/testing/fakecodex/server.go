// Package fakecodex implements a deterministic stand-in for `codex
// app-server` (codex-cli 0.169.0): JSON-RPC over newline-delimited JSON with
// the message shapes and ordering of the real server, an echo "model", and a
// per-thread history persisted in a state file. It exists so the codex driver
// and everything above it can be tested without the real binary or a model.
package fakecodex

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// StateFileName is the state file name used with Options.StateFileInCodexHome.
const StateFileName = "fake-codex-state.json"

// ErrExitAfterTurnStart is returned by Run when Options.ExitAfterTurnStart
// stopped the server right after a turn/start response. The binary exits 1.
var ErrExitAfterTurnStart = errors.New("fakecodex: exit after turn/start requested")

// Options configures a Server. The zero value is a working in-memory server
// with no pacing delays.
type Options struct {
	// StateFile persists thread history (JSON, rewritten atomically).
	// Empty means history lives in memory for the life of the Server.
	StateFile string
	// StateFileInCodexHome uses CodexHome/fake-codex-state.json as the state
	// file, so history travels with the codex home directory.
	StateFileInCodexHome bool
	// CodexHome is reported by initialize and locates the state file for
	// StateFileInCodexHome.
	CodexHome string
	// DurableTurnIDs draws turn ids (provider-turn-<n>) from a counter kept in
	// the state file, so they stay unique across processes. Otherwise turn ids
	// are codex-turn-<n> counted per process.
	DurableTurnIDs bool
	// RequireExistingResumeState makes thread/resume of an unknown thread
	// fail with "no rollout found for thread id <id>".
	RequireExistingResumeState bool
	// CallLog, if set, gets one line appended per received method.
	CallLog string
	// RecordProcessStart appends "process-start" to the call log when Run
	// starts.
	RecordProcessStart bool
	// DeltaDelay is the pause before each agentMessage delta.
	DeltaDelay time.Duration
	// SlowDeltaDelay is the pause before each delta when the latest user
	// message contains "[slow]" (such replies are cut into SlowChunks deltas).
	SlowDeltaDelay time.Duration
	// HoldTurn keeps every turn open after its last delta until it is
	// interrupted or steered.
	HoldTurn bool
	// ExitAfterTurnStart makes Run return ErrExitAfterTurnStart right after
	// writing a turn/start response.
	ExitAfterTurnStart bool
	// EmitCommandApproval makes every turn ask a command approval before
	// its reply ("[shell]" in a prompt does it for one turn).
	EmitCommandApproval bool
	// EmitUserInput makes every turn ask item/tool/requestUserInput ("[ask]"
	// for one turn).
	EmitUserInput bool
	// EmitToolCall makes every turn call a dynamic tool ("[dyn]" for one
	// turn).
	EmitToolCall bool
	// EmitToolCallOnResume sends, right after each thread/resume response, a
	// tool call naming the thread's last stored (no longer active) turn.
	EmitToolCallOnResume bool
	// DieOnceDir enables the "[die:<phase>]" prompt markers (tests only):
	// the fake SIGKILLs itself at that phase of the turn, once per phase and
	// prompt, recording a sentinel in this directory first (see dieAt).
	DieOnceDir string
	// Stderr receives diagnostics. Nil means os.Stderr.
	Stderr io.Writer
	// Now is the clock for timestamps. Nil means time.Now.
	Now func() time.Time
}

// SlowChunks is the number of deltas a "[slow]" reply is cut into.
const SlowChunks = 10

// Server is one fake app-server process. It is single-use: call Run once.
type Server struct {
	opts      Options
	statePath string
	st        *persisted
	stderr    io.Writer
	now       func() time.Time

	callLog *os.File

	initialized  bool
	experimental bool
	clientName   string
	clientVer    string

	loaded      map[string]bool // threads started or resumed by this process
	replayUsage map[string]bool // resumed threads whose totals are replayed at the next turn/start
	active      map[string]*activeTurn
	procTurn    int
	nextReqID   int                 // server request ids, from 0 per process
	pending     map[int]*pendingReq // server requests awaiting an answer

	out *bufio.Writer
	enc *json.Encoder
}

// New validates opts, loads the state file (if any) and opens the call log.
func New(opts Options) (*Server, error) {
	s := &Server{
		opts:        opts,
		stderr:      opts.Stderr,
		now:         opts.Now,
		loaded:      map[string]bool{},
		replayUsage: map[string]bool{},
		active:      map[string]*activeTurn{},
		pending:     map[int]*pendingReq{},
	}
	if s.stderr == nil {
		s.stderr = os.Stderr
	}
	if s.now == nil {
		s.now = time.Now
	}
	switch {
	case opts.StateFile != "" && opts.StateFileInCodexHome:
		return nil, errors.New("fakecodex: StateFile and StateFileInCodexHome are exclusive")
	case opts.StateFileInCodexHome:
		if opts.CodexHome == "" {
			return nil, errors.New("fakecodex: StateFileInCodexHome needs CodexHome (set CODEX_HOME)")
		}
		s.statePath = filepath.Join(opts.CodexHome, StateFileName)
	default:
		s.statePath = opts.StateFile
	}
	s.st = newPersisted()
	if s.statePath != "" {
		st, _, err := loadState(s.statePath)
		if err != nil {
			return nil, err
		}
		s.st = st
	}
	if opts.CallLog != "" {
		f, err := os.OpenFile(opts.CallLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("fakecodex: open call log: %w", err)
		}
		s.callLog = f
	}
	return s, nil
}

// StatePath is the resolved state file path ("" when history is in memory).
func (s *Server) StatePath() string { return s.statePath }

// Run serves JSON-RPC lines from in and writes protocol lines to out until
// in reaches EOF (returns nil), ctx is done, a write fails, or
// ExitAfterTurnStart fires (returns ErrExitAfterTurnStart). All protocol
// work happens on the calling goroutine; a helper goroutine reads in and
// ends when in does, so a caller that stops Run early should close in.
func (s *Server) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	defer s.closeCallLog()
	s.out = bufio.NewWriter(out)
	s.enc = json.NewEncoder(s.out)
	s.enc.SetEscapeHTML(false)

	if s.opts.RecordProcessStart {
		s.logCall("process-start")
	}

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go readLines(in, lines, readErr, done)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	for {
		if err := s.runDue(); err != nil {
			return err
		}
		var tick <-chan time.Time
		if due, ok := s.nextDue(); ok {
			timer.Reset(time.Until(due))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case line, ok := <-lines:
			if !ok {
				// stdin closed: the real server exits 0.
				return <-readErr
			}
			if err := s.handleLine(line); err != nil {
				return err
			}
		case <-tick:
		}
		timer.Stop()
	}
}

func readLines(in io.Reader, lines chan<- []byte, readErr chan<- error, done <-chan struct{}) {
	defer close(lines)
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			select {
			case lines <- trimmed:
			case <-done:
				readErr <- nil
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			readErr <- err
			return
		}
	}
}

func (s *Server) diag(format string, args ...any) {
	fmt.Fprintf(s.stderr, "fake-codex-app-server: "+format+"\n", args...)
}

func (s *Server) nowMs() int64 { return s.now().UnixMilli() }

// ---- output ----

func (s *Server) write(v any) error {
	if err := s.enc.Encode(v); err != nil {
		return fmt.Errorf("fakecodex: write: %w", err)
	}
	if err := s.out.Flush(); err != nil {
		return fmt.Errorf("fakecodex: write: %w", err)
	}
	return nil
}

func (s *Server) respond(id json.RawMessage, result any) error {
	return s.write(responseMsg{ID: id, Result: result})
}

func (s *Server) respondError(id json.RawMessage, e *rpcError) error {
	return s.write(errorMsg{ID: id, Error: e})
}

func (s *Server) notify(method string, params any) error {
	return s.write(notificationMsg{Method: method, Params: params, EmittedAtMs: s.nowMs()})
}

// ---- call log ----

func (s *Server) logCall(entry string) {
	if s.callLog == nil {
		return
	}
	entry = strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(entry)
	// One write per line: with O_APPEND concurrent writers never interleave
	// inside a line.
	if _, err := s.callLog.Write([]byte(entry + "\n")); err != nil {
		s.diag("call log write failed: %v", err)
	}
}

func (s *Server) closeCallLog() {
	if s.callLog != nil {
		_ = s.callLog.Close()
		s.callLog = nil
	}
}

// toolResponseEntry summarises a client's response to a server request for
// the call log: the first text content item, "failure", or the raw result.
func toolResponseEntry(m *inbound) string {
	if len(m.Error) > 0 && string(m.Error) != "null" {
		return "tool-response:failure"
	}
	var r struct {
		Success      *bool `json:"success"`
		ContentItems []struct {
			Text string `json:"text"`
		} `json:"contentItems"`
	}
	if err := json.Unmarshal(m.Result, &r); err == nil {
		if r.Success != nil && !*r.Success {
			return "tool-response:failure"
		}
		for _, c := range r.ContentItems {
			if c.Text != "" {
				return "tool-response:" + c.Text
			}
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, m.Result); err != nil {
		return "tool-response:" + string(m.Result)
	}
	return "tool-response:" + compact.String()
}

// ---- persistence ----

func (s *Server) save() error {
	if s.statePath == "" {
		return nil
	}
	if err := s.refresh(); err != nil {
		return err
	}
	if err := saveState(s.statePath, s.st); err != nil {
		return fmt.Errorf("fakecodex: %w", err)
	}
	return nil
}

// refresh merges the state file into memory. Threads this process started or
// resumed are owned here (the real server holds a per-thread writer lock) and
// keep their in-memory version; every other thread is taken from disk, where
// another process may have changed it. Counters take the larger value, so ids
// stay unique when processes take turns on one state file.
func (s *Server) refresh() error {
	if s.statePath == "" {
		return nil
	}
	disk, _, err := loadState(s.statePath)
	if err != nil {
		return fmt.Errorf("fakecodex: %w", err)
	}
	for id, th := range disk.Threads {
		if !s.loaded[id] {
			s.st.Threads[id] = th
		}
	}
	s.st.NextThread = max(s.st.NextThread, disk.NextThread)
	s.st.NextTurn = max(s.st.NextTurn, disk.NextTurn)
	return nil
}

// lookupStored finds a thread: owned threads from memory, others from the
// state file's latest version.
func (s *Server) lookupStored(id string) (*threadState, bool, error) {
	if !s.loaded[id] {
		if err := s.refresh(); err != nil {
			return nil, false, err
		}
	}
	th, ok := s.st.Threads[id]
	return th, ok, nil
}

// ---- dispatch ----

func (s *Server) handleLine(line []byte) error {
	var m inbound
	if err := json.Unmarshal(line, &m); err != nil {
		s.diag("ignoring malformed line: %v", err)
		return nil
	}
	switch {
	case m.Method == "" && m.hasID():
		// A response to a server->client request: log its outcome and let
		// the waiting turn go on.
		return s.handleClientResponse(&m)
	case m.Method == "":
		s.diag("ignoring line without method or id")
		return nil
	}
	s.logCall(m.Method)
	if !m.hasID() {
		// Client notifications: `initialized` and anything else are accepted
		// and ignored.
		return nil
	}
	return s.handleRequest(&m)
}

type handler func(id json.RawMessage, p params) error

func (s *Server) handlerFor(method string) handler {
	switch method {
	case "initialize":
		return s.handleInitialize
	case "thread/start":
		return s.handleThreadStart
	case "thread/resume":
		return s.handleThreadResume
	case "thread/read":
		return s.handleThreadRead
	case "thread/revert":
		return s.handleThreadRevert
	case "turn/start":
		return s.handleTurnStart
	case "turn/steer":
		return s.handleTurnSteer
	case "turn/interrupt":
		return s.handleTurnInterrupt
	}
	return nil
}

func (s *Server) handleRequest(m *inbound) error {
	h := s.handlerFor(m.Method)
	if h == nil {
		return s.respondError(m.ID, unknownVariant(m.Method))
	}
	if m.Method != "initialize" && !s.initialized {
		return s.respondError(m.ID, invalidRequest("Not initialized"))
	}
	p, perr := parseParams(m.Params)
	if perr != nil {
		return s.respondError(m.ID, perr)
	}
	return h(m.ID, p)
}

func (s *Server) handleInitialize(id json.RawMessage, p params) error {
	if s.initialized {
		return s.respondError(id, invalidRequest("Already initialized"))
	}
	if !p.has("clientInfo") {
		return s.respondError(id, missingField("clientInfo"))
	}
	var ci struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(p["clientInfo"], &ci); err != nil {
		return s.respondError(id, invalidRequest("Invalid request: invalid type for `clientInfo`"))
	}
	if ci.Name == "" {
		return s.respondError(id, missingField("name"))
	}
	if p.has("capabilities") {
		var caps struct {
			ExperimentalAPI bool `json:"experimentalApi"`
		}
		_ = json.Unmarshal(p["capabilities"], &caps)
		s.experimental = caps.ExperimentalAPI
	}
	s.initialized = true
	s.clientName, s.clientVer = ci.Name, ci.Version
	return s.respond(id, codexwire.InitializeResponse{
		UserAgent:      fmt.Sprintf("%s/%s (fake-codex; linux) (%s; %s)", ci.Name, cliVersion, ci.Name, ci.Version),
		CodexHome:      s.opts.CodexHome,
		PlatformFamily: "unix",
		PlatformOs:     "linux",
	})
}

// ---- threads ----

func (s *Server) threadObject(th *threadState, turns []codexwire.Turn) codexwire.Thread {
	if turns == nil {
		turns = []codexwire.Turn{}
	}
	var path *string
	if s.statePath != "" && !th.Ephemeral {
		path = &s.statePath
	}
	preview := ""
	for _, t := range th.Turns {
		for _, it := range t.Items {
			if it.Type == itemUserMessage && preview == "" {
				preview = strings.Join(it.Texts, "\n")
			}
		}
	}
	_, active := s.active[th.ID]
	return codexwire.Thread{
		ID:            th.ID,
		SessionID:     th.ID,
		Preview:       preview,
		Ephemeral:     th.Ephemeral,
		HistoryMode:   "paginated",
		ModelProvider: "fake",
		Model:         th.Model,
		CreatedAt:     th.CreatedAt,
		UpdatedAt:     th.UpdatedAt,
		Status:        threadStatus(active),
		Path:          path,
		Cwd:           th.Cwd,
		CliVersion:    cliVersion,
		Originator:    th.Originator,
		Source:        "vscode",
		Turns:         turns,
	}
}

func (s *Server) threadResponse(th *threadState, turns []codexwire.Turn) codexwire.ThreadResponse {
	return codexwire.ThreadResponse{
		Thread:             s.threadObject(th, turns),
		Model:              th.Model,
		ModelProvider:      "fake",
		Cwd:                th.Cwd,
		ApprovalPolicy:     th.ApprovalPolicy,
		ApprovalsReviewer:  "user",
		Sandbox:            sandboxObject(th.Sandbox),
		MultiAgentMode:     "explicitRequestOnly",
		InstructionSources: []json.RawMessage{},
	}
}

// applySettings copies the optional per-thread settings of thread/start and
// thread/resume onto th.
func applySettings(th *threadState, p params) *rpcError {
	var err *rpcError
	if th.Cwd, err = p.optStr("cwd", th.Cwd); err != nil {
		return err
	}
	if th.Model, err = p.optStr("model", th.Model); err != nil {
		return err
	}
	if th.ApprovalPolicy, err = p.optStr("approvalPolicy", th.ApprovalPolicy); err != nil {
		return err
	}
	if th.Sandbox, err = p.optStr("sandbox", th.Sandbox); err != nil {
		return err
	}
	return nil
}

func (s *Server) handleThreadStart(id json.RawMessage, p params) error {
	if p.has("dynamicTools") && !s.experimental {
		return s.respondError(id, invalidRequest("thread/start.dynamicTools requires experimentalApi capability"))
	}
	ephemeral, perr := p.optBool("ephemeral")
	if perr != nil {
		return s.respondError(id, perr)
	}
	cwd, _ := os.Getwd()
	nowS := s.now().Unix()
	th := &threadState{
		Cwd:            cwd,
		Model:          "fake-model",
		ApprovalPolicy: "never",
		Sandbox:        "read-only",
		Ephemeral:      ephemeral,
		Originator:     s.clientName,
		CreatedAt:      nowS,
		UpdatedAt:      nowS,
		Turns:          []*turnState{},
	}
	if perr := applySettings(th, p); perr != nil {
		return s.respondError(id, perr)
	}
	if p.has("dynamicTools") {
		th.DynamicTools = append(json.RawMessage(nil), p["dynamicTools"]...)
	}
	if err := s.refresh(); err != nil {
		return err
	}
	s.st.NextThread++
	th.Seq = s.st.NextThread
	th.ID = fmt.Sprintf("codex-thread-%d", th.Seq)
	s.st.Threads[th.ID] = th
	s.loaded[th.ID] = true
	if err := s.save(); err != nil {
		return err
	}
	if err := s.respond(id, s.threadResponse(th, nil)); err != nil {
		return err
	}
	// The real server announces the thread after the response.
	return s.notify(codexwire.NotifyThreadStarted, codexwire.ThreadStarted{Thread: s.threadObject(th, nil)})
}

func (s *Server) handleThreadResume(id json.RawMessage, p params) error {
	threadID, perr := p.str("threadId")
	if perr != nil {
		return s.respondError(id, perr)
	}
	excludeTurns, perr := p.optBool("excludeTurns")
	if perr != nil {
		return s.respondError(id, perr)
	}
	th, ok, err := s.lookupStored(threadID)
	if err != nil {
		return err
	}
	if !ok {
		if s.opts.RequireExistingResumeState {
			return s.respondError(id, invalidRequest("no rollout found for thread id %s", threadID))
		}
		return s.respondError(id, invalidRequest("thread not found: %s", threadID))
	}
	if perr := applySettings(th, p); perr != nil {
		return s.respondError(id, perr)
	}
	if p.has("dynamicTools") {
		th.DynamicTools = append(json.RawMessage(nil), p["dynamicTools"]...)
	}
	if !s.loaded[threadID] {
		s.loaded[threadID] = true
		s.replayUsage[threadID] = true
		// A turn still in progress on disk belonged to a process that died
		// mid-turn; the real server shows it as interrupted after a resume.
		for _, t := range th.Turns {
			if t.Status == statusInProgress {
				t.Status = statusInterrupted
			}
		}
	}
	if err := s.save(); err != nil {
		return err
	}
	var turns []codexwire.Turn
	if !excludeTurns {
		if err := s.notify(codexwire.NotifyDeprecationNotice, codexwire.DeprecationNotice{
			Summary: "Full-history hydration is deprecated for paginated threads; use `excludeTurns: true`, then page with `thread/turns/list` and `thread/items/list`.",
		}); err != nil {
			return err
		}
		for _, t := range th.Turns {
			turns = append(turns, historyTurn(t, true))
		}
	}
	_, active := s.active[threadID]
	if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: threadID, Status: threadStatus(active)}); err != nil {
		return err
	}
	if err := s.respond(id, s.threadResponse(th, turns)); err != nil {
		return err
	}
	if s.opts.EmitToolCallOnResume {
		return s.emitStaleToolCall(th)
	}
	return nil
}

func (s *Server) handleThreadRead(id json.RawMessage, p params) error {
	threadID, perr := p.str("threadId")
	if perr != nil {
		return s.respondError(id, perr)
	}
	includeTurns, perr := p.optBool("includeTurns")
	if perr != nil {
		return s.respondError(id, perr)
	}
	th, ok, err := s.lookupStored(threadID)
	if err != nil {
		return err
	}
	if !ok {
		return s.respondError(id, invalidRequest("thread not found: %s", threadID))
	}
	// Turn summaries (id, status) are always listed so a client can
	// reconcile an active turn cheaply; items only with includeTurns.
	turns := make([]codexwire.Turn, 0, len(th.Turns))
	for _, t := range th.Turns {
		turns = append(turns, historyTurn(t, includeTurns))
	}
	return s.respond(id, codexwire.ThreadReadResponse{Thread: s.threadObject(th, turns)})
}

// handleThreadRevert replaces a loaded thread's durable history with the
// prefix before beforeTurnId (codex 0.169.0 thread/revert): that turn and
// every later one are dropped. An active turn cannot be reverted.
func (s *Server) handleThreadRevert(id json.RawMessage, p params) error {
	th, perr := s.loadedThread(p)
	if perr != nil {
		return s.respondError(id, perr)
	}
	before, perr := p.str("beforeTurnId")
	if perr != nil {
		return s.respondError(id, perr)
	}
	if _, active := s.active[th.ID]; active {
		return s.respondError(id, invalidRequest("thread %s has an active turn", th.ID))
	}
	cut := -1
	for i, t := range th.Turns {
		if t.ID == before {
			cut = i
		}
	}
	if cut < 0 {
		return s.respondError(id, invalidRequest("thread/revert: turn not found: %s", before))
	}
	th.Turns = th.Turns[:cut]
	if err := s.save(); err != nil {
		return err
	}
	if err := s.respond(id, codexwire.ThreadRevertResponse{Thread: s.threadObject(th, nil)}); err != nil {
		return err
	}
	return s.notify(codexwire.NotifyThreadReverted, codexwire.ThreadRef{ThreadID: th.ID})
}

// loadedThread resolves a thread id for turn methods, which only work on
// threads started or resumed by this process.
func (s *Server) loadedThread(p params) (*threadState, *rpcError) {
	threadID, perr := p.str("threadId")
	if perr != nil {
		return nil, perr
	}
	th, ok := s.st.Threads[threadID]
	if !ok || !s.loaded[threadID] {
		return nil, invalidRequest("thread not found: %s", threadID)
	}
	return th, nil
}
