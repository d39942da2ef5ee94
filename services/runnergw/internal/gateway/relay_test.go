package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/prptest"
	"github.com/tether-run/tether/pkg/testing/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	binDir = testbin.MustDir(
		"github.com/tether-run/tether/services/runnerd/cmd/runnerd",
		"github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server",
		"github.com/tether-run/tether/services/runnerd/tools/fake-opencode",
		"github.com/tether-run/tether/services/runnerd/tools/fake-acp-agent")
	testbin.Parallel(4)
	testbin.Main(m)
}

// server adapts the Gateway to the gRPC service (the api package imports
// this one).
type server struct {
	gatewayv1.UnimplementedRunnerGatewayServer
	g *Gateway
}

func (s server) Attach(stream gatewayv1.RunnerGateway_AttachServer) error { return s.g.Attach(stream) }

// relay is an in-process gateway (plain and TLS runner listeners, ingress
// to TLS runner listeners) in front of real runnerd and fake codex
// processes.
type relay struct {
	t   *testing.T
	g   *Gateway
	cfg Config
	// client signs a grant for every call, as executors do; raw does not.
	client  gatewayv1.RunnerGatewayClient
	raw     gatewayv1.RunnerGatewayClient
	callLog string
	plain   string // host:port of the plain runner listener
	// prior are the prior-run records attach sends (the executor's).
	prior []*gatewayv1.PriorRun
}

func newRelay(t *testing.T, mod func(*Config)) *relay {
	t.Helper()
	if binDir == "" {
		t.Skip("runner binaries not built")
	}
	dir := t.TempDir()
	ca := prptest.NewCA(t)
	gwLeaf, runnerLeaf := ca.Issue(t, "gateway"), ca.Issue(t, "runner")
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tlsRaw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tlsLis := tls.NewListener(tlsRaw, gwLeaf.ServerConfig())
	build, err := ReadBuildMetadata(context.Background(), filepath.Join(binDir, "runnerd"), prp.ModeDialWSLoopback)
	require.NoError(t, err)
	rl := &relay{t: t, callLog: filepath.Join(dir, "calls.log"), plain: plain.Addr().String()}
	rl.cfg = Config{
		StateRoot: filepath.Join(dir, "state"), ConnectURL: "ws://" + plain.Addr().String() + ConnectPath,
		PublicURL: "wss://" + tlsLis.Addr().String() + ConnectPath, CABundle: ca.CAFile(t),
		Ingress: ParseIngressPolicy("acme"), IngressCert: runnerLeaf.CertFile, IngressKey: runnerLeaf.KeyFile,
		IngressTLS:  &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool()},
		RunnerdPath: filepath.Join(binDir, "runnerd"), CodexCommand: filepath.Join(binDir, "fake-codex-app-server"),
		CodexArgs:   []string{"--delta-delay-ms", "5", "--state-file-in-codex-home", "--durable-turn-ids", "--record-process-start", "--call-log", rl.callLog},
		IdleTimeout: time.Minute, ReconnectGrace: 30 * time.Second, ConnectTimeout: 20 * time.Second,
		Build: build, Authority: prp.NewAuthority([]byte("relay-test-key"), nil), Grants: testGrants.verifier,
		Logger: slog.New(slog.NewTextHandler(newTestWriter(t), nil)),
	}
	if mod != nil {
		mod(&rl.cfg)
	}
	require.NoError(t, os.MkdirAll(rl.cfg.StateRoot, 0o700))
	rl.g = New(rl.cfg)
	var servers []*http.Server
	for _, l := range []net.Listener{plain, tlsLis} {
		hs := &http.Server{Handler: rl.g, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
		servers = append(servers, hs)
		go func() { _ = hs.Serve(l) }()
	}
	gs := grpc.NewServer()
	gatewayv1.RegisterRunnerGatewayServer(gs, server{g: rl.g})
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(gl) }()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	rl.raw = gatewayv1.NewRunnerGatewayClient(conn)
	rl.client = grant.Client(rl.raw, testGrants.signer, testGatewayID)
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		for _, hs := range servers {
			_ = hs.Close()
		}
		rl.g.Close()
		if t.Failed() {
			dumpRunnerLogs(t, rl.cfg.StateRoot)
		}
	})
	return rl
}

