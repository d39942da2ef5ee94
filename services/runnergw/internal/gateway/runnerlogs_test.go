package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a goroutine-safe log sink.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestD6_RunnerdsLogReachesTheGatewaysLogAndIsRotatedPastItsBound: the
// lines runnerd writes to its scope's runnerd.log come out on the
// gateway's own log (source runnerd, the scope, the line's level, message
// and attributes; a line that is not runnerd's JSON as it is), and a log
// past its bound is rotated to runnerd.log.1 while its lines go on being
// followed.
func TestD6_RunnerdsLogReachesTheGatewaysLogAndIsRotatedPastItsBound(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	const scope = "5c0be0f1a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c"
	dir := filepath.Join(root, scope)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	const bound = 64 << 10
	g := New(Config{StateRoot: root, Logger: slog.New(slog.NewJSONHandler(out, nil)), RunnerLogMaxBytes: bound})
	defer g.Close()
	logf, err := openScopeLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	g.noteLaunch(scope, logf)
	g.mu.Lock()
	g.runners[scope] = &runner{scope: scope}
	g.mu.Unlock()

	write := func(s string) {
		t.Helper()
		if _, err := logf.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"time":"2026-12-07T00:00:00Z","level":"WARN","msg":"gateway connection lost","runner_id":"runner-1","reason":"read failed"}` + "\n")
	write("panic: something the Go runtime printed\n")
	waitFor(t, func() bool {
		return strings.Contains(out.String(), `"msg":"runnerd: gateway connection lost"`) && strings.Contains(out.String(), `panic: something`)
	}, "runnerd's lines on the gateway's log", out)
	var rec map[string]any
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "runnerd: gateway connection lost") {
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rec["level"] != "WARN" || rec["source"] != "runnerd" || rec["session_scope"] != scope[:16] {
		t.Errorf("re-emitted line: %v", rec)
	}
	if r, _ := rec["runnerd"].(map[string]any); r["runner_id"] != "runner-1" || r["reason"] != "read failed" {
		t.Errorf("the line's attributes: %v", rec["runnerd"])
	}

	// Past its bound: rotated, and followed on.
	filler := strings.Repeat("x", 1000)
	for i := 0; i*1024 < bound+16<<10; i++ {
		write(`{"level":"DEBUG","msg":"filler","pad":"` + filler + "\"}\n")
	}
	waitFor(t, func() bool {
		old, err1 := os.Stat(filepath.Join(dir, runnerLogOld))
		cur, err2 := os.Stat(filepath.Join(dir, runnerdLog))
		return err1 == nil && err2 == nil && old.Size() > bound && cur.Size() < bound
	}, "runnerd.log rotated", nil)
	write(`{"level":"INFO","msg":"after the rotation"}` + "\n")
	waitFor(t, func() bool { return strings.Contains(out.String(), "runnerd: after the rotation") }, "a line after the rotation", nil)
}

func waitFor(t *testing.T, ok func() bool, what string, out *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			if out != nil {
				t.Fatalf("%s: not within 20 s; gateway log:\n%s", what, out.String())
			}
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
