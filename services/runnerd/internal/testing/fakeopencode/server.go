// Package fakeopencode is a deterministic stand-in for `opencode serve`
// (OpenCode 1.18.17): the subset of its HTTP + server-sent-events API the
// R10 driver uses, with the observed shapes (reference/opencode-acpx.md §3):
//
//	GET  /event                          SSE, data-only {id, type, properties}; server.connected first, server.heartbeat
//	POST /session                        {title?} → session {id:"ses_…", slug, projectID, directory, title, version, time}
//	GET  /session/{id}                   the session, or 404 NotFoundError
//	GET  /session/status                 {"ses_…":{"type":"busy"}} for busy sessions
//	GET  /session/{id}/message           [{info, parts}] (history)
//	POST /session/{id}/prompt_async      {parts:[{type:"text",text}], model?} → 204; progress over /event
//	POST /session/{id}/abort             → true
//	DELETE /session/{id}/message/{mid}   → true (the message and its parts), 404 when unknown
//	GET  /permission                     pending permission requests
//	POST /permission/{id}/reply          {reply:"once"|"always"|"reject", message?} → true
//
// Every request needs HTTP basic auth when OPENCODE_SERVER_PASSWORD is set
// (user OPENCODE_SERVER_USERNAME, default "opencode"). Sessions persist in a
// JSON state file (the real server's SQLite database stands in the same
// place), so a restarted server continues a session with its history.
//
// The assistant's reply is keyed on the prompt text, like the mock model:
//
//	[bash] <cmd> | [shell]   a bash tool call (run with sh -c in the session directory) under the
//	                         configured permission (OPENCODE_CONFIG permission.bash: allow|ask|deny);
//	                         then "TOOL RESULT: <output or rejection>"
//	[slow]                   "ECHO: <text>" in 12 deltas, SlowDelay apart (abortable)
//	[hold]                   one delta, then nothing until the turn is aborted
//
// An aborted turn ends as OpenCode 1.18.17's does (observed): session.error
// MessageAbortedError and session.idle at once, then the aborted assistant
// message and a second session.idle, which may come after the next prompt
// was accepted (the fake holds them until then, at most AbortTailLimit).
//
//	[history]                "HISTORY: <earlier user texts joined by " | ">"
//	[fail]                   the turn ends with an APIError (session.error)
//	[die:prompt]             with Options.DieOnceDir: prompt_async SIGKILLs the server before it
//	                         records the prompt or answers, once per prompt (as [die:mid-stream])
//	[die:prompt-recorded]    likewise, after the prompt's user message was recorded
//	[drop:prompt]            with Options.DieOnceDir: prompt_async cuts the connection before it
//	                         records the prompt, once per prompt; the server lives on
//	[drop:prompt-taken]      likewise, after it took the prompt (the turn runs; no 204)
//	[die:mid-stream]         with Options.DieOnceDir: after the reply's first delta the server
//	                         SIGKILLs itself, once per prompt (a synced sentinel in DieOnceDir
//	                         records it, so the retried turn lives); the turn is recorded with
//	                         its assistant message unfinished, as the real server leaves it
//	anything else            "ECHO: <text>", one delta per word
package fakeopencode

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/opencode/opencodewire"
)

// Version is the OpenCode version the fake answers to --version.
const Version = "1.18.17"

// ShellCommand is what a [shell] prompt runs.
const ShellCommand = "echo permitted > perm.txt && echo done-bash"

// Options configure a Server.
type Options struct {
	StateFile string
	CallLog   string
	// Directory is the sessions' directory (the server's working directory).
	Directory string
	// Permission is the bash permission: allow | ask | deny.
	Permission string
	// Model is the default "provider/model".
	Model                string
	Username, Password   string
	DeltaDelay           time.Duration
	SlowDelay, Heartbeat time.Duration
	// DieOnceDir enables the "[die:…]" prompt markers (tests of SPEC R7).
	DieOnceDir string
}

// Server is the fake.
type Server struct {
	opts Options

	mu      sync.Mutex
	st      *persisted
	subs    map[chan []byte]struct{}
	running map[string]*turn // by session id
	// nextPrompt: an aborted turn's last events wait for the session's
	// next prompt (closed when it was accepted).
	nextPrompt map[string]chan struct{}
	perms      map[string]*permission
	evSeq      int
	logMu      sync.Mutex
	stopOnce   sync.Once
	stop       chan struct{}
}

type persisted struct {
	Seq      int                 `json:"seq"`
	Sessions map[string]*session `json:"sessions"`
}

type session struct {
	Info     opencodewire.Session `json:"info"`
	Messages []*message           `json:"messages"`
}

// message is a stored message (opencodewire.Message's shape); its parts are
// pointers so that a running turn updates them in place (mu held).
type message struct {
	Info  opencodewire.MessageInfo `json:"info"`
	Parts []*opencodewire.Part     `json:"parts"`
}

type turn struct {
	cancel context.CancelFunc
	ctx    context.Context
}

type permission struct {
	req   opencodewire.PermissionRequest
	reply chan [2]string // reply, message
}

