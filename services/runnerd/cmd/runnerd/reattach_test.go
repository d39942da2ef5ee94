package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// runnerdProc is one runnerd process of the test.
type runnerdProc struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func startRunnerd(t *testing.T, bin string, g *binGateway, url string, args ...string) *runnerdProc {
	t.Helper()
	ticket, err := g.auth.MintTicket("runner-re", reScope, time.Minute)
	require.NoError(t, err)
	cmd := exec.Command(bin, append([]string{"--connect-url", url, "--runner-id", "runner-re", "--environment-lease-id", "env-1",
		"--session-id", "sess-re", "--session-scope", reScope, "--idle-timeout", "1m", "--reconnect-grace", "20s", "--log-format", "text"}, args...)...)
	cmd.Env = append(os.Environ(), prp.EnvBootstrapTicket+"="+ticket.Encode())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &runnerdProc{cmd: cmd, logs: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		if t.Failed() || os.Getenv("TETHER_TEST_LOGS") != "" {
			t.Logf("runnerd %d logs:\n%s", cmd.Process.Pid, p.logs.String())
		}
	})
	return p
}

const reScope = "feedfacefeedfacefeedfacefeedfacefeedfacefeedfacefeedfacefeedface"

// TestR1_ProviderSurvivesARunnerdKillAndTheRestartedRunnerdReattaches kills
// runnerd with SIGKILL mid-turn and starts a new one on the same state dir:
// the provider (under its host) keeps running, the new runnerd re-attaches,
// and the turn completes with every provider line's events exactly once.
func TestR1_ProviderSurvivesARunnerdKillAndTheRestartedRunnerdReattaches(t *testing.T) {
	t.Parallel()
	runnerd, fake, g, url, stateDir, ws, callLog := newBinRunnerd(t, "fake-codex-app-server")
	args := []string{"--state-dir", stateDir, "--workspace", ws, "--provider-command", fake,
		"--provider-arg", "app-server", "--provider-arg", "--delta-delay-ms=25", "--provider-arg", "--state-file-in-codex-home",
		"--provider-arg", "--durable-turn-ids", "--provider-arg", "--record-process-start", "--provider-arg", "--call-log=" + callLog}

	first := startRunnerd(t, runnerd, g, url, args...)
	c := newFrameCollector(t, g)
	events, collect, count, send := c.events, c.collect, c.count, c.send
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)
	send("c1", "run.attach", map[string]any{"input": inputMap(t, &prpv1.Provider{Kind: "codex", Model: "gpt-fake"})})
	prompt := "tell me a long story with many many words so that the reply streams for quite a while before the turn ends"
	send("c2", "turn.start", map[string]any{"text": prompt})
	collect(func() bool { return count("item.delta") >= 5 }, "deltas")

	info, err := provhost.ReadInfo(filepath.Join(stateDir, "runner"))
	require.NoError(t, err)
	require.True(t, info.ProviderAlive())
	require.Equal(t, info.ProviderPID, info.ProviderPGID, "the provider leads its own process group")
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	<-first.exited
	time.Sleep(100 * time.Millisecond)
	require.True(t, info.ProviderAlive(), "the provider survived the runnerd kill")

	g.mu.Lock()
	g.conn = nil
	g.mu.Unlock()
	second := startRunnerd(t, runnerd, g, url, args...)
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)
	collect(func() bool { return count("run.terminal") >= 1 }, "run.terminal")

	// Contiguous seqs, one terminal, the turn completed.
	var term *prpv1.Event
	var deltas strings.Builder
	for s := uint64(1); s <= uint64(len(events)); s++ {
		ev, ok := events[s]
		require.True(t, ok, "seq %d present (of %d)", s, len(events))
		switch ev.GetEventType() {
		case "run.terminal":
			term = ev
		case "item.delta":
			deltas.WriteString(ev.GetPayload().AsMap()["delta"].(string))
		}
	}
	require.NotNil(t, term)
	pl := term.GetPayload().AsMap()
	require.Equal(t, "completed", pl["turnTerminalState"], "%v", pl)
	final, _ := pl["finalMessage"].(string)
	require.Contains(t, final, "ECHO: "+prompt)
	require.Equal(t, final, deltas.String(), "every delta arrived exactly once, in order")
	assert.Equal(t, 1, count("turn.started"), "the turn was announced once")
	assert.Equal(t, 1, count("run.terminal"))
	assert.Equal(t, 1, count("runner.reconciled"))
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(calls), "turn/start\n"), "the provider turn started exactly once")
	assert.Equal(t, 1, strings.Count(string(calls), "process-start\n"), "one provider process")

	var st *runnerstate.State
	require.Eventually(t, func() bool {
		st, err = (&statedir.Store{Dir: filepath.Join(stateDir, "runner")}).Load()
		return err == nil && st.ActiveTurn == nil
	}, 5*time.Second, 10*time.Millisecond, "the turn ended in the durable state")
	require.NotNil(t, st.ProviderProcess)
	assert.Equal(t, info.ProviderPID, st.ProviderProcess.PID, "the same provider process serves the restarted runnerd")

	// Stopping the runnerd stops the provider and its host.
	require.NoError(t, syscall.Kill(second.cmd.Process.Pid, syscall.SIGTERM))
	select {
	case <-second.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("runnerd did not exit on SIGTERM")
	}
	require.Eventually(t, func() bool { return !info.ProviderAlive() && !info.HostAlive() }, 10*time.Second, 20*time.Millisecond)
}

