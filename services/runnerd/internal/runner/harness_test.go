package runner

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tRunner = "runner-t1"
	tScope  = "5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0fe5c0f"
	tSess   = "session-t1"
)

var gatewayKey = []byte("test-gateway-key")

// rxEvent is one event as received by the fake gateway, with its raw bytes.
type rxEvent struct {
	raw  []byte
	ev   *prpv1.Event
	conn int
}

// fakeGateway is an in-process runner gateway on 127.0.0.1.
type fakeGateway struct {
	t    *testing.T
	auth *prp.Authority
	srv  *httptest.Server

	mu       sync.Mutex
	conns    int
	cur      *websocket.Conn
	curConn  *prp.Conn
	hellos   []*prpv1.Hello
	events   []rxEvent
	results  []*prpv1.CommandResult
	pongs    []*prpv1.Pong
	pongsAt  []int // len(events) when each pong came
	goodbyes []*prpv1.Goodbye
	refuse   bool   // refuse new connections (HTTP 503)
	acked    uint64 // acked seq reported in Welcome
	onEvent  func(*prpv1.Event)
	onResult func(*prpv1.CommandResult)
	changed  chan struct{}
	wg       sync.WaitGroup
}

func newFakeGateway(t *testing.T) *fakeGateway {
	g := &fakeGateway{t: t, auth: prp.NewAuthority(gatewayKey, nil), changed: make(chan struct{}, 1)}
	g.srv = httptest.NewServer(http.HandlerFunc(g.handle))
	t.Cleanup(g.close)
	return g
}

// newFakeGatewayTLS serves the runner endpoint over TLS (dial_wss).
func newFakeGatewayTLS(t *testing.T, cfg *tls.Config) *fakeGateway {
	g := &fakeGateway{t: t, auth: prp.NewAuthority(gatewayKey, nil), changed: make(chan struct{}, 1)}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(g.handle))
	g.srv.TLS = cfg
	g.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	g.srv.StartTLS()
	t.Cleanup(g.close)
	return g
}

func (g *fakeGateway) url() string {
	return "ws" + strings.TrimPrefix(g.srv.URL, "http") + "/v1/runners/connect"
}

// dialIn connects to a listening runner (listen_ws) and serves it like an
// inbound connection.
func (g *fakeGateway) dialIn(url string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: &http.Client{
		Transport: &http.Transport{TLSClientConfig: cfg}}})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return err
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.serve(context.Background(), ws)
	}()
	return nil
}

func (g *fakeGateway) ticket() string {
	c, err := g.auth.MintTicket(tRunner, tScope, time.Minute)
	require.NoError(g.t, err)
	return c.Encode()
}

func (g *fakeGateway) notify() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

func (g *fakeGateway) handle(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	refuse := g.refuse
	g.mu.Unlock()
	if refuse {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	g.wg.Add(1)
	defer g.wg.Done()
	g.serve(r.Context(), ws)
}

// serve runs the gateway side of one runner connection.
func (g *fakeGateway) serve(ctx context.Context, ws *websocket.Conn) {
	c := prp.NewConn(ws)
	acc, err := g.auth.Accept(ctx, c)
	if err != nil {
		_ = c.Close(websocket.StatusPolicyViolation, prp.CodeOf(err))
		return
	}
	g.mu.Lock()
	g.conns++
	id := g.conns
	g.hellos = append(g.hellos, acc.Hello)
	acked := g.acked
	g.mu.Unlock()
	if err := g.auth.Welcome(ctx, c, acc, acked); err != nil {
		return
	}
	g.mu.Lock()
	g.cur, g.curConn = ws, c
	g.mu.Unlock()
	g.notify()
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil || typ != websocket.MessageText {
			break
		}
		f, err := prp.Unmarshal(b)
		if err != nil {
			g.t.Errorf("gateway: undecodable frame: %v", err)
			continue
		}
		g.mu.Lock()
		switch k := f.Kind.(type) {
		case *prpv1.Frame_Events:
			var raw struct {
				Events struct {
					Events []json.RawMessage `json:"events"`
				} `json:"events"`
			}
			if err := json.Unmarshal(b, &raw); err != nil {
				g.t.Errorf("gateway: %v", err)
			}
			for i, ev := range k.Events.GetEvents() {
				g.events = append(g.events, rxEvent{raw: raw.Events.Events[i], ev: ev, conn: id})
				if g.onEvent != nil {
					g.onEvent(ev)
				}
			}
		case *prpv1.Frame_CommandResult:
			g.results = append(g.results, k.CommandResult)
			if g.onResult != nil {
				g.onResult(k.CommandResult)
			}
		case *prpv1.Frame_Pong:
			g.pongs = append(g.pongs, k.Pong)
			g.pongsAt = append(g.pongsAt, len(g.events))
		case *prpv1.Frame_Goodbye:
			g.goodbyes = append(g.goodbyes, k.Goodbye)
		}
		g.mu.Unlock()
		g.notify()
	}
	g.mu.Lock()
	if g.cur == ws {
		g.cur, g.curConn = nil, nil
	}
	g.mu.Unlock()
	_ = ws.CloseNow()
}

