// Command relay-bench measures the runner gateway's event relay — runner
// WebSocket (PRP event batches) → runnergw → an executor's Attach stream,
// acknowledged as it goes — next to a raw grpc-go server stream of messages
// of the same size, measured in the same run, and prints the ratio with the
// PERFORMANCE.md target.
//
// The gateway (and the raw gRPC server) run in this process; the load — a
// synthetic runner that sends pre-encoded, journaled-style event batches
// like runnerd, and the Attach / raw client — runs in a child process, so
// the CPU this process uses is the gateway's (or the raw server's) alone.
package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

// scenario is one measured figure: n messages of size bytes.
type scenario struct {
	Name   string `json:"name"`
	Size   int    `json:"size"`
	Events int    `json:"events"`
	// relay only
	Ticket  string `json:"ticket,omitempty"`
	Runner  string `json:"runner,omitempty"`
	Session string `json:"session,omitempty"`
	// Grant is the signed gateway grant of the Attach (SPEC S1).
	Grant string `json:"grant,omitempty"`
}

// job is what the parent hands the load child (one JSON line on stdin).
type job struct {
	Mode      string   `json:"mode"` // relay | raw
	WSURL     string   `json:"wsUrl"`
	GRPCAddr  string   `json:"grpcAddr"`
	Scenarios scenario `json:"scenario"`
}

