// Package mockmodel is a deterministic mock of the OpenAI Responses API
// (POST {base}/responses, server-sent events) for driving the real
// `codex app-server` offline, and of the Chat Completions API (chat.go,
// for OpenCode). It listens on a loopback address only and
// records every request, so tests can assert that each model request of
// codex reached it.
//
// The reply is keyed on the request's input (see Reply):
//
//	last input item is a *_call_output   "TOOL RESULT: <output after "Output:\n", or the whole output>"
//	last user text contains [slow]       "ECHO: <text>" in 12 deltas, SlowChunkDelay apart
//	[shell]                              function_call exec_command {cmd: ShellCommand, yield_time_ms: 5000}
//	[escalate]                           the same with sandbox_permissions require_escalated (codex asks approval)
//	[dyn]                                function_call mock_lookup {"key":"alpha"}
//	[ask]                                function_call request_user_input (one question "color", options red/blue)
//	[plan]                               function_call update_plan (PlanExplanation, PlanSteps, the first in progress)
//	[fail]                               response.failed (server_error)
//	[history]                            "HISTORY: <the earlier user texts joined by " | ">" (HistoryReply):
//	                                     what the provider resent of its history, user messages only
//	anything else                        "ECHO: <text>", one delta per word
//
// The "last user text" is the text of the last user message that does not
// start with "<" (codex sends <environment_context> and similar as user
// messages). Usage: input_tokens = body bytes / 4, output_tokens = words.
package mockmodel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ShellCommand is what a [shell] prompt asks codex to run.
const ShellCommand = "mkdir -p approved-dir && echo hello-from-mock-shell"

// PlanSteps is what a [plan] prompt has the model put in its update_plan call.
var PlanSteps = []string{"Read the code", "Make the change", "Run the tests"}

// PlanExplanation is the explanation of a [plan] update_plan call.
const PlanExplanation = "Plan for the mock change."

// SlowChunks is the number of deltas of a [slow] reply (Server.SlowChunkDelay
// apart).
const SlowChunks = 12

// Request is one recorded model request.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         json.RawMessage // the request body as received
	// LastUserText is the text the reply was keyed on ("" after a tool
	// output); InputTexts lists every message text of the input in order,
	// prefixed with the role ("user: …", "assistant: …").
	LastUserText string
	InputTexts   []string
	Reply        string // "text:<…>", "call:<tool>", "failed"
	Aborted      bool   // the client closed the stream before the end
}

// Server is a running mock.
type Server struct {
	// SlowChunkDelay is the pause between [slow] deltas (default 250ms).
	SlowChunkDelay time.Duration

	ln   net.Listener
	srv  *http.Server
	done chan struct{}

	mu         sync.Mutex
	reqs       []Request
	unexpected []string
	seq        int
}

// Start listens on addr ("127.0.0.1:0" when empty), which must be a
// loopback address.
func Start(addr string) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("mockmodel: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("mockmodel: refusing to listen on non-loopback address %q", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mockmodel: %w", err)
	}
	s := &Server{SlowChunkDelay: 250 * time.Millisecond, ln: ln, done: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// BaseURL is the Responses API base for codex's config (…/v1).
func (s *Server) BaseURL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, ending open streams.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	return nil
}

// Requests returns the recorded model requests.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Unexpected lists requests to anything but a served API (POST
// …/responses, …/chat/completions).
func (s *Server) Unexpected() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.unexpected...)
}

func (s *Server) nextID(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("%s_mock_%03d", prefix, s.seq)
}

// api is one model API the mock serves: POST requests whose path ends in
// suffix go to serve, with the raw JSON body (each API decodes the request
// type it defines). Each API lives in its own file and adds its entry to
// apis.
type api struct {
	suffix string
	serve  func(s *Server, w http.ResponseWriter, r *http.Request, raw []byte)
}

var apis = []api{{"/responses", (*Server).serveResponses}}

// ServeHTTP routes a POST to the API its path names; anything else is
// recorded as unexpected.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var route *api
	for i := range apis {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, apis[i].suffix) {
			route = &apis[i]
		}
	}
	if route == nil {
		s.mu.Lock()
		s.unexpected = append(s.unexpected, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var object map[string]json.RawMessage
	if err := json.Unmarshal(raw, &object); err != nil {
		http.Error(w, "body is not JSON", http.StatusBadRequest)
		return
	}
	route.serve(s, w, r, raw)
}

// newRequest starts the record of a request with its raw body.
func newRequest(r *http.Request, raw []byte) Request {
	return Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: json.RawMessage(raw)}
}

// record appends a request and returns the function that sets its reply.
func (s *Server) record(rec Request) (setReply func(reply string, aborted bool)) {
	s.mu.Lock()
	idx := len(s.reqs)
	s.reqs = append(s.reqs, rec)
	s.mu.Unlock()
	return func(reply string, aborted bool) {
		s.mu.Lock()
		s.reqs[idx].Reply = reply
		s.reqs[idx].Aborted = aborted
		s.mu.Unlock()
	}
}

type sseWriter struct {
	w   http.ResponseWriter
	ctx context.Context
	err error
}

// stream sends text through send in chunks (one per word when chunks is
// nil), delay apart; false when the client went away first.
func (e *sseWriter) stream(text string, chunks []string, delay time.Duration, send func(chunk string)) bool {
	if chunks == nil {
		chunks = strings.SplitAfter(text, " ")
	}
	for i, c := range chunks {
		if i > 0 && delay > 0 {
			select {
			case <-time.After(delay):
			case <-e.ctx.Done():
				e.err = e.ctx.Err()
			}
		}
		if e.err != nil {
			return false
		}
		send(c)
	}
	return true
}

func (e *sseWriter) event(typ string, data any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(data)
	if err != nil {
		e.err = err
		return
	}
	var buf bytes.Buffer
	buf.WriteString("event: " + typ + "\ndata: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	e.write(buf.Bytes())
}

// write writes and flushes one SSE frame.
func (e *sseWriter) write(frame []byte) {
	if _, err := e.w.Write(frame); err != nil {
		e.err = err
		return
	}
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
	if e.ctx.Err() != nil {
		e.err = e.ctx.Err()
	}
}

// HistoryReply is the reply to a [history] prompt: "HISTORY: " and the
// user texts before the last one (context messages starting with "<"
// skipped), joined by " | ". texts are "role: text" lines.
func HistoryReply(texts []string) string {
	var users []string
	for _, t := range texts {
		if u, ok := strings.CutPrefix(t, "user: "); ok && !strings.HasPrefix(strings.TrimSpace(u), "<") {
			users = append(users, strings.TrimSpace(u))
		}
	}
	if len(users) > 0 {
		users = users[:len(users)-1]
	}
	return "HISTORY: " + strings.Join(users, " | ")
}

// SplitEven cuts text into n chunks of (about) equal length.
func SplitEven(text string, n int) []string {
	r := []rune(text)
	size := (len(r) + n - 1) / n
	if size == 0 {
		return []string{text}
	}
	var out []string
	for i := 0; i < len(r); i += size {
		out = append(out, string(r[i:min(i+size, len(r))]))
	}
	return out
}