func (g *fakeGateway) close() {
	g.dropConn()
	g.srv.Close()
	g.wg.Wait()
}

// dropConn closes the current runner connection abruptly.
func (g *fakeGateway) dropConn() {
	g.mu.Lock()
	ws := g.cur
	g.cur, g.curConn = nil, nil
	g.mu.Unlock()
	if ws != nil {
		_ = ws.CloseNow()
	}
}

func (g *fakeGateway) setRefuse(v bool) {
	g.mu.Lock()
	g.refuse = v
	g.mu.Unlock()
}

// waitFor polls cond (under the gateway lock) until it holds.
func (g *fakeGateway) waitFor(what string, cond func() bool) {
	g.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		g.mu.Lock()
		ok := cond()
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-g.changed:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			g.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (g *fakeGateway) waitConns(n int) {
	g.t.Helper()
	g.waitFor(fmt.Sprintf("%d connections", n), func() bool { return g.conns >= n && g.cur != nil })
}

func (g *fakeGateway) send(f *prpv1.Frame) {
	g.t.Helper()
	g.waitFor("a live connection", func() bool { return g.curConn != nil })
	g.mu.Lock()
	c := g.curConn
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(g.t, c.Write(ctx, f))
}

// waitEvent returns the first event of type typ (after skipping n-1 of them).
func (g *fakeGateway) waitEvent(typ string, n int) *prpv1.Event {
	g.t.Helper()
	var got *prpv1.Event
	g.waitFor("event "+typ, func() bool {
		k := 0
		for _, e := range g.events {
			if e.ev.GetEventType() == typ {
				k++
				if k == n {
					got = e.ev
					return true
				}
			}
		}
		return false
	})
	return got
}

func (g *fakeGateway) eventsOf(typ string) []*prpv1.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*prpv1.Event
	for _, e := range g.events {
		if e.ev.GetEventType() == typ {
			out = append(out, e.ev)
		}
	}
	return out
}

// distinct returns the received events by seq (first copy of each).
func (g *fakeGateway) distinct() map[uint64]rxEvent {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := map[uint64]rxEvent{}
	for _, e := range g.events {
		if _, ok := m[e.ev.GetSourceSeq()]; !ok {
			m[e.ev.GetSourceSeq()] = e
		}
	}
	return m
}

func (g *fakeGateway) maxSeq() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var m uint64
	for _, e := range g.events {
		m = max(m, e.ev.GetSourceSeq())
	}
	return m
}

// command sends a command and waits for its result.
func (g *fakeGateway) command(c *prpv1.Command) *prpv1.CommandResult {
	g.t.Helper()
	g.mu.Lock()
	n := len(g.results)
	g.mu.Unlock()
	g.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: c}})
	var res *prpv1.CommandResult
	g.waitFor("result of "+c.GetCommandId(), func() bool {
		for _, r := range g.results[n:] {
			if r.GetCommandId() == c.GetCommandId() {
				res = r
				return true
			}
		}
		return false
	})
	return res
}

func (g *fakeGateway) ack(n uint64) {
	g.send(&prpv1.Frame{Kind: &prpv1.Frame_Ack{Ack: &prpv1.Ack{AckedSourceSeq: n}}})
}

// ping round-trips a Ping and returns the Pong.
func (g *fakeGateway) ping(nonce uint64) *prpv1.Pong {
	g.t.Helper()
	g.send(&prpv1.Frame{Kind: &prpv1.Frame_Ping{Ping: &prpv1.Ping{Nonce: nonce}}})
	var p *prpv1.Pong
	g.waitFor("pong", func() bool {
		for _, x := range g.pongs {
			if x.GetNonce() == nonce {
				p = x
				return true
			}
		}
		return false
	})
	return p
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return s
}

