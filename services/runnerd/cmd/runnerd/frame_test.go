package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// TestHelperHugeLineProvider is not a test: run as a provider (with the
// argument huge-line-provider) it speaks just enough of the codex
// app-server protocol to start a turn, then writes a 5 MiB line.
func TestHelperHugeLineProvider(t *testing.T) {
	if !slices.Contains(os.Args, "huge-line-provider") {
		t.Skip("helper process")
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	send := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	for in.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(in.Bytes(), &m) != nil || len(m.ID) == 0 {
			continue
		}
		switch m.Method {
		case "initialize":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"userAgent": "huge/1"}})
		case "thread/start", "thread/resume":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"thread": map[string]any{"id": "th-1"}}})
		case "turn/start":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"turn": map[string]any{"id": "turn-1"}}})
			send(map[string]any{"jsonrpc": "2.0", "method": "turn/started", "params": map[string]any{"threadId": "th-1", "turn": map[string]any{"id": "turn-1"}}})
			send(map[string]any{"jsonrpc": "2.0", "method": "item/agentMessage/delta", "params": map[string]any{
				"threadId": "th-1", "turnId": "turn-1", "itemId": "i1", "delta": strings.Repeat("x", 5<<20)}})
		default:
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "no"}})
		}
	}
	os.Exit(0)
}

func TestG4_ProviderLineOver4MiBFailsTheTurnWithProviderFrameTooLarge(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	runnerd := goBuild(t, "github.com/tether-run/tether/services/runnerd/cmd/runnerd", "runnerd")
	g := &binGateway{t: t, auth: prp.NewAuthority([]byte("bin-key"), nil), frames: make(chan *prpv1.Frame, 1024)}
	srv := httptest.NewServer(http.HandlerFunc(g.handle))
	defer func() { srv.Close(); g.wg.Wait() }()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/runners/connect"
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	proc := startRunnerd(t, runnerd, g, url, "--state-dir", filepath.Join(base, "state"), "--workspace", ws, "--provider-command", self,
		"--provider-arg", "-test.run=^TestHelperHugeLineProvider$", "--provider-arg", "huge-line-provider")
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.conn != nil }, 10*time.Second, 10*time.Millisecond)

	var events []*prpv1.Event
	var results []*prpv1.CommandResult
	wait := func(what string, done func() bool) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for !done() {
			select {
			case f := <-g.frames:
				events = append(events, f.GetEvents().GetEvents()...)
				if r := f.GetCommandResult(); r != nil {
					results = append(results, r)
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	find := func(typ string) *prpv1.Event {
		for _, ev := range events {
			if ev.GetEventType() == typ {
				return ev
			}
		}
		return nil
	}
	in := &prpv1.ExecutionInput{Provider: &prpv1.Provider{Kind: "codex"}, Session: &prpv1.Session{NormalizedSessionId: "sess-re"}}
	b, err := protojson.Marshal(in)
	require.NoError(t, err)
	var inMap map[string]any
	require.NoError(t, json.Unmarshal(b, &inMap))
	for i, c := range []struct {
		typ     string
		payload map[string]any
	}{{"run.attach", map[string]any{"input": inMap}}, {"turn.start", map[string]any{"text": "flood me"}}} {
		p, err := structpb.NewStruct(c.payload)
		require.NoError(t, err)
		g.send(&prpv1.Frame{Kind: &prpv1.Frame_Command{Command: &prpv1.Command{
			CommandId: fmt.Sprintf("c%d", i), ControllerSeq: uint64(i + 1), Type: c.typ, RunId: "run-huge", Attempt: 1, Payload: p}}})
	}
	wait("run.terminal and harness.exited", func() bool { return find("run.terminal") != nil && find("harness.exited") != nil })
	for _, r := range results {
		require.Equal(t, "completed", r.GetStatus(), "%s: %s", r.GetCommandType(), r.GetMessage())
	}
	term := find("run.terminal").GetPayload().AsMap()
	require.Equal(t, "failed", term["turnTerminalState"], "%v", term)
	require.Equal(t, failure.ProviderFrameTooLarge, term["code"], "%v", term)
	require.Equal(t, failure.ProviderFrameTooLarge, find("harness.exited").GetPayload().AsMap()["code"])
	for _, ev := range events {
		require.Less(t, len(ev.GetPayload().String()), 1<<20, "the oversize line never became an event")
	}
	require.NoError(t, syscall.Kill(proc.cmd.Process.Pid, syscall.SIGTERM))
	select {
	case <-proc.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("runnerd did not exit on SIGTERM")
	}
}