// testWriter logs the gateway's lines to its test until the test's
// cleanup ends: a goroutine of the gateway's HTTP server that logs after
// that (a runner's connection ending late) would race with the test's end
// (the race detector then failed every test running at the time).
type testWriter struct {
	t     *testing.T
	mu    sync.Mutex
	ended bool
}

func newTestWriter(t *testing.T) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() { // registered first: runs after the rig's cleanup
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func dumpRunnerLogs(t *testing.T, root string) {
	_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".log") {
			b, _ := os.ReadFile(p)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("==== %s\n%s", p, b)
		}
		return nil
	})
}

func testInput(session, company, prompt string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex", Model: "gpt-fake"},
		Binding:  &prpv1.Binding{CompanyId: company, AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: prompt},
		Session:  &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

func command(t *testing.T, runID string, attempt uint64, typ string, payload map[string]any) *prpv1.Command {
	p, err := structpb.NewStruct(payload)
	require.NoError(t, err)
	return &prpv1.Command{Schema: "tether.prp.command.v1", CommandId: runID + "/" + typ, Type: typ, RunId: runID, Attempt: attempt, Payload: p}
}

// attach opens an Attach stream and returns it with the Opened answer (or
// the refusal).
func (rl *relay) attach(ctx context.Context, runID string, target *gatewayv1.RunnerTarget, in *prpv1.ExecutionInput) (gatewayv1.RunnerGateway_AttachClient, *gatewayv1.Opened, error) {
	s, err := rl.client.Attach(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
		RunId: runID, Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Target: target, Input: in, PriorRuns: rl.prior,
		Turn: grant.TurnDigest(runID+"/turn.start", in.GetTask().GetPrompt()),
	}}}); err != nil {
		return nil, nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, nil, err
	}
	return s, m.GetOpened(), nil
}

// turn drives one run like the executor: run.attach, turn.start, then
// events (acked as they come) until run.terminal. during is called after
// each event batch.
func (rl *relay) turn(ctx context.Context, runID string, target *gatewayv1.RunnerTarget, in *prpv1.ExecutionInput, during func([]*prpv1.Event)) (*gatewayv1.Opened, []*prpv1.Event) {
	t := rl.t
	t.Helper()
	var events []*prpv1.Event
	seen := map[uint64]bool{}
	var opened *gatewayv1.Opened
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "too many re-attaches")
		s, op, err := rl.attach(ctx, runID, target, in)
		require.NoError(t, err)
		require.NotNil(t, op)
		if opened == nil {
			opened = op
		}
		raw, err := protojson.Marshal(in)
		require.NoError(t, err)
		var inMap map[string]any
		require.NoError(t, json.Unmarshal(raw, &inMap))
		for _, c := range []*prpv1.Command{
			command(t, runID, 1, "run.attach", map[string]any{"input": inMap}),
			command(t, runID, 1, "turn.start", map[string]any{"text": in.GetTask().GetPrompt()}),
		} {
			require.NoError(t, s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: c}}))
		}
		for {
			m, err := s.Recv()
			if err != nil {
				t.Logf("attach ended (%v); re-attaching", err)
				break
			}
			if r := m.GetCommandResult(); r != nil {
				require.Contains(t, []string{"completed", "pending"}, r.GetStatus(), "%s: %s %s", r.GetCommandType(), r.GetCode(), r.GetMessage())
			}
			evs := m.GetEvents().GetEvents()
			if len(evs) == 0 {
				continue
			}
			for _, ev := range evs {
				if seen[ev.GetSourceSeq()] {
					continue // a replay after a re-attach
				}
				seen[ev.GetSourceSeq()] = true
				events = append(events, ev)
			}
			if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
				SourceInstanceId: evs[0].GetSourceInstanceId(), PersistedThroughSeq: contiguous(events)}}}); err != nil {
				// The stream ended (a dropped runner connection ends the
				// attach): the send may see it before the next receive.
				t.Logf("attach ended on sending an ack (%v); re-attaching", err)
				break
			}
			if during != nil {
				during(evs)
			}
			// The turn ends at this run's run.terminal. A re-attach may first
			// be sent what the runner still holds unacknowledged of an earlier
			// run (its terminal included, in one batch with this run's first
			// events): that is not this turn's end.
			for i, ev := range events {
				if ev.GetEventType() == "run.terminal" && ev.GetRunId() == runID {
					_ = s.CloseSend()
					return opened, events[:i+1]
				}
			}
		}
	}
}

