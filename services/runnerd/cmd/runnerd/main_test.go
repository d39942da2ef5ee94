package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
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

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

func TestG2_BuildMetadata(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"--build-metadata"}, "", false, &out, &errb))
	var m map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	assert.Equal(t, "tether/runnerd-build-metadata/v1", m["schema"])
	assert.Equal(t, "runnerd", m["binaryName"])
	assert.Equal(t, packageName, m["packageName"])
	assert.Equal(t, version, m["packageVersion"])
	assert.Equal(t, 2.0, m["binaryContractVersion"])
	assert.Equal(t, []any{"dial_ws_loopback", "dial_wss", "listen_ws"}, m["prpTransportModes"])
}

func TestRunRejectsMissingTicketAndNonLoopback(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	args := []string{"--connect-url", "ws://127.0.0.1:1/v1/runners/connect", "--state-dir", dir, "--runner-id", "r",
		"--environment-lease-id", "e", "--session-id", "s", "--session-scope", "abc", "--workspace", dir, "--provider-command", "/bin/true"}
	assert.Equal(t, 1, run(args, "", false, &out, &errb))
	assert.Contains(t, errb.String(), "no bootstrap ticket")

	a := prp.NewAuthority([]byte("k"), nil)
	ticket, err := a.MintTicket("r", "abc", time.Minute)
	require.NoError(t, err)
	errb.Reset()
	bad := append([]string(nil), args...)
	bad[1] = "ws://192.0.2.1:7411/v1/runners/connect"
	assert.Equal(t, 1, run(bad, ticket.Encode(), true, &out, &errb))
	assert.Contains(t, errb.String(), "non-loopback")
	assert.NotContains(t, errb.String(), ticket.Encode(), "the ticket is never logged")
}

// binGateway is a minimal in-process gateway for the binary test.
type binGateway struct {
	t      *testing.T
	auth   *prp.Authority
	mu     sync.Mutex
	conn   *prp.Conn
	hello  *prpv1.Hello
	frames chan *prpv1.Frame
	wg     sync.WaitGroup
}

func (g *binGateway) handle(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	g.wg.Add(1)
	defer g.wg.Done()
	c := prp.NewConn(ws)
	defer c.Close(websocket.StatusNormalClosure, "")
	acc, err := g.auth.Accept(r.Context(), c)
	if err != nil {
		g.t.Errorf("accept: %v", err)
		return
	}
	if err := g.auth.Welcome(r.Context(), c, acc, 0); err != nil {
		return
	}
	g.mu.Lock()
	g.conn, g.hello = c, acc.Hello
	g.mu.Unlock()
	for {
		f, err := c.Read(r.Context())
		if err != nil {
			return
		}
		g.frames <- f
	}
}

func (g *binGateway) send(f *prpv1.Frame) {
	g.mu.Lock()
	c := g.conn
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(g.t, c.Write(ctx, f))
}

// goBuild returns the binary of the command pkg (built once per test run
// unless make test prebuilt it); name is its file name.
func goBuild(t *testing.T, pkg, name string) string {
	t.Helper()
	p, err := testbin.Path(pkg)
	require.NoError(t, err)
	require.Equal(t, name, filepath.Base(p))
	return p
}

