// Package fakeacp is a deterministic stand-in for an ACP agent
// (@agentclientprotocol/codex-acp or claude-agent-acp) speaking the Agent
// Client Protocol over stdio: newline-delimited JSON-RPC 2.0, logs on
// stderr. cmd/fake-acp-agent wraps it; the R11 driver's tests (package
// internal/acp) run it as a real process.
//
// What it imitates (facts in reference/opencode-acpx.md §4): initialize with
// loadSession; session/new with the flavour's modes (codex: read-only,
// workspace-write, agent, agent-full-access; claude: default, acceptEdits,
// plan, auto, bypassPermissions) and the default mode each real agent picks;
// session/set_mode; session/prompt streaming session/update notifications and
// answering {stopReason, usage}; session/cancel; session/load replaying the
// history before answering; session/request_permission with the flavour's
// option ids; and two traps: a warning sent as an agent_message_chunk without
// a messageId on the first prompt of each process, and not exiting when stdin
// closes (the driver must kill the process group).
//
// The reply is keyed on the prompt text:
//
//	[die]      the process SIGKILLs itself before answering
//	[fail]     the prompt fails with JSON-RPC error -32603
//	[history]  "HISTORY: <earlier user texts joined by " | ">"
//	[hold]     one chunk, then nothing until session/cancel
//	[slow]     "ECHO: <text>" in SlowChunks chunks, SlowDelay apart
//	[plan]     a plan update (three entries), then the echo
//	[shell]    a tool call of kind execute; [read] one of kind read
//	anything   "ECHO: <text>", one chunk per word
//
// A tool call asks session/request_permission unless the mode runs tools
// freely (codex agent-full-access, claude bypassPermissions); in codex's
// default `agent` mode the call is rejected by an "automatic review" without
// asking (the real trap). Allowed: the tool completes with ToolOutput and the
// reply is "TOOL RESULT: <output>". Rejected: codex ends the turn cancelled;
// claude fails the tool call and answers "TOOL REJECTED" (end_turn).
package fakeacp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/acp/acpwire"
)

// ToolOutput is what an allowed tool call prints.
const ToolOutput = "hello-from-fake-acp"

// SlowChunks is the number of chunks of a [slow] reply.
const SlowChunks = 12

// WarningText is the warning chunk (no messageId) of a process's first prompt.
const WarningText = "Warning: fake agent notice without a message id"

// Options configure the fake.
type Options struct {
	// Flavor is "codex" or "claude" (modes, option ids, reject semantics).
	Flavor string
	// StateDir keeps one JSON file per session for session/load.
	StateDir string
	// CallLog, when set, gets one line per received method.
	CallLog string
	// NoLoad: initialize says loadSession false.
	NoLoad bool
	// DeltaDelay is the pause before each chunk; SlowDelay before each
	// chunk of a [slow] reply.
	DeltaDelay, SlowDelay time.Duration
	// Child, when set, is started (in the agent's process group) at startup
	// like codex-acp's codex child; its pid goes to the call log.
	Child []string
}

// Agent is one fake agent process.
type Agent struct {
	opts Options
	out  io.Writer

	outMu sync.Mutex
	mu    sync.Mutex
	// sessions loaded or created by this process.
	sessions map[string]*session
	// replies to this agent's own requests (request_permission), by id.
	waiting map[string]chan json.RawMessage
	nextReq int
	prompts int
	logMu   sync.Mutex
}

type session struct {
	ID      string     `json:"sessionId"`
	Cwd     string     `json:"cwd"`
	Mode    string     `json:"mode"`
	Model   string     `json:"model"`
	History []histItem `json:"history"`
	Seq     int        `json:"seq"`
	// Cost is the session's cumulative cost in USD (usage_update reports it).
	Cost float64 `json:"cost"`

	cancel chan struct{} // closed by session/cancel during a prompt
	busy   bool
}