func contiguous(evs []*prpv1.Event) uint64 {
	seen := map[uint64]bool{}
	for _, e := range evs {
		seen[e.GetSourceSeq()] = true
	}
	var n uint64
	for seen[n+1] {
		n++
	}
	return n
}

func requireSucceeded(t *testing.T, evs []*prpv1.Event) {
	t.Helper()
	require.NotEmpty(t, evs)
	term := evs[len(evs)-1]
	require.Equal(t, "run.terminal", term.GetEventType())
	require.Equal(t, "succeeded", term.GetPayload().AsMap()["runTerminalState"], "%v", term.GetPayload().AsMap())
	for i, ev := range evs {
		require.EqualValues(t, i+1, ev.GetSourceSeq(), "contiguous source seqs")
	}
}

func countCalls(t *testing.T, path, what string) int {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	require.NoError(t, err)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == what {
			n++
		}
	}
	return n
}

func (rl *relay) runner(sc string) *gatewayv1.Runner {
	for _, r := range rl.g.Runners() {
		if r.GetSessionScope() == sc {
			return r
		}
	}
	return nil
}

func TestR6_DialWSLoopbackRunsATurnEndToEnd(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("loopback", "acme", "hello over loopback")
	opened, evs := rl.turn(ctx, "run-loopback", &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK}, in, nil)
	requireSucceeded(t, evs)
	require.Contains(t, opened.GetBuild().GetPrpTransportModes(), prp.ModeDialWSLoopback)
	require.Equal(t, gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK, rl.runner(scope.Of(in)).GetMode())
}

func TestR6_DialWSSOverTLSRunsATurnEndToEnd(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("wss", "acme", "hello over tls")
	_, evs := rl.turn(ctx, "run-wss", &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS}, in, nil)
	requireSucceeded(t, evs)
	r := rl.runner(scope.Of(in))
	require.Equal(t, gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS, r.GetMode(), "the runner came in over the TLS listener")
	b, err := os.ReadFile(filepath.Join(rl.cfg.StateRoot, scope.Of(in), "runnerd.log"))
	require.NoError(t, err)
	require.Contains(t, string(b), "wss://", "runnerd dialed the public TLS URL")
}

func TestR6_DialWSSIsRefusedWithoutATLSListener(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, func(c *Config) { c.PublicURL = "" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := rl.attach(ctx, "run-nowss", &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS}, testInput("nowss", "acme", "x"))
	require.EqualValues(t, "runner_direct_wss_failed", failure.CodeOf(err))
}

func TestR6_ListenWSOverTLSRunsATurnAndSurvivesADroppedConnection(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, func(c *Config) { c.CodexArgs = append(c.CodexArgs, "--delta-delay-ms", "40") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("ingress", "acme", "a long answer over sandbox ingress with many words so that it streams for a while")
	sc := scope.Of(in)
	dropped := false
	_, evs := rl.turn(ctx, "run-ingress", &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, RunnerIngressAuthorized: true}, in,
		func(batch []*prpv1.Event) {
			if dropped {
				return
			}
			for _, ev := range batch {
				if ev.GetEventType() == "item.delta" {
					dropped = true
					rl.g.mu.Lock()
					r := rl.g.runners[sc]
					rl.g.mu.Unlock()
					r.mu.Lock()
					c := r.conn
					r.mu.Unlock()
					require.NotNil(t, c)
					_ = c.CloseNow() // the gateway dials the runner again
					return
				}
			}
		})
	require.True(t, dropped, "the connection was dropped mid-turn")
	requireSucceeded(t, evs)
	require.Equal(t, gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, rl.runner(sc).GetMode())
	require.Equal(t, 1, countCalls(t, rl.callLog, "turn/start"), "the provider turn started once")
	rec := readLaunchRecord(filepath.Join(rl.cfg.StateRoot, sc))
	require.Equal(t, prp.ModeListenWS, rec.Mode)
	require.True(t, strings.HasPrefix(rec.ListenURL, "wss://127.0.0.1:"), rec.ListenURL)
}