// frameCollector gathers what a binGateway receives from runnerd: events by
// source seq (a replay must carry the same event) and command results.
type frameCollector struct {
	t       *testing.T
	g       *binGateway
	events  map[uint64]*prpv1.Event
	results []*prpv1.CommandResult
	seq     uint64
}

func newFrameCollector(t *testing.T, g *binGateway) *frameCollector {
	c := &frameCollector{t: t, g: g, events: map[uint64]*prpv1.Event{}}
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)
	return c
}

// collect takes frames until until() holds (bounded).
func (c *frameCollector) collect(until func() bool, what string) {
	c.t.Helper()
	deadline := time.After(30 * time.Second)
	for !until() {
		select {
		case f := <-c.g.frames:
			for _, ev := range f.GetEvents().GetEvents() {
				if prev, ok := c.events[ev.GetSourceSeq()]; ok {
					require.Equal(c.t, prev.GetSourceEventId(), ev.GetSourceEventId(), "a replay carries the same event")
					continue
				}
				c.events[ev.GetSourceSeq()] = ev
			}
			if r := f.GetCommandResult(); r != nil {
				c.results = append(c.results, r)
			}
		case <-deadline:
			c.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (c *frameCollector) count(typ string) int {
	n := 0
	for _, ev := range c.events {
		if ev.GetEventType() == typ {
			n++
		}
	}
	return n
}

// send sends a command of run run-re, attempt 1.
func (c *frameCollector) send(id, typ string, payload map[string]any) {
	c.seq++
	s, err := structpb.NewStruct(payload)
	require.NoError(c.t, err)
	c.g.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: &prpv1.Command{
		CommandId: id, ControllerSeq: c.seq, Type: typ, RunId: "run-re", Attempt: 1, Payload: s}}})
}

// inputMap is the run.attach input of session sess-re for provider p.
func inputMap(t *testing.T, p *prpv1.Provider) map[string]any {
	in := &prpv1.ExecutionInput{
		Provider: p,
		Binding:  &prpv1.Binding{CompanyId: "co", AgentId: "ag"},
		Session:  &prpv1.Session{NormalizedSessionId: "sess-re", Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
	b, err := protojson.Marshal(in)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// newBinRunnerd builds runnerd and the named fake provider, serves a
// binGateway on loopback (stopped at cleanup) and lays out a state dir, a
// workspace and the fake's call log.
func newBinRunnerd(t *testing.T, fakeName string) (runnerd, fake string, g *binGateway, url, stateDir, ws, callLog string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	runnerd = goBuild(t, "github.com/tether-run/tether/services/runnerd/cmd/runnerd", "runnerd")
	fake = goBuild(t, "github.com/tether-run/tether/services/runnerd/tools/"+fakeName, fakeName)
	g = &binGateway{t: t, auth: prp.NewAuthority([]byte("bin-key"), nil), frames: make(chan *prpv1.Frame, 4096)}
	srv := httptest.NewServer(http.HandlerFunc(g.handle))
	t.Cleanup(func() { srv.Close(); g.wg.Wait() })
	url = "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/runners/connect"
	base := t.TempDir()
	stateDir, ws = filepath.Join(base, "state"), filepath.Join(base, "ws")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	return runnerd, fake, g, url, stateDir, ws, filepath.Join(base, "calls.log")
}