type histItem struct {
	Role      string `json:"role"`
	Text      string `json:"text"`
	MessageID string `json:"messageId"`
}

// New returns an agent writing to out.
func New(opts Options, out io.Writer) *Agent {
	if opts.Flavor == "" {
		opts.Flavor = "codex"
	}
	if opts.SlowDelay == 0 {
		opts.SlowDelay = 150 * time.Millisecond
	}
	return &Agent{opts: opts, out: out, sessions: map[string]*session{}, waiting: map[string]chan json.RawMessage{}}
}

type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

// Serve reads requests from in until it closes. Like the real agents it
// does not exit then: the caller decides (cmd/fake-acp-agent blocks).
func (a *Agent) Serve(in io.Reader) error {
	a.log("process-start")
	if len(a.opts.Child) > 0 {
		if err := a.startChild(); err != nil {
			return err
		}
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var m message
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			fmt.Fprintf(os.Stderr, "fake-acp: bad frame: %v\n", err)
			continue
		}
		a.dispatch(m)
	}
	return sc.Err()
}

func (a *Agent) dispatch(m message) {
	switch {
	case m.Method == "" && len(m.ID) > 0:
		a.mu.Lock()
		ch := a.waiting[string(m.ID)]
		delete(a.waiting, string(m.ID))
		a.mu.Unlock()
		if ch != nil {
			ch <- m.Result
		}
	case m.Method == acpwire.MethodSessionCancel:
		a.log(m.Method)
		var p acpwire.SessionRef
		_ = json.Unmarshal(m.Params, &p)
		a.mu.Lock()
		if s := a.sessions[p.SessionID]; s != nil && s.busy && s.cancel != nil {
			select {
			case <-s.cancel:
			default:
				close(s.cancel)
			}
		}
		a.mu.Unlock()
	case len(m.ID) > 0:
		a.log(m.Method)
		if m.Method == acpwire.MethodSessionPrompt {
			go a.prompt(m.ID, m.Params)
			return
		}
		res, err := a.handle(m.Method, m.Params)
		if err != nil {
			a.respondError(m.ID, err)
			return
		}
		a.respond(m.ID, res)
		a.after(m.Method, res)
	default:
		a.log(m.Method)
	}
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

func (a *Agent) handle(method string, raw json.RawMessage) (any, *rpcError) {
	switch method {
	case acpwire.MethodInitialize:
		return acpwire.InitializeResponse{
			ProtocolVersion: acpwire.ProtocolVersion,
			AgentInfo:       &acpwire.Implementation{Name: "fake-acp-" + a.opts.Flavor, Title: "fake ACP agent", Version: "0.0.1"},
			AgentCapabilities: acpwire.AgentCapabilities{
				LoadSession:        !a.opts.NoLoad,
				PromptCapabilities: acpwire.PromptCapabilities{EmbeddedContext: true},
			},
			AuthMethods: []json.RawMessage{},
			Meta:        &acpwire.AgentMeta{Steering: &acpwire.Supported{}},
		}, nil
	case acpwire.MethodSessionNew:
		var p acpwire.NewSessionParams
		_ = json.Unmarshal(raw, &p)
		s := &session{ID: a.newSessionID(), Cwd: p.Cwd, Mode: a.defaultMode(), Model: "fake-model"}
		a.mu.Lock()
		a.sessions[s.ID] = s
		a.mu.Unlock()
		if err := a.save(s); err != nil {
			return nil, &rpcError{-32603, err.Error()}
		}
		return a.sessionAnswer(s), nil
	case acpwire.MethodSessionLoad:
		var p acpwire.LoadSessionParams
		_ = json.Unmarshal(raw, &p)
		return a.loadSession(p.SessionID)
	case acpwire.MethodSessionSetMode:
		var p acpwire.SetModeParams
		_ = json.Unmarshal(raw, &p)
		if !contains(a.modes(), p.ModeID) && a.session(p.SessionID) != nil {
			return nil, &rpcError{-32602, "unknown mode " + p.ModeID}
		}
		return a.setSession(p.SessionID, func(s *session) { s.Mode = p.ModeID })
	case acpwire.MethodSessionSetModel:
		var p acpwire.SetModelParams
		_ = json.Unmarshal(raw, &p)
		return a.setSession(p.SessionID, func(s *session) { s.Model = p.ModelID })
	}
	return nil, &rpcError{-32601, "Method not found: " + method}
}

// loadSession answers session/load after replaying the session's history.
func (a *Agent) loadSession(id string) (any, *rpcError) {
	s, err := a.load(id)
	if err != nil {
		return nil, &rpcError{-32002, "Resource not found: session " + id}
	}
	a.mu.Lock()
	a.sessions[id] = s
	a.mu.Unlock()
	for _, h := range s.History {
		kind := acpwire.UpdateAgentMessageChunk
		if h.Role == "user" {
			kind = acpwire.UpdateUserMessageChunk
		}
		a.notify(acpwire.MethodSessionUpdate, acpwire.SessionNotification{SessionID: id, Update: acpwire.MessageChunk(kind, h.MessageID, h.Text)})
	}
	return a.sessionAnswer(s), nil
}

// setSession changes a known session with set and saves it.
func (a *Agent) setSession(id string, set func(*session)) (any, *rpcError) {
	s := a.session(id)
	if s == nil {
		return nil, &rpcError{-32002, "Resource not found: session " + id}
	}
	a.mu.Lock()
	set(s)
	a.mu.Unlock()
	_ = a.save(s)
	return struct{}{}, nil
}

// after sends the notifications the real agents send after an answer.
func (a *Agent) after(method string, res any) {
	switch method {
	case acpwire.MethodSessionNew:
		id := res.(acpwire.SessionResponse).SessionID
		a.notify(acpwire.MethodSessionUpdate, acpwire.SessionNotification{SessionID: id, Update: acpwire.SessionUpdate{
			SessionUpdate: acpwire.UpdateAvailableCommands, AvailableCommands: []json.RawMessage{}}})
	}
}

func (a *Agent) sessionAnswer(s *session) acpwire.SessionResponse {
	var modes []acpwire.SessionMode
	for _, m := range a.modes() {
		modes = append(modes, acpwire.SessionMode{ID: m, Name: m})
	}
	return acpwire.SessionResponse{
		SessionID: s.ID,
		Modes:     &acpwire.SessionModeState{CurrentModeID: s.Mode, AvailableModes: modes},
		Models: &acpwire.SessionModelState{CurrentModelID: s.Model, AvailableModels: []acpwire.ModelInfo{
			{ModelID: "fake-model", Name: "Fake"}, {ModelID: "fake-model-large", Name: "Fake large"}}},
	}
}

func (a *Agent) modes() []string {
	if a.opts.Flavor == "claude" {
		return []string{"default", "acceptEdits", "plan", "auto", "bypassPermissions"}
	}
	return []string{"read-only", "workspace-write", "agent", "agent-full-access"}
}

func (a *Agent) defaultMode() string {
	if a.opts.Flavor == "claude" {
		return "auto"
	}
	return "agent"
}

func (a *Agent) newSessionID() string {
	b := make([]byte, 8)
	f, err := os.Open("/dev/urandom")
	if err == nil {
		_, _ = io.ReadFull(f, b)
		_ = f.Close()
	}
	return fmt.Sprintf("fake-acp-%x", b)
}

func (a *Agent) session(id string) *session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions[id]
}