func testInput(t *testing.T) map[string]any {
	in := &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex", Model: "gpt-test", ApprovalPolicy: "never", Sandbox: "workspace-write"},
		Binding:  &prpv1.Binding{CompanyId: "co", AgentId: "ag"},
		Task:     &prpv1.Task{Prompt: "do it"},
		Session:  &prpv1.Session{NormalizedSessionId: tSess, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
	b, err := protojson.Marshal(in)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// cmdSeq builds commands with contiguous controller seqs.
type cmdSeq struct {
	t       *testing.T
	seq     uint64
	runID   string
	attempt uint64
}

func (s *cmdSeq) next(id, typ string, payload map[string]any) *prpv1.Command {
	s.seq++
	return &prpv1.Command{
		Schema: "tether.prp.command.v1", CommandId: id, ControllerSeq: s.seq, Type: typ,
		RunId: s.runID, Attempt: s.attempt, Payload: mustStruct(s.t, payload),
	}
}

func (s *cmdSeq) attach(id string) *prpv1.Command {
	return s.next(id, CmdRunAttach, map[string]any{"input": testInput(s.t)})
}

// runnerProc is a Runner running in a goroutine.
type runnerProc struct {
	cancel context.CancelFunc
	done   chan struct{}
	code   int
	err    error
}

func (p *runnerProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("runner did not exit within %s", d)
		return -1
	}
}

func (p *runnerProc) stop(t *testing.T) int {
	p.cancel()
	return p.wait(t, 15*time.Second)
}

type testEnv struct {
	t        *testing.T
	gw       *fakeGateway
	stateDir string
	ws       string
	prov     *fakeStarter
}

func newTestEnv(t *testing.T) *testEnv {
	base := t.TempDir()
	ws := filepath.Join(base, "workspace")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	return &testEnv{t: t, gw: newFakeGateway(t), stateDir: filepath.Join(base, "state"), ws: ws, prov: newFakeStarter()}
}

func (e *testEnv) config(mod func(*Config)) Config {
	cred, err := prp.ParseCredential(e.gw.ticket())
	require.NoError(e.t, err)
	cfg := Config{
		ConnectURL: e.gw.url(), StateDir: e.stateDir, RunnerID: tRunner, EnvironmentLeaseID: "envlease-1",
		SessionID: tSess, SessionScope: tScope, Workspace: e.ws, ProviderCommand: "/bin/false",
		IdleTimeout: time.Hour, ReconnectGrace: time.Minute, Ticket: cred, StartProvider: e.prov.start,
		Logger: slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelDebug})), PathEnv: "/usr/bin:/bin",
		BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Tick: 10 * time.Millisecond,
		DrainTimeout: 300 * time.Millisecond, ProviderCloseGrace: 200 * time.Millisecond, RequestTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

