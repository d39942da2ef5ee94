package codex

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

type recorder struct {
	mu       sync.Mutex
	evs      []Event
	inflight atomic.Int32 // detects concurrent emit calls
	delay    atomic.Int64 // ns; simulates a slow (journaling) consumer
}

func (r *recorder) emit(e Event) {
	if r.inflight.Add(1) != 1 {
		panic("concurrent emit")
	}
	defer r.inflight.Add(-1)
	if d := r.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if e.Body != nil {
		e.Payload = bodyMap(e.Body)
	}
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

func (r *recorder) types() []string {
	var out []string
	for _, e := range r.events() {
		out = append(out, e.Type)
	}
	return out
}

func (r *recorder) ofType(typ string) []Event {
	var out []Event
	for _, e := range r.events() {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) index(pred func(Event) bool) int {
	for i, e := range r.events() {
		if pred(e) {
			return i
		}
	}
	return -1
}

func (r *recorder) waitFor(t *testing.T, pred func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if i := r.index(pred); i >= 0 {
			return r.events()[i]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("event not emitted; got %v", r.types())
	return Event{}
}

func isType(typ string) func(Event) bool { return func(e Event) bool { return e.Type == typ } }

func stubExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

func quietLogger() *slog.Logger {
	// Debug level so the stderr/log paths run; output discarded.
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// stubConfig is a Config that runs the scripted stub with scenario.
func stubConfig(t *testing.T, scenario string, extraEnv ...string) Config {
	t.Helper()
	return Config{
		Command: stubExe(t),
		// GORACE: a -race stub would otherwise sleep 1s in exit.
		Env:            append([]string{stubScenarioEnv + "=" + scenario, "GORACE=atexit_sleep_ms=0"}, extraEnv...),
		Dir:            t.TempDir(),
		Model:          "stub-model",
		ApprovalPolicy: "never",
		Sandbox:        "read-only",
		StartupTimeout: 20 * time.Second,
		RequestTimeout: 10 * time.Second,
		Logger:         quietLogger(),
	}
}

func startSession(t *testing.T, cfg Config) (*Session, *recorder) {
	t.Helper()
	rec := &recorder{}
	s, err := Start(context.Background(), cfg, rec.emit)
	require.NoError(t, err)
	t.Cleanup(func() { closeSession(t, s) })
	return s, rec
}

func closeSession(t *testing.T, s *Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx, 2*time.Second))
}

func openStubThread(t *testing.T, s *Session) string {
	t.Helper()
	id, resumed, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	require.False(t, resumed)
	return id
}

func waitTurn(t *testing.T, s *Session) TurnResult {
	t.Helper()
	select {
	case r := <-s.TurnDone():
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("no TurnResult")
		return TurnResult{}
	}
}

func waitExited(t *testing.T, s *Session) {
	t.Helper()
	select {
	case <-s.Exited():
	case <-time.After(15 * time.Second):
		t.Fatal("session did not exit")
	}
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	st, err := readProcStat(pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}

// readRecord reads the stub's record of received lines.
func readRecord(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

// bodyMap is a typed payload as the JSON object its event carries.
func bodyMap(b proto.Message) map[string]any {
	s, err := prp.Payload(b)
	if err != nil {
		panic(err)
	}
	return s.AsMap()
}

// resolution is a request.resolve resolution object as the drivers take it.
func resolution(m map[string]any) provider.Resolution {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return provider.ParseResolution(s)
}