func TestR6_ListenWSWithoutAuthorisationFailsBeforeAnythingIsLaunched(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, c := range map[string]struct {
		company    string
		authorised bool
	}{
		"run not authorised":             {"acme", false},
		"company not admitted by policy": {"globex", true},
	} {
		t.Run(name, func(t *testing.T) {
			in := testInput("noingress-"+c.company, c.company, "x")
			_, _, err := rl.attach(ctx, "run-noingress-"+c.company, &gatewayv1.RunnerTarget{
				Mode: gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, RunnerIngressAuthorized: c.authorised}, in)
			require.EqualValues(t, "runner_ingress_unavailable", failure.CodeOf(err))
			_, statErr := os.Stat(filepath.Join(rl.cfg.StateRoot, scope.Of(in)))
			require.True(t, errors.Is(statErr, os.ErrNotExist), "nothing was launched")
		})
	}
}

func TestR6_ModeMissingFromTheRunnerBuildIsRefusedWithoutFallThrough(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, func(c *Config) {
		b := proto.Clone(c.Build).(*gatewayv1.BuildMetadata)
		b.PrpTransportModes = []string{prp.ModeDialWSLoopback, prp.ModeDialWSS}
		c.Build = b
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := rl.attach(ctx, "run-nomode", &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, RunnerIngressAuthorized: true},
		testInput("nomode", "acme", "x"))
	require.EqualValues(t, "runner_remote_transport_capability_missing:listen_ws", failure.CodeOf(err))
}

// fakeRunner is an in-process PRP runner speaking to the relay's plain
// listener with a ticket of the gateway's authority.
type fakeRunner struct {
	c    *prp.Conn
	ws   *websocket.Conn
	done chan error
	mu   sync.Mutex
	seen []*prpv1.Frame
}

func (rl *relay) connectFake(t *testing.T, inst, sc string, gen uint64, cred *prp.Credential, features ...string) (*fakeRunner, error) {
	t.Helper()
	if cred.Kind == "" {
		c, err := rl.g.cfg.Authority.MintTicket(inst, sc, time.Minute)
		require.NoError(t, err)
		*cred = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+rl.plain+ConnectPath, nil)
	require.NoError(t, err)
	c := prp.NewConn(ws)
	hello := &prpv1.Hello{
		Identity: &prpv1.RunnerIdentity{RunnerInstanceId: inst, SessionScope: sc, NormalizedSessionId: "s", EnvironmentLeaseId: "e"},
		Resume:   &prpv1.ResumeCursor{NextSourceSeq: 1, ConnectionGeneration: gen},
		Features: features,
	}
	_, next, err := prp.ClientHandshake(ctx, c, *cred, hello)
	if err != nil {
		_ = ws.CloseNow()
		return nil, err
	}
	*cred = next
	f := &fakeRunner{c: c, ws: ws, done: make(chan error, 1)}
	go func() {
		for {
			fr, err := c.Read(context.Background())
			if err != nil {
				f.done <- err
				return
			}
			f.mu.Lock()
			f.seen = append(f.seen, fr)
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = ws.CloseNow() })
	return f, nil
}

// connectedFake connects a fake runner inst for in's scope and waits until
// the gateway registered it (just after its welcome).
func (rl *relay) connectedFake(t *testing.T, inst string, in *prpv1.ExecutionInput, features ...string) *fakeRunner {
	t.Helper()
	sc := scope.Of(in)
	var cred prp.Credential
	f, err := rl.connectFake(t, inst, sc, 0, &cred, features...)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rl.runner(sc).GetConnected() }, 30*time.Second, time.Millisecond)
	return f
}