func (e *testEnv) start(mod func(*Config)) *runnerProc {
	cfg := e.config(mod)
	ctx, cancel := context.WithCancel(context.Background())
	p := &runnerProc{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.code, p.err = Run(ctx, cfg)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// state is the runner state a relaunched runnerd would find: the state
// document with the intent log's intents and outcome records it does not
// cover applied over it. The log is read first: a live runnerd empties it
// only once a saved document covers it.
func (e *testEnv) state() *runnerstate.State {
	e.t.Helper()
	ins, err := statedir.ReadIntentLog(filepath.Join(e.stateDir, "runner"))
	require.NoError(e.t, err)
	st := e.document()
	statedir.ReplayIntents(st, ins)
	return st
}

// document is the state document as saved.
func (e *testEnv) document() *runnerstate.State {
	e.t.Helper()
	st, err := (&statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}).Load()
	require.NoError(e.t, err)
	require.NotNil(e.t, st)
	return st
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ---- fake provider ----

type fakeStarter struct {
	mu       sync.Mutex
	configs  []ProviderConfig
	sessions []*fakeProvider
	failNext error
	started  chan *fakeProvider
	// history is what a provider's thread records of each turn (status
	// inProgress|completed|failed|interrupted), read by ReconcileTurn; a
	// turn not in it is missing.
	history map[string]string
	// lastTurn is the thread's newest turn, read by LastTurn.
	lastTurn string
	// freshThread, when set, is the thread OpenThread opens whatever it is
	// asked to resume: the provider could not resume it.
	freshThread string
	// beforeStartTurn, when set, runs as StartTurn is called.
	beforeStartTurn func()
	// startTurnErr, when set, is what StartTurn answers (the turn does not
	// start): the transport to the provider broke during the start.
	startTurnErr error
}

func newFakeStarter() *fakeStarter { return &fakeStarter{started: make(chan *fakeProvider, 16)} }

func (s *fakeStarter) start(ctx context.Context, cfg ProviderConfig, emit func(ProviderEvent)) (Provider, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.configs = append(s.configs, cfg)
	if err := s.failNext; err != nil {
		s.failNext = nil
		return nil, err
	}
	p := &fakeProvider{
		starter: s,
		emit:    emit, pid: 4242 + len(s.sessions), done: make(chan TurnResult, 16), exited: make(chan struct{}),
		steers: []string{}, interrupts: []string{},
	}
	s.sessions = append(s.sessions, p)
	s.started <- p
	emit(ProviderEvent{Type: "session.starting", Priority: P1, Payload: map[string]any{"pid": float64(p.pid)}})
	return p, nil
}

func (s *fakeStarter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func (s *fakeStarter) last() *fakeProvider {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sessions) == 0 {
		return nil
	}
	return s.sessions[len(s.sessions)-1]
}

type fakeProvider struct {
	starter *fakeStarter
	emit    func(ProviderEvent)
	pid     int
	done    chan TurnResult
	exited  chan struct{}

	mu         sync.Mutex
	threadOpen []string
	turns      int
	steers     []string
	interrupts []string
	exitErr    error
	closed     bool
}

func (p *fakeProvider) Process() ProcessInfo {
	return ProcessInfo{PID: p.pid, PGID: p.pid, StartTicks: 99, StartedAt: time.Now()}
}

func (p *fakeProvider) OpenThread(ctx context.Context, threadID string) (string, bool, error) {
	p.mu.Lock()
	p.threadOpen = append(p.threadOpen, threadID)
	p.mu.Unlock()
	id := threadID
	if id == "" {
		id = "thread-1"
	}
	p.starter.mu.Lock()
	if p.starter.freshThread != "" {
		id, threadID = p.starter.freshThread, ""
	}
	p.starter.mu.Unlock()
	p.emit(ProviderEvent{Type: "session.started", Priority: P0, Payload: map[string]any{"providerThreadId": id, "resumed": threadID != ""}})
	return id, threadID != "", nil
}

func (p *fakeProvider) StartTurn(ctx context.Context, text string) (string, error) {
	p.starter.mu.Lock()
	hook, startErr := p.starter.beforeStartTurn, p.starter.startTurnErr
	p.starter.mu.Unlock()
	if hook != nil {
		hook()
	}
	if startErr != nil {
		return "", startErr
	}
	p.mu.Lock()
	if err := p.exitErr; err != nil {
		// An exited provider refuses the turn with its exit error.
		p.mu.Unlock()
		return "", err
	}
	p.turns++
	id := fmt.Sprintf("turn-%d", p.turns)
	p.mu.Unlock()
	p.emit(ProviderEvent{Type: "turn.started", TurnID: id, Priority: P1, Payload: map[string]any{"text": text}})
	return id, nil
}

func (p *fakeProvider) TurnDone() <-chan TurnResult { return p.done }

func (p *fakeProvider) Steer(ctx context.Context, turnID, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.steers = append(p.steers, turnID+":"+text)
	return nil
}

func (p *fakeProvider) Interrupt(ctx context.Context, turnID string) error {
	p.mu.Lock()
	p.interrupts = append(p.interrupts, turnID)
	p.mu.Unlock()
	p.finish(TurnResult{TurnID: turnID, Status: "interrupted"})
	return nil
}

func (p *fakeProvider) Exited() <-chan struct{} { return p.exited }

func (p *fakeProvider) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

func (p *fakeProvider) Close(ctx context.Context, grace time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		if p.exitErr == nil {
			p.exitErr = &ProviderError{Code: "provider_closed", Message: "closed"}
			close(p.exited)
		}
	}
	return nil
}

// finish emits the turn's closing events and reports the result.
func (p *fakeProvider) finish(res TurnResult) {
	p.emit(ProviderEvent{Type: "item.delta", TurnID: res.TurnID, ItemID: "item-1", Priority: P2, Payload: map[string]any{"delta": "hel"}})
	p.emit(ProviderEvent{Type: "item.completed", TurnID: res.TurnID, ItemID: "item-1", Priority: P1, Payload: map[string]any{"text": res.FinalMessage}})
	p.emit(ProviderEvent{Type: "turn." + res.Status, TurnID: res.TurnID, Priority: P0, Payload: map[string]any{}})
	p.done <- res
}

// ReconcileTurn settles turnID from the starter's history (TurnReconciler).
func (p *fakeProvider) ReconcileTurn(ctx context.Context, turnID string) (string, string, error) {
	p.starter.mu.Lock()
	status, ok := p.starter.history[turnID]
	p.starter.mu.Unlock()
	switch {
	case !ok:
		return ReconcileMissing, "", &ProviderError{Code: "provider_turn_missing", Message: "thread has no turn " + turnID}
	case status == "inProgress":
		return ReconcileRetained, status, nil
	}
	p.emit(ProviderEvent{Type: "turn." + status, TurnID: turnID, Priority: P0, Payload: map[string]any{"reconciled": true}})
	p.done <- TurnResult{TurnID: turnID, Status: status, FinalMessage: "recorded " + status}
	return ReconcileTerminalized, status, nil
}

// LastTurn is the starter's lastTurn (TurnReconciler).
func (p *fakeProvider) LastTurn(ctx context.Context) (string, error) {
	p.starter.mu.Lock()
	defer p.starter.mu.Unlock()
	return p.starter.lastTurn, nil
}

// crash makes the provider exit unexpectedly.
func (p *fakeProvider) crash(code string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exitErr = &ProviderError{Code: code, Message: "exit status 9"}
	close(p.exited)
}