// prompt runs one session/prompt (on its own goroutine, so that cancel and
// permission answers are read meanwhile).
func (a *Agent) prompt(id, raw json.RawMessage) {
	var p acpwire.PromptParams
	if err := json.Unmarshal(raw, &p); err != nil {
		a.respondError(id, &rpcError{-32602, "invalid params"})
		return
	}
	var parts []string
	for _, b := range p.Prompt {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	text := strings.Join(parts, "\n")
	a.mu.Lock()
	s := a.sessions[p.SessionID]
	if s == nil || s.busy {
		a.mu.Unlock()
		a.respondError(id, &rpcError{-32602, "session unknown or busy: " + p.SessionID})
		return
	}
	s.busy, s.cancel = true, make(chan struct{})
	a.prompts++
	first := a.prompts == 1
	earlier := s.userTexts()
	s.History = append(s.History, histItem{Role: "user", Text: text, MessageID: fmt.Sprintf("u-%d", len(s.History))})
	a.mu.Unlock()
	t := &turn{a: a, s: s, text: text}
	res, rerr := t.run(first, earlier)
	a.mu.Lock()
	s.busy = false
	a.mu.Unlock()
	if err := a.save(s); err != nil {
		fmt.Fprintf(os.Stderr, "fake-acp: save: %v\n", err)
	}
	if rerr != nil {
		a.respondError(id, rerr)
		return
	}
	a.respond(id, res)
}

func (s *session) userTexts() []string {
	var out []string
	for _, h := range s.History {
		if h.Role == "user" {
			out = append(out, h.Text)
		}
	}
	return out
}

// ---- persistence ----

func (a *Agent) path(id string) string {
	return filepath.Join(a.opts.StateDir, filepath.Base(id)+".json")
}

func (a *Agent) save(s *session) error {
	if a.opts.StateDir == "" {
		return nil
	}
	a.mu.Lock()
	b, err := json.Marshal(s)
	a.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(a.opts.StateDir, 0o700); err != nil {
		return err
	}
	tmp := a.path(s.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, a.path(s.ID))
}

func (a *Agent) load(id string) (*session, error) {
	if a.opts.StateDir == "" || id == "" {
		return nil, os.ErrNotExist
	}
	b, err := os.ReadFile(a.path(id))
	if err != nil {
		return nil, err
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ---- wire ----

func (a *Agent) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	_, _ = a.out.Write(append(b, '\n'))
}

// Outgoing JSON-RPC 2.0 frames.
type (
	resultFrame struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result"`
	}
	errorFrame struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *rpcError       `json:"error"`
	}
	requestFrame struct {
		JSONRPC string `json:"jsonrpc"`
		ID      int    `json:"id,omitempty"` // none for a notification
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}
)