// New loads the state file (if any) and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 10 * time.Second
	}
	if opts.SlowDelay <= 0 {
		opts.SlowDelay = 100 * time.Millisecond
	}
	if opts.Permission == "" {
		opts.Permission = "ask"
	}
	s := &Server{opts: opts, st: &persisted{Sessions: map[string]*session{}}, subs: map[chan []byte]struct{}{},
		running: map[string]*turn{}, nextPrompt: map[string]chan struct{}{}, perms: map[string]*permission{}, stop: make(chan struct{})}
	if opts.StateFile != "" {
		b, err := os.ReadFile(opts.StateFile)
		switch {
		case err == nil:
			if err := json.Unmarshal(b, s.st); err != nil {
				return nil, fmt.Errorf("state file %s: %w", opts.StateFile, err)
			}
			if s.st.Sessions == nil {
				s.st.Sessions = map[string]*session{}
			}
		case !os.IsNotExist(err):
			return nil, err
		}
	}
	return s, nil
}

// Close ends open event streams.
func (s *Server) Close() { s.stopOnce.Do(func() { close(s.stop) }) }

// CallLog appends one line to the call log.
func (s *Server) CallLog(line string) {
	if s.opts.CallLog == "" {
		return
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	f, err := os.OpenFile(s.opts.CallLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

// save writes the state file (mu held).
func (s *Server) save() {
	if s.opts.StateFile == "" {
		return
	}
	b, err := json.Marshal(s.st)
	if err != nil {
		return
	}
	tmp := s.opts.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		_ = os.Rename(tmp, s.opts.StateFile)
	}
}

// id returns a new durable id with the prefix (mu held).
func (s *Server) id(prefix string) string {
	s.st.Seq++
	return fmt.Sprintf("%s_fake%08d", prefix, s.st.Seq)
}

// event encodes one event.
func event(id, typ string, props any) []byte {
	raw, err := json.Marshal(props)
	if err != nil {
		panic(err) // the property types always encode
	}
	b, _ := json.Marshal(opencodewire.Event{ID: id, Type: typ, Properties: raw})
	return b
}

// publish sends one event to every subscriber.
func (s *Server) publish(typ string, props any) {
	s.mu.Lock()
	s.evSeq++
	b := event(fmt.Sprintf("evt_fake%08d", s.evSeq), typ, props)
	for ch := range s.subs {
		select {
		case ch <- b:
		default: // a subscriber that does not keep up is dropped
			delete(s.subs, ch)
			close(ch)
		}
	}
	s.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func notFound(w http.ResponseWriter, what string) {
	writeJSON(w, http.StatusNotFound, opencodewire.NewError(opencodewire.ErrNotFound, what+" not found"))
}

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Password == "" {
		return true
	}
	user, pass, ok := r.BasicAuth()
	want := s.opts.Username
	if want == "" {
		want = "opencode"
	}
	return ok && subtle.ConstantTimeCompare([]byte(user), []byte(want)) == 1 && subtle.ConstantTimeCompare([]byte(pass), []byte(s.opts.Password)) == 1
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /event", s.events)
	mux.HandleFunc("POST /session", s.createSession)
	mux.HandleFunc("GET /session/status", s.status)
	mux.HandleFunc("GET /session/{id}", s.getSession)
	mux.HandleFunc("GET /session/{id}/message", s.messages)
	mux.HandleFunc("DELETE /session/{id}/message/{messageID}", s.deleteMessage)
	mux.HandleFunc("POST /session/{id}/prompt_async", s.promptAsync)
	mux.HandleFunc("POST /session/{id}/abort", s.abort)
	mux.HandleFunc("GET /permission", s.listPermissions)
	mux.HandleFunc("POST /permission/{id}/reply", s.replyPermission)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="opencode"`)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no streaming", http.StatusInternalServerError)
		return
	}
	ch := make(chan []byte, 4096)
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if _, ok := s.subs[ch]; ok {
			delete(s.subs, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	if !write(event("evt_connected", opencodewire.EventServerConnected, struct{}{})) {
		return
	}
	hb := time.NewTicker(s.opts.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case b, ok := <-ch:
			if !ok || !write(b) {
				return
			}
		case <-hb.C:
			if !write(event("evt_heartbeat", opencodewire.EventServerHeartbeat, struct{}{})) {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.stop:
			return
		}
	}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var body opencodewire.CreateSessionRequest
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	id := s.id("ses")
	now := time.Now().UnixMilli()
	title := body.Title
	if title == "" {
		title = "New session"
	}
	info := opencodewire.Session{ID: id, Slug: strings.ToLower(id), ProjectID: "global", Directory: s.opts.Directory,
		Title: title, Version: Version, Time: opencodewire.SessionTime{Created: now, Updated: now}}
	s.st.Sessions[id] = &session{Info: info}
	s.save()
	s.mu.Unlock()
	s.CallLog("session.create " + id)
	s.publish(opencodewire.EventSessionCreated, opencodewire.SessionCreated{SessionID: id, Info: info})
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ses := s.st.Sessions[r.PathValue("id")]
	var info opencodewire.Session
	if ses != nil {
		info = ses.Info
	}
	s.mu.Unlock()
	s.CallLog("session.get " + r.PathValue("id"))
	if ses == nil {
		notFound(w, "session "+r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	out := map[string]opencodewire.Status{}
	s.mu.Lock()
	for id := range s.running {
		out[id] = opencodewire.Status{Type: "busy"}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ses := s.st.Sessions[r.PathValue("id")]
	var b []byte
	if ses != nil {
		msgs := ses.Messages
		if msgs == nil {
			msgs = []*message{}
		}
		b, _ = json.Marshal(msgs)
	}
	s.mu.Unlock()
	if ses == nil {
		notFound(w, "session "+r.PathValue("id"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) deleteMessage(w http.ResponseWriter, r *http.Request) {
	sid, mid := r.PathValue("id"), r.PathValue("messageID")
	s.mu.Lock()
	ses := s.st.Sessions[sid]
	found := false
	if ses != nil {
		for i, m := range ses.Messages {
			if m.Info.ID == mid {
				ses.Messages = append(ses.Messages[:i:i], ses.Messages[i+1:]...)
				found = true
				break
			}
		}
		if found {
			s.save()
		}
	}
	s.mu.Unlock()
	if !found {
		notFound(w, "message "+mid)
		return
	}
	s.CallLog("message.delete " + mid)
	writeJSON(w, http.StatusOK, true)
}

func (s *Server) abort(w http.ResponseWriter, r *http.Request) {
	s.CallLog("abort " + r.PathValue("id"))
	s.mu.Lock()
	t := s.running[r.PathValue("id")]
	s.mu.Unlock()
	if t != nil {
		t.cancel()
	}
	writeJSON(w, http.StatusOK, true)
}

func (s *Server) listPermissions(w http.ResponseWriter, _ *http.Request) {
	out := []opencodewire.PermissionRequest{}
	s.mu.Lock()
	for _, p := range s.perms {
		out = append(out, p.req)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) replyPermission(w http.ResponseWriter, r *http.Request) {
	var body opencodewire.PermissionReply
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || (body.Reply != "once" && body.Reply != "always" && body.Reply != "reject") {
		writeJSON(w, http.StatusBadRequest, opencodewire.NewError(opencodewire.ErrBadRequest, "reply must be once, always or reject"))
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	p := s.perms[id]
	delete(s.perms, id)
	s.mu.Unlock()
	if p == nil {
		notFound(w, "permission "+id)
		return
	}
	s.CallLog("permission-reply:" + body.Reply)
	p.reply <- [2]string{body.Reply, body.Message}
	writeJSON(w, http.StatusOK, true)
}

func (s *Server) promptAsync(w http.ResponseWriter, r *http.Request) {
	var body opencodewire.PromptRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, opencodewire.NewError(opencodewire.ErrBadRequest, err.Error()))
		return
	}
	var text []string
	for _, p := range body.Parts {
		if p.Type == "text" {
			text = append(text, p.Text)
		}
	}
	sid := r.PathValue("id")
	provider, model, _ := strings.Cut(s.opts.Model, "/")
	if body.Model != nil && body.Model.ModelID != "" {
		provider, model = body.Model.ProviderID, body.Model.ModelID
	}
	s.mu.Lock()
	ses := s.st.Sessions[sid]
	busy := s.running[sid] != nil
	var t *turn
	if ses != nil && !busy {
		ctx, cancel := context.WithCancel(context.Background())
		t = &turn{ctx: ctx, cancel: cancel}
		s.running[sid] = t
	}
	s.mu.Unlock()
	switch {
	case ses == nil:
		notFound(w, "session "+sid)
		return
	case busy:
		writeJSON(w, http.StatusConflict, opencodewire.NewError(opencodewire.ErrBusy, "session "+sid+" is busy"))
		return
	}
	prompt := strings.Join(text, "\n")
	s.dieAt(DiePrompt, prompt)
	if s.dieArmed(DiePromptRecorded, prompt) {
		s.recordUser(sid, body.MessageID, prompt, provider, model)
		s.dieAt(DiePromptRecorded, prompt)
	}
	if s.dropOnce(w, DropPrompt, prompt) {
		s.mu.Lock()
		delete(s.running, sid)
		s.mu.Unlock()
		return
	}
	s.CallLog("prompt " + sid + " " + strings.Join(text, " "))
	if !s.dropOnce(w, DropPromptTaken, prompt) {
		w.WriteHeader(http.StatusNoContent)
		// The answer is on the wire before the turn runs: a turn that
		// kills the server after its first delta ([die:mid-stream]) must
		// not race the 204 (the client would see the prompt refused, not
		// the server lost mid-turn).
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	s.mu.Lock()
	if ch := s.nextPrompt[sid]; ch != nil {
		delete(s.nextPrompt, sid)
		close(ch)
	}
	s.mu.Unlock()
	go s.runTurn(t, sid, body.MessageID, strings.Join(text, "\n"), provider, model)
}

// runShell runs a bash tool command in the session directory.
func (s *Server) runShell(ctx context.Context, command string) (string, int) {
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Dir = s.opts.Directory
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		code = 1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return string(out), code
}