// outcome is the child's answer.
type outcome struct {
	Events  int     `json:"events"`
	Seconds float64 `json:"seconds"`
	CPUNs   int64   `json:"cpuNs"` // the load process's CPU during the run
	Err     string  `json:"err,omitempty"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "load" {
		os.Exit(load())
	}
	os.Exit(parent())
}

// relayRow is one figure's best round: events/s through the gateway,
// over a raw stream of Event messages and of opaque bytes, and the
// serving process's CPU per message.
type relayRow struct {
	name              string
	tether, raw       float64
	rawBytes          float64
	tetherCPU, rawCPU float64 // µs per message in this process
	target            float64
}

// relayRig is the in-process gateway the bench relays through, its runner
// WebSocket listener and its gRPC listener.
type relayRig struct {
	auth   *prp.Authority
	signer *grant.Signer
	wl, gl net.Listener
}

func parent() int {
	fs := flag.NewFlagSet("relay-bench", flag.ExitOnError)
	n256 := fs.Int("events-256", 400000, "events per 256 B run")
	n4k := fs.Int("events-4k", 60000, "events per 4 KiB run")
	rounds := fs.Int("rounds", 3, "rounds per figure (the best of each is reported)")
	target := fs.Float64("target", 0.55, "target ratio at 256 B (PERFORMANCE.md)")
	target4k := fs.Float64("target-4k", 0.55, "target ratio at 4 KiB (SPEC P, issue #16)")
	cpuProfile := fs.String("cpuprofile", "", "write the gateway process's CPU profile here")
	fs.BoolVar(&verbose, "v", false, "print every round, with the load process's CPU")
	_ = fs.Parse(os.Args[1:])
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	rig, stop, err := startRelayRig()
	if err != nil {
		return fail(err)
	}
	defer stop()
	fmt.Printf("relay-bench: runner WebSocket (PRP batches as runnerd sends them) → runnergw → Attach stream (acked, events decoded);\n"+
		"  best of %d rounds each, %d CPUs\n", *rounds, numCPU())
	rows, err := rig.figures(*rounds, *n256, *n4k, *target, *target4k)
	if err != nil {
		return fail(err)
	}
	printRelayRows(rows)
	return 0
}

// startRelayRig starts an in-process gateway (no runnerd: the load
// process plays the runner) with its runner and gRPC listeners; stop
// stops them.
func startRelayRig() (_ *relayRig, stop func(), _ error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	fail := func(err error) (*relayRig, func(), error) { stop(); return nil, func() {}, err }
	dir, err := os.MkdirTemp("", "relay-bench-")
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() { os.RemoveAll(dir) })
	auth := prp.NewAuthority([]byte("relay-bench-key"), nil)
	grantPub, grantKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		return fail(err)
	}
	grants, err := grant.NewVerifier("relay-bench", []ed25519.PublicKey{grantPub}, nil)
	if err != nil {
		return fail(err)
	}
	signer := grant.NewSigner(grantKey, time.Hour, nil)
	gw := gateway.New(gateway.Config{
		StateRoot: filepath.Join(dir, "state"), RunnerdPath: "/nonexistent", Authority: auth, Grants: grants,
		Logger: slog.New(slog.DiscardHandler), PingInterval: time.Hour, IdleTimeout: time.Hour,
	})
	stops = append(stops, gw.Close)
	wl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	hs := &http.Server{Handler: gw, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(wl) }()
	stops = append(stops, func() { _ = hs.Close() })
	gs := grpc.NewServer()
	gatewayv1.RegisterRunnerGatewayServer(gs, relayServer{g: gw})
	gs.RegisterService(&rawDesc, rawServer{})
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	go func() { _ = gs.Serve(gl) }()
	stops = append(stops, gs.Stop)
	return &relayRig{auth: auth, signer: signer, wl: wl, gl: gl}, stop, nil
}

// figures measures each message size, rounds times, keeping each side's
// best round.
func (g *relayRig) figures(rounds, n256, n4k int, target, target4k float64) ([]relayRow, error) {
	var rows []relayRow
	seq := 0
	for _, sz := range []struct {
		name   string
		size   int
		events int
		target float64
	}{{"event relay 256 B", 256, n256, target}, {"event relay 4 KiB", 4096, n4k, target4k}} {
		r := relayRow{name: sz.name, target: sz.target}
		for round := 0; round < rounds; round++ {
			seq++
			sess := fmt.Sprintf("bench-%d", seq)
			inst := fmt.Sprintf("runner-bench-%d", seq)
			ticket, err := g.auth.MintTicket(inst, scope.Of(benchInput(sess)), time.Hour)
			if err != nil {
				return nil, err
			}
			sc := scenario{Name: sz.name, Size: sz.size, Events: sz.events, Ticket: ticket.Encode(), Runner: inst, Session: sess}
			claims := grant.ClaimsForOpen(benchOpen(sc))
			claims.Audience = "relay-bench"
			if sc.Grant, err = g.signer.Sign(claims); err != nil {
				return nil, err
			}
			rate, cpu, err := measure(job{Mode: "relay", WSURL: "ws://" + g.wl.Addr().String() + gateway.ConnectPath, GRPCAddr: g.gl.Addr().String(), Scenarios: sc})
			if err != nil {
				return nil, fmt.Errorf("%s relay: %w", sz.name, err)
			}
			if rate > r.tether {
				r.tether, r.tetherCPU = rate, cpu
			}
			rate, cpu, err = measure(job{Mode: "raw", GRPCAddr: g.gl.Addr().String(), Scenarios: sc})
			if err != nil {
				return nil, fmt.Errorf("%s raw: %w", sz.name, err)
			}
			if rate > r.raw {
				r.raw, r.rawCPU = rate, cpu
			}
			rate, _, err = measure(job{Mode: "raw-bytes", GRPCAddr: g.gl.Addr().String(), Scenarios: sc})
			if err != nil {
				return nil, fmt.Errorf("%s raw bytes: %w", sz.name, err)
			}
			r.rawBytes = max(r.rawBytes, rate)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// printRelayRows prints the figures' table and their BENCH lines.
func printRelayRows(rows []relayRow) {
	fmt.Println()
	fmt.Printf("%-18s  %12s  %12s  %7s  %7s  %3s  %14s  %9s  %14s  %14s\n", "figure (events/s)", "tether", "raw", "ratio", "target", "met",
		"raw Event msgs", "ratio", "gateway CPU/ev", "raw srv CPU/msg")
	for _, r := range rows {
		ratio := r.tether / r.rawBytes
		tgt, met := "—", "—"
		if r.target > 0 {
			tgt = fmt.Sprintf("≥ %.0f %%", 100*r.target)
			met = "✗"
			if ratio >= r.target {
				met = "✓"
			}
		}
		fmt.Printf("%-18s  %12s  %12s  %5.1f %%  %7s  %3s  %14s  %7.1f %%  %11.2f µs  %12.2f µs\n", r.name,
			thousands(r.tether), thousands(r.rawBytes), 100*ratio, tgt, met, thousands(r.raw), 100*r.tether/r.raw, r.tetherCPU, r.rawCPU)
	}
	fmt.Println()
	fmt.Println("raw: grpc-go server stream of opaque messages of the same encoded size; raw Event msgs: the same Event messages,")
	fmt.Println("one per gRPC message, decoded by the client (what an executor would receive without the relay); CPU is per message")
	fmt.Println("in the serving process (the gateway, or the raw server), the load runs in a separate process.")
	for _, r := range rows {
		fmt.Printf("BENCH %s tether=%.1f raw=%.1f ratio=%.3f target=%.2f met=%t unit=events/s raw_event_stream=%.1f ratio_vs_event_stream=%.3f gateway_cpu_us_per_event=%.2f raw_server_cpu_us_per_msg=%.2f\n",
			strings.ReplaceAll(r.name, " ", "_"), r.tether, r.rawBytes, r.tether/r.rawBytes, r.target, r.target == 0 || r.tether/r.rawBytes >= r.target,
			r.raw, r.tether/r.raw, r.tetherCPU, r.rawCPU)
	}
}

func numCPU() int {
	n := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = strings.Count(string(b), "processor\t:")
	}
	return n
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "relay-bench:", err)
	return 1
}

// measure runs one job in a load child; it returns messages/s and this
// process's CPU per message while the child ran.
func measure(j job) (float64, float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.Command(self, "load")
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	b, _ := json.Marshal(j)
	_, _ = in.Write(append(b, '\n'))
	br := bufio.NewReader(out)
	// "go" once the load is set up; then the outcome.
	line, err := br.ReadString('\n')
	if err != nil || line != "go\n" {
		_ = cmd.Wait()
		return 0, 0, fmt.Errorf("load child did not start: %q %v", line, err)
	}
	cpu0 := cpuTime()
	_, _ = in.Write([]byte("go\n"))
	line, err = br.ReadString('\n')
	cpu1 := cpuTime()
	_ = in.Close()
	werr := cmd.Wait()
	if err != nil {
		return 0, 0, fmt.Errorf("load child: %v (%v)", err, werr)
	}
	var o outcome
	if err := json.Unmarshal([]byte(line), &o); err != nil {
		return 0, 0, err
	}
	if o.Err != "" {
		return 0, 0, errors.New(o.Err)
	}
	if verbose {
		fmt.Fprintf(os.Stderr, "  %s %s: %d msgs in %.2fs; this process %.2f µs/msg, load process %.2f µs/msg\n", j.Mode, j.Scenarios.Name,
			o.Events, o.Seconds, float64(cpu1-cpu0)/1e3/float64(o.Events), float64(o.CPUNs)/1e3/float64(o.Events))
	}
	return float64(o.Events) / o.Seconds, float64(cpu1-cpu0) / 1e3 / float64(o.Events), nil
}

var verbose bool

// cpuTime is this process's user+system CPU time in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func benchInput(session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "bench", AgentId: "agent"},
		Task:     &prpv1.Task{Prompt: "bench"},
		Session:  &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

// benchOpen is the Open of a relay scenario's Attach.
func benchOpen(sc scenario) *gatewayv1.Open {
	return &gatewayv1.Open{RunId: "run-" + sc.Runner, Fence: &gatewayv1.FencingToken{Owner: "bench", Attempt: 1}, Input: benchInput(sc.Session)}
}

// relayServer adapts the gateway to its gRPC service.
type relayServer struct {
	gatewayv1.UnimplementedRunnerGatewayServer
	g *gateway.Gateway
}

func (s relayServer) Attach(stream gatewayv1.RunnerGateway_AttachServer) error {
	return s.g.Attach(stream)
}

// ---- raw baseline: a server stream of BytesValue messages ----

type rawServer struct{}

type rawHandler interface{}

var rawDesc = grpc.ServiceDesc{
	ServiceName: "bench.Raw",
	HandlerType: (*rawHandler)(nil),
	Streams: []grpc.StreamDesc{
		// Events: the same Event messages the relay carries, one per gRPC
		// message (what an executor would receive without a relay).
		{StreamName: "Events", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
			n, size, err := rawRequest(stream)
			if err != nil {
				return err
			}
			ev := eventFor(size, "runner-raw", 1)
			for i := uint64(1); i <= n; i++ {
				ev.SourceSeq = i
				if err := stream.SendMsg(ev); err != nil {
					return err
				}
			}
			return nil
		}},
		// Bytes: opaque messages of the same encoded size.
		{StreamName: "Bytes", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
			n, size, err := rawRequest(stream)
			if err != nil {
				return err
			}
			msg := &wrapperspb.BytesValue{Value: make([]byte, rawSize(size))}
			for i := uint64(0); i < n; i++ {
				if err := stream.SendMsg(msg); err != nil {
					return err
				}
			}
			return nil
		}},
	},
}

func rawRequest(stream grpc.ServerStream) (n uint64, size int, err error) {
	req := &wrapperspb.UInt64Value{}
	if err := stream.RecvMsg(req); err != nil {
		return 0, 0, err
	}
	return req.GetValue() >> 32, int(req.GetValue() & 0xffffffff), nil
}

// ---- the load child ----

func load() int {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		return 1
	}
	var j job
	if err := json.Unmarshal([]byte(line), &j); err != nil {
		return 1
	}
	if p := os.Getenv("RELAY_BENCH_LOAD_PROFILE"); p != "" {
		// One profile per load kind and size (for looking into the load).
		if f, err := os.Create(fmt.Sprintf("%s.%s.%d", p, j.Mode, j.Scenarios.Size)); err == nil {
			defer f.Close()
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	var o outcome
	switch j.Mode {
	case "relay":
		o = timed(func() outcome { return loadRelay(j, in) })
	case "raw", "raw-bytes":
		o = timed(func() outcome { return loadRaw(j, in) })
	}
	b, _ := json.Marshal(o)
	fmt.Println(string(b))
	return 0
}

// timed runs f and reports the load process's CPU from the parent's "go"
// (set-up, such as pre-encoding the frames, excluded).
func timed(f func() outcome) outcome {
	o := f()
	o.CPUNs = cpuTime() - loadStart
	return o
}

var loadStart int64

func errOutcome(err error) outcome { return outcome{Err: err.Error()} }

func ready(in *bufio.Reader) error {
	fmt.Println("go")
	l, err := in.ReadString('\n')
	if err != nil || l != "go\n" {
		return fmt.Errorf("no go from the parent: %v", err)
	}
	loadStart = cpuTime()
	return nil
}

func loadRaw(j job, in *bufio.Reader) outcome {
	conn, err := grpc.NewClient(j.GRPCAddr, grpc.WithTransportCredentials(insecureCreds()))
	if err != nil {
		return errOutcome(err)
	}
	defer conn.Close()
	if err := ready(in); err != nil {
		return errOutcome(err)
	}
	ctx := context.Background()
	start := time.Now()
	desc, method := &rawDesc.Streams[0], "/bench.Raw/Events"
	var m proto.Message = &prpv1.Event{}
	if j.Mode == "raw-bytes" {
		desc, method, m = &rawDesc.Streams[1], "/bench.Raw/Bytes", &wrapperspb.BytesValue{}
	}
	s, err := conn.NewStream(ctx, desc, method)
	if err != nil {
		return errOutcome(err)
	}
	sc := j.Scenarios
	if err := s.SendMsg(wrapperspb.UInt64(uint64(sc.Events)<<32 | uint64(sc.Size))); err != nil {
		return errOutcome(err)
	}
	_ = s.CloseSend()
	got := 0
	for {
		if err := s.RecvMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return errOutcome(err)
		}
		got++
	}
	return outcome{Events: got, Seconds: time.Since(start).Seconds()}
}

// rawSize is the BytesValue length whose encoding has the size of one
// relayed event of nominal size sz (see eventFor).
func rawSize(sz int) int {
	target := proto.Size(eventFor(sz, "runner-bench-0", 1))
	n := target
	for proto.Size(&wrapperspb.BytesValue{Value: make([]byte, n)}) > target {
		n--
	}
	return n
}

// eventFor is a delta event whose protobuf encoding is about sz bytes.
func eventFor(sz int, runner string, seq uint64) *prpv1.Event {
	ev := &prpv1.Event{
		Schema: "tether.prp.event.v1", SourceInstanceId: runner, SourceEventId: fmt.Sprintf("event_%s_%016d", runner, seq),
		SourceSeq: seq, SourceKind: "runner", RunId: "run-bench", NormalizedSessionId: "bench", TurnId: "turn-1", ItemId: "item-1",
		EventType: "item.delta", SchemaVersion: 1, Priority: 2, EmittedAt: timestamppb.New(time.Unix(1_800_000_000, 0)),
	}
	pl, _ := structpb.NewStruct(map[string]any{"kind": "agentMessage", "delta": ""})
	ev.Payload = pl
	pad := max(sz-proto.Size(ev), 1)
	pl.Fields["delta"] = structpb.NewStringValue(strings.Repeat("x", pad))
	return ev
}

func loadRelay(j job, in *bufio.Reader) outcome {
	sc := j.Scenarios
	cred, err := prp.ParseCredential(sc.Ticket)
	if err != nil {
		return errOutcome(err)
	}
	input := benchInput(sc.Session)
	ctx := context.Background()
	r, err := dialRunner(ctx, j.WSURL, cred, sc, input)
	if err != nil {
		return errOutcome(fmt.Errorf("runner: %w", err))
	}
	defer r.CloseNow()
	conn, err := grpc.NewClient(j.GRPCAddr, grpc.WithTransportCredentials(insecureCreds()))
	if err != nil {
		return errOutcome(err)
	}
	defer conn.Close()
	// Pre-encode the batches exactly as runnerd sends journaled envelopes.
	frames := encodeBatches(sc)
	if err := ready(in); err != nil {
		return errOutcome(err)
	}
	start := time.Now()
	stream, err := gatewayv1.NewRunnerGatewayClient(conn).Attach(metadata.AppendToOutgoingContext(ctx, grant.Header, sc.Grant))
	if err != nil {
		return errOutcome(err)
	}
	if err := stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: benchOpen(sc)}}); err != nil {
		return errOutcome(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetOpened() == nil {
		return errOutcome(fmt.Errorf("attach: %v %v", first, err))
	}
	// The runner sends once the gateway asked it to replay (= attached).
	sendErr := make(chan error, 1)
	go func() {
		for {
			f, err := r.Read(ctx)
			if err != nil {
				sendErr <- err
				return
			}
			if f.GetReplay() != nil {
				break
			}
		}
		go func() { // drain acks
			for {
				if _, err := r.Read(ctx); err != nil {
					return
				}
			}
		}()
		for _, f := range frames {
			if err := r.WriteRaw(ctx, f); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	got := 0
	for got < sc.Events {
		m, err := stream.Recv()
		if err != nil {
			return errOutcome(fmt.Errorf("after %d events: %w", got, err))
		}
		evs := m.GetEvents().GetEvents()
		if len(evs) == 0 {
			continue
		}
		got += len(evs)
		if err := stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
			SourceInstanceId: sc.Runner, PersistedThroughSeq: evs[len(evs)-1].GetSourceSeq()}}}); err != nil {
			return errOutcome(err)
		}
	}
	el := time.Since(start).Seconds()
	if err := <-sendErr; err != nil {
		return errOutcome(err)
	}
	_ = stream.CloseSend()
	return outcome{Events: got, Seconds: el}
}

func encodeBatches(sc scenario) [][]byte {
	const perFrame, maxBytes = 256, 256 << 10 // runnerd's batching (services/runnerd/internal/runner/events.go)
	var frames [][]byte
	var buf []byte
	n := 0
	flush := func() {
		if n > 0 {
			frames = append(frames, append(buf, "]}}"...))
		}
		buf, n = nil, 0
	}
	for seq := 1; seq <= sc.Events; seq++ {
		env, err := prp.Marshal(&prpv1.Frame{Kind: &prpv1.Frame_Events{Events: &prpv1.EventBatch{Events: []*prpv1.Event{eventFor(sc.Size, sc.Runner, uint64(seq))}}}})
		if err != nil {
			panic(err)
		}
		// {"events":{"events":[<env>]}} → <env>
		env = env[len(`{"events":{"events":[`) : len(env)-len(`]}}`)]
		if n == perFrame || (n > 0 && len(buf)+len(env)+4 > maxBytes) {
			flush()
		}
		if n == 0 {
			buf = append(buf, `{"events":{"events":[`...)
		} else {
			buf = append(buf, ',')
		}
		buf = append(buf, env...)
		n++
	}
	flush()
	return frames
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// dialRunner connects a synthetic runner (the PRP handshake of runnerd).
func dialRunner(ctx context.Context, url string, cred prp.Credential, sc scenario, input *prpv1.ExecutionInput) (*prp.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		return nil, err
	}
	c := prp.NewConn(ws)
	hello := &prpv1.Hello{
		Identity: &prpv1.RunnerIdentity{RunnerInstanceId: sc.Runner, EnvironmentLeaseId: "bench", NormalizedSessionId: sc.Session,
			SessionScope: scope.Of(input), RunnerVersion: "bench"},
		Resume:       &prpv1.ResumeCursor{NextSourceSeq: 1},
		Lifecycle:    "ready",
		SessionInput: input,
	}
	if _, _, err := prp.ClientHandshake(dctx, c, cred, hello); err != nil {
		_ = ws.CloseNow()
		return nil, err
	}
	return c, nil
}