func (a *Agent) respond(id json.RawMessage, res any) {
	a.write(resultFrame{JSONRPC: "2.0", ID: id, Result: res})
}

func (a *Agent) respondError(id json.RawMessage, e *rpcError) {
	a.write(errorFrame{JSONRPC: "2.0", ID: id, Error: e})
}

func (a *Agent) notify(method string, params any) {
	a.write(requestFrame{JSONRPC: "2.0", Method: method, Params: params})
}

// request sends a request to the client and returns the channel its result
// arrives on.
func (a *Agent) request(method string, params any) chan json.RawMessage {
	a.mu.Lock()
	a.nextReq++
	id := a.nextReq
	ch := make(chan json.RawMessage, 1)
	a.waiting[fmt.Sprint(id)] = ch
	a.mu.Unlock()
	a.write(requestFrame{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	return ch
}

func (a *Agent) log(line string) {
	if a.opts.CallLog == "" {
		return
	}
	a.logMu.Lock()
	defer a.logMu.Unlock()
	f, err := os.OpenFile(a.opts.CallLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	_, _ = fmt.Fprintln(f, line)
	_ = f.Close()
}

func (a *Agent) startChild() error {
	attr := &os.ProcAttr{Files: []*os.File{nil, nil, os.Stderr}}
	p, err := os.StartProcess(a.opts.Child[0], a.opts.Child, attr)
	if err != nil {
		return err
	}
	a.log(fmt.Sprintf("child %d", p.Pid))
	go func() { _, _ = p.Wait() }()
	return nil
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
