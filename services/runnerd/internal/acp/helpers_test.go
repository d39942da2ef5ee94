package acp

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

// fakeAgent returns tools/fake-acp-agent (built once per test binary unless
// make test prebuilt it).
func fakeAgent(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the fake ACP agent")
	}
	bin, err := testbin.Path("github.com/tether-run/tether/services/runnerd/tools/fake-acp-agent")
	require.NoError(t, err)
	return bin
}

func TestMain(m *testing.M) { testbin.Main(m) }

// recorder collects emitted events; wait blocks until a condition holds.
type recorder struct {
	mu     sync.Mutex
	events []Event
	signal chan struct{}
}

func newRecorder() *recorder { return &recorder{signal: make(chan struct{}, 1)} }

func (r *recorder) emit(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func (r *recorder) ofType(typ string) []Event {
	var out []Event
	for _, e := range r.all() {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// waitFor waits (bounded) until an event of typ is recorded.
func (r *recorder) waitFor(t *testing.T, typ string) Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if evs := r.ofType(typ); len(evs) > 0 {
			return evs[len(evs)-1]
		}
		select {
		case <-r.signal:
		case <-deadline:
			t.Fatalf("no %s event; got %v", typ, r.types())
		}
	}
}

func (r *recorder) types() []string {
	var out []string
	for _, e := range r.all() {
		out = append(out, e.Type)
	}
	return out
}

// harness is one test's layout: the fake, a workspace, the state dir and
// the fake's own home.
type harness struct {
	t                  *testing.T
	bin                string
	workspace, state   string
	home, callLog      string
	flavor, permission string
	extraArgs          []string
}

func newHarness(t *testing.T, flavor, permission string) *harness {
	t.Helper()
	root := t.TempDir()
	h := &harness{t: t, bin: fakeAgent(t), workspace: filepath.Join(root, "workspace"), state: filepath.Join(root, "acpx"),
		home: filepath.Join(root, "home"), callLog: filepath.Join(root, "calls.log"), flavor: flavor, permission: permission}
	require.NoError(t, os.MkdirAll(h.workspace, 0o755))
	require.NoError(t, os.MkdirAll(h.home, 0o700))
	return h
}

func (h *harness) config() Config {
	return Config{
		Command: h.bin, Args: append([]string{"-flavor", h.flavor, "-call-log", h.callLog}, h.extraArgs...),
		Env: []string{"HOME=" + h.home, "PATH=/usr/bin:/bin"}, Dir: h.workspace, StateDir: h.state,
		Agent: h.flavor, PermissionMode: h.permission, RequestTimeout: 20 * time.Second,
	}
}

// start starts a session (closed at cleanup) and opens threadID.
func (h *harness) start(threadID string) (*Session, *recorder, string) {
	h.t.Helper()
	s, rec, id, err := h.tryStart(h.config(), threadID)
	require.NoError(h.t, err)
	return s, rec, id
}

func (h *harness) tryStart(cfg Config, threadID string) (*Session, *recorder, string, error) {
	h.t.Helper()
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg, rec.emit)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = s.Close(context.Background(), time.Second) })
	id, _, err := s.OpenThread(ctx, threadID)
	return s, rec, id, err
}

// turn runs one prompt to its end.
func turnOf(t *testing.T, s *Session, text string) TurnResult {
	t.Helper()
	id, err := s.StartTurn(context.Background(), text)
	require.NoError(t, err)
	return waitTurn(t, s, id)
}

func waitTurn(t *testing.T, s *Session, id string) TurnResult {
	t.Helper()
	select {
	case r := <-s.TurnDone():
		require.Equal(t, id, r.TurnID)
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("turn %s did not end", id)
	}
	return TurnResult{}
}

func (h *harness) calls() []string {
	b, _ := os.ReadFile(h.callLog)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func count(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if l == s {
			n++
		}
	}
	return n
}