// replays returns the Replay frames the fake runner was sent so far.
func (f *fakeRunner) replays() []*prpv1.Replay {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*prpv1.Replay
	for _, fr := range f.seen {
		if r := fr.GetReplay(); r != nil {
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeRunner) closedWithin(d time.Duration) bool {
	select {
	case <-f.done:
		return true
	case <-time.After(d):
		return false
	}
}

func TestGatewayClosesARunnerConnectionThatMissesItsPongs(t *testing.T) {
	t.Parallel()
	// The pong timeout leaves the answering runner below (its pongs sent
	// from a goroutine polling every 10 ms) room on a loaded machine: at
	// 300 ms one of them missed it under 4 parallel tests at load 20.
	rl := newRelay(t, func(c *Config) { c.PingInterval, c.PingTimeout = 50*time.Millisecond, 2*time.Second })
	var cred prp.Credential
	f, err := rl.connectFake(t, "runner-mute", strings.Repeat("ab", 32), 0, &cred)
	require.NoError(t, err)
	require.True(t, f.closedWithin(30*time.Second), "a runner that never answers pings is disconnected")
	f.mu.Lock()
	pings := 0
	for _, fr := range f.seen {
		if fr.GetPing() != nil {
			pings++
		}
	}
	f.mu.Unlock()
	require.Positive(t, pings, "it was pinged first")

	// A runner that answers stays connected.
	alive, err := rl.connectFake(t, "runner-mute", strings.Repeat("ab", 32), 1, &cred)
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		answered := 0
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			alive.mu.Lock()
			var pend []*prpv1.Ping
			for _, fr := range alive.seen[answered:] {
				if p := fr.GetPing(); p != nil {
					pend = append(pend, p)
				}
			}
			answered = len(alive.seen)
			alive.mu.Unlock()
			for _, p := range pend {
				_ = alive.c.Write(context.Background(), &prpv1.Frame{Kind: &prpv1.Frame_Pong{Pong: &prpv1.Pong{Nonce: p.GetNonce(), Lifecycle: "ready"}}})
			}
		}
	}()
	require.False(t, alive.closedWithin(time.Second), "a runner answering pings stays connected")
}

func TestGatewayKeepsOneConnectionPerRunnerNewerGenerationTakesOver(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	sc := strings.Repeat("cd", 32)
	var cred prp.Credential
	first, err := rl.connectFake(t, "runner-gen", sc, 5, &cred)
	require.NoError(t, err)
	second, err := rl.connectFake(t, "runner-gen", sc, 6, &cred)
	require.NoError(t, err)
	require.True(t, first.closedWithin(30*time.Second), "the older connection is replaced")
	require.False(t, second.closedWithin(200*time.Millisecond))
	// An older generation arriving late is refused; the live one stays.
	_, err = rl.connectFake(t, "runner-gen", sc, 4, &cred)
	require.Error(t, err)
	require.Equal(t, "runner_connection_stale", prp.CodeOf(err))
	require.False(t, second.closedWithin(200*time.Millisecond), "the live connection survives a stale one")
	r := rl.runner(sc)
	require.True(t, r.GetConnected())
	// Another runner instance on the same scope is refused outright.
	var other prp.Credential
	_, err = rl.connectFake(t, "runner-impostor", sc, 9, &other)
	require.Error(t, err)
}

func TestGatewayBuffersAreBoundedAndBackpressureReachesTheRunner(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	in := testInput("bp", "acme", "x")
	f := rl.connectedFake(t, "runner-bp", in)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// An attached executor that never reads its stream.
	_, opened, err := rl.attach(ctx, "run-bp", nil, in)
	require.NoError(t, err)
	require.True(t, opened.GetReused())
	payload := strings.Repeat("x", 60<<10)
	var sent int
	blocked := false
	for seq := uint64(1); seq <= 4000; seq++ {
		frame := []byte(fmt.Sprintf(`{"events":{"events":[{"schema":"tether.prp.event.v1","sourceInstanceId":"runner-bp","sourceSeq":"%d","eventType":"item.delta","payload":{"delta":"%s"}}]}}`, seq, payload))
		wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := f.c.WriteRaw(wctx, frame)
		wcancel()
		if err != nil {
			blocked = true
			break
		}
		sent++
	}
	require.True(t, blocked, "writes block once the gateway's bounded buffers are full")
	t.Logf("the runner could write %d frames (%d MiB) before backpressure held it", sent, sent*60>>10)
	require.Less(t, sent, 4000)
}