func TestG4_BinaryRunsATurnAgainstAFakeGateway(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	runnerd := goBuild(t, "github.com/tether-run/tether/services/runnerd/cmd/runnerd", "runnerd")
	fake := goBuild(t, "github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server", "fake-codex-app-server")

	g := &binGateway{t: t, auth: prp.NewAuthority([]byte("bin-key"), nil), frames: make(chan *prpv1.Frame, 1024)}
	srv := httptest.NewServer(http.HandlerFunc(g.handle))
	defer func() { srv.Close(); g.wg.Wait() }()

	base := t.TempDir()
	stateDir, ws := filepath.Join(base, "state"), filepath.Join(base, "ws")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	const scope = "0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd"
	ticket, err := g.auth.MintTicket("runner-bin", scope, time.Minute)
	require.NoError(t, err)

	cmd := exec.Command(runnerd,
		"--connect-url", "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/runners/connect",
		"--state-dir", stateDir, "--runner-id", "runner-bin", "--environment-lease-id", "env-1",
		"--session-id", "sess-bin", "--session-scope", scope, "--workspace", ws,
		// The deprecated aliases of --provider-command/--provider-arg,
		// on purpose: a gateway of the previous release still passes them.
		"--codex-command", fake, "--codex-arg", "app-server", "--codex-arg", "--delta-delay-ms=0",
		"--idle-timeout", "1m", "--reconnect-grace", "10s", "--log-format", "text")
	cmd.Env = append(os.Environ(), prp.EnvBootstrapTicket+"="+ticket.Encode())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
		if t.Failed() {
			t.Logf("runnerd logs:\n%s", logs.String())
		}
	}()

	var events []*prpv1.Event
	next := func(what string, match func(*prpv1.Frame) bool) *prpv1.Frame {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case f := <-g.frames:
				events = append(events, f.GetEvents().GetEvents()...)
				if match(f) {
					return f
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitEvent := func(typ string) *prpv1.Event {
		t.Helper()
		for _, ev := range events {
			if ev.GetEventType() == typ {
				return ev
			}
		}
		var got *prpv1.Event
		next(typ, func(f *prpv1.Frame) bool {
			for _, ev := range f.GetEvents().GetEvents() {
				if ev.GetEventType() == typ {
					got = ev
					return true
				}
			}
			return false
		})
		return got
	}
	seq := uint64(0)
	command := func(id, typ string, payload map[string]any) *prpv1.CommandResult {
		t.Helper()
		seq++
		s, err := structpb.NewStruct(payload)
		require.NoError(t, err)
		g.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: &prpv1.Command{
			CommandId: id, ControllerSeq: seq, Type: typ, RunId: "run-bin", Attempt: 1, Payload: s}}})
		return next("result of "+id, func(f *prpv1.Frame) bool {
			return f.GetCommandResult().GetCommandId() == id
		}).GetCommandResult()
	}

	// Wait for the handshake.
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)
	g.mu.Lock()
	assert.Equal(t, int32(cmd.Process.Pid), g.hello.GetRunnerProcess().GetPid())
	assert.Equal(t, "sess-bin", g.hello.GetIdentity().GetNormalizedSessionId())
	g.mu.Unlock()

	in := &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex", Model: "gpt-fake"},
		Binding:  &prpv1.Binding{CompanyId: "co", AgentId: "ag"},
		Task:     &prpv1.Task{Prompt: "hi"},
		Session:  &prpv1.Session{NormalizedSessionId: "sess-bin", Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
	b, err := protojson.Marshal(in)
	require.NoError(t, err)
	var inMap map[string]any
	require.NoError(t, json.Unmarshal(b, &inMap))
	res := command("c1", "run.attach", map[string]any{"input": inMap})
	require.Equal(t, "completed", res.GetStatus(), res.GetMessage())
	res = command("c2", "turn.start", map[string]any{"text": "say hello"})
	require.Equal(t, "completed", res.GetStatus(), res.GetMessage())
	turnID := res.GetResult().GetFields()["turnId"].GetStringValue()
	require.NotEmpty(t, turnID)

	term := waitEvent("run.terminal")
	pl := term.GetPayload().AsMap()
	assert.Equal(t, "completed", pl["turnTerminalState"], "payload: %v", pl)
	assert.Equal(t, "succeeded", pl["runTerminalState"])
	assert.Equal(t, turnID, pl["providerTurnId"])
	assert.NotEmpty(t, pl["providerThreadId"])
	ready := waitEvent("harness.ready")
	pgid := int(ready.GetPayload().AsMap()["pgid"].(float64))
	require.Positive(t, pgid)
	assert.NoError(t, syscall.Kill(-pgid, 0), "provider group alive while the session is warm")

	// Contiguous seqs from 1 with no gaps.
	for i, ev := range events {
		assert.Equal(t, uint64(i+1), ev.GetSourceSeq())
		assert.Equal(t, "run-bin", ev.GetRunId())
	}

	res = command("c3", "session.close", map[string]any{})
	require.Equal(t, "completed", res.GetStatus(), res.GetMessage())
	suspended := waitEvent("runner.suspended")
	assert.Equal(t, "session_closed", suspended.GetPayload().AsMap()["reason"])
	g.send(&prpv1.Frame{Kind: &prpv1.Frame_Ack{Ack: &prpv1.Ack{AckedSourceSeq: suspended.GetSourceSeq()}}})
	select {
	case err := <-exited:
		require.NoError(t, err, "runnerd exits 0 after session.close")
	case <-time.After(10 * time.Second):
		t.Fatal("runnerd did not exit after session.close")
	}
	exited <- nil
	assert.ErrorIs(t, syscall.Kill(-pgid, 0), syscall.ESRCH, "provider group is gone")

	st, err := (&statedir.Store{Dir: filepath.Join(stateDir, "runner")}).Load()
	require.NoError(t, err)
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle, "a closed session is a durable suspension")
	assert.Equal(t, "session_closed", st.LifecycleReason)
	assert.Equal(t, pl["providerThreadId"], st.ProviderThreadID, "the provider thread is kept")
	assert.Equal(t, suspended.GetSourceSeq(), st.AckedSourceSeq)
	assert.NotContains(t, logs.String(), ticket.Encode())
}