// seqBatch is an event batch frame in runnerd's shape of item.delta events
// with the given source seqs.
func seqBatch(inst string, seqs ...uint64) []byte {
	evs := make([]string, len(seqs))
	for i, seq := range seqs {
		evs[i] = fmt.Sprintf(`{"schema":"tether.prp.event.v1","sourceInstanceId":%q,"sourceSeq":"%d","eventType":"item.delta","payload":{"delta":"d%d"}}`, inst, seq, seq)
	}
	return []byte(`{"events":{"events":[` + strings.Join(evs, ",") + `]}}`)
}

// recvSeqs receives n events from an Attach stream and returns their
// source seqs in the order they came.
func recvSeqs(t *testing.T, s gatewayv1.RunnerGateway_AttachClient, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for len(seqs) < n {
		m, err := s.Recv()
		require.NoError(t, err)
		for _, ev := range m.GetEvents().GetEvents() {
			seqs = append(seqs, ev.GetSourceSeq())
		}
	}
	return seqs
}

// SPEC G4: the gateway relays in order. A re-attach asks the runner to
// replay what is unacknowledged; a runner sends the events it produces
// while the Replay is on its way before it reads it, and those reached the
// new attachment ahead of the replayed ones (seq 9 → 23 in an E7 run).
// The gateway now relays to a re-attachment only from the runner's marker,
// answered immediately before the replay.
func TestG4_AReattachGetsTheEventsInSourceOrderWhenTheRunnerSentLiveOnesBeforeTheReplay(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	in := testInput("order", "acme", "x")
	const inst = "runner-order"
	f := rl.connectedFake(t, inst, in, prp.FeatureReplayMarker)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first, opened, err := rl.attach(ctx, "run-order", nil, in)
	require.NoError(t, err)
	require.True(t, opened.GetReused())
	require.Eventually(t, func() bool { return len(f.replays()) == 1 }, 30*time.Second, time.Millisecond)
	m := f.replays()[0].GetMarker()
	require.NotZero(t, m, "a runner with the feature is sent a marker")
	require.NoError(t, f.c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Pong{Pong: &prpv1.Pong{Nonce: m, Lifecycle: "ready"}}}))
	require.NoError(t, f.c.WriteRaw(ctx, seqBatch(inst, 1, 2, 3)))
	require.Equal(t, []uint64{1, 2, 3}, recvSeqs(t, first, 3))

	// The executor re-attaches (its stream broke, or a successor took
	// over) with nothing acknowledged.
	second, _, err := rl.attach(ctx, "run-order", nil, in)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(f.replays()) == 2 }, 30*time.Second, time.Millisecond)
	replay := f.replays()[1]
	require.Zero(t, replay.GetAfterSourceSeq())
	require.NotEqual(t, m, replay.GetMarker())
	// The runner produced event 4 before it read the Replay, then answers
	// the marker and replays everything after 0, then goes on live.
	require.NoError(t, f.c.WriteRaw(ctx, seqBatch(inst, 4)))
	require.NoError(t, f.c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Pong{Pong: &prpv1.Pong{Nonce: replay.GetMarker(), Lifecycle: "ready"}}}))
	require.NoError(t, f.c.WriteRaw(ctx, seqBatch(inst, 1, 2, 3, 4)))
	require.NoError(t, f.c.WriteRaw(ctx, seqBatch(inst, 5)))
	require.Equal(t, []uint64{1, 2, 3, 4, 5}, recvSeqs(t, second, 5), "the re-attachment gets the events in source order")
}

// A runner without the feature (an older runnerd a gateway adopted) is
// sent no marker and relayed to as before.
func TestG4_ARunnerWithoutTheReplayMarkerIsRelayedToWithoutOne(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	in := testInput("order-old", "acme", "x")
	const inst = "runner-order-old"
	f := rl.connectedFake(t, inst, in)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, err := rl.attach(ctx, "run-order-old", nil, in)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(f.replays()) == 1 }, 30*time.Second, time.Millisecond)
	require.Zero(t, f.replays()[0].GetMarker())
	require.NoError(t, f.c.WriteRaw(ctx, seqBatch(inst, 1, 2)))
	require.Equal(t, []uint64{1, 2}, recvSeqs(t, s, 2))
}