func TestS5_RunnerdReadsItsTicketFromAnInheritedDescriptorAndClosesIt(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	_, err = w.WriteString("bootstrap.claims.secret\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	fd, err := syscall.Dup(int(r.Fd()))
	require.NoError(t, err)
	require.NoError(t, r.Close())
	got, err := readTicket(fd)
	require.NoError(t, err)
	require.Equal(t, "bootstrap.claims.secret", got)
	_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	require.Equal(t, syscall.EBADF, errno, "the descriptor is closed once read")

	_, err = readTicket(1 << 20)
	require.Error(t, err, "a descriptor that is not open")
	var stderr bytes.Buffer
	code := run([]string{"--bootstrap-ticket-fd", "999999", "--state-dir", "/x", "--workspace", "/y"}, "", false, io.Discard, &stderr)
	require.Equal(t, runner.ExitError, code)
	require.Contains(t, stderr.String(), "reading the bootstrap ticket")
}

// runnerd drives only the providers registered in its build: another
// --provider is a configuration error before anything starts.
func TestR10_RunnerdRefusesAProviderItHasNoDriverFor(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	args := []string{"--connect-url", "ws://127.0.0.1:1/v1/runners/connect", "--state-dir", dir, "--runner-id", "r",
		"--environment-lease-id", "e", "--session-id", "s", "--session-scope", "abc", "--workspace", dir,
		"--provider", "acpx-pi", "--provider-command", "/bin/true"}
	a := prp.NewAuthority([]byte("k"), nil)
	ticket, err := a.MintTicket("r", "abc", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 1, run(args, ticket.Encode(), true, &out, &errb))
	assert.Contains(t, errb.String(), `--provider "acpx-pi"`)
}

// runnerd logs a warning for each deprecated alias it was given (the
// gateway of the previous release passes --codex-command/--codex-arg).
func TestR10_RunnerdWarnsOfTheDeprecatedCodexFlags(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	dir := t.TempDir()
	args := []string{"--connect-url", "ws://127.0.0.1:1/v1/runners/connect", "--state-dir", dir, "--runner-id", "r",
		"--environment-lease-id", "e", "--session-id", "s", "--session-scope", "abc", "--workspace", dir,
		"--codex-command", "/bin/true", "--codex-arg", "x"}
	assert.Equal(t, 1, run(args, "", false, &out, &errb))
	assert.Contains(t, errb.String(), "-codex-command is deprecated and will be removed in the next release; use -provider-command")
	assert.Contains(t, errb.String(), "-codex-arg is deprecated")
	assert.Contains(t, errb.String(), "no bootstrap ticket")
}
