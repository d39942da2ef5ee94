package provhost

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

var runnerdBin, fakeBin string

func TestMain(m *testing.M) {
	dir := testbin.MustDir(
		"github.com/tether-run/tether/services/runnerd/cmd/runnerd",
		"github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server")
	runnerdBin, fakeBin = filepath.Join(dir, "runnerd"), filepath.Join(dir, "fake-codex-app-server")
	testbin.Main(m)
}

// shim is a `runnerd provider-shim` process driven line by line.
type shim struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan int
}

func startShim(t *testing.T, dir string, reattach bool, resume uint64) *shim {
	t.Helper()
	args := ShimArgs(dir, reattach, resume)
	cmd := exec.Command(runnerdBin, args...)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	s := &shim{t: t, cmd: cmd, in: in, lines: make(chan string, 4096), done: make(chan int, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		err := cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		s.done <- code
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return s
}

func (s *shim) send(m map[string]any) {
	b, err := json.Marshal(m)
	require.NoError(s.t, err)
	_, err = s.in.Write(append(b, '\n'))
	require.NoError(s.t, err)
}

func (s *shim) request(id int, method string, params map[string]any) {
	s.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

type msg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params map[string]any  `json:"params"`
	Result map[string]any  `json:"result"`
	raw    string
}

func (s *shim) next() msg {
	s.t.Helper()
	select {
	case l, ok := <-s.lines:
		require.True(s.t, ok, "shim output ended")
		var m msg
		require.NoError(s.t, json.Unmarshal([]byte(l), &m), l)
		m.raw = l
		return m
	case <-time.After(15 * time.Second):
		s.t.Fatal("no line from the provider host")
		return msg{}
	}
}

// exit waits for the shim's exit code (a shim that never exits fails the
// test instead of hanging it).
func (s *shim) exit() int {
	s.t.Helper()
	select {
	case code := <-s.done:
		return code
	case <-time.After(time.Minute):
		s.t.Fatal("the shim did not exit")
		return -1
	}
}

// mark returns the cursor of a host mark line, or 0.
func (m msg) mark() uint64 {
	if m.Method != "warning" {
		return 0
	}
	c, _, ok := ParseMark(fmt.Sprint(m.Params["message"]))
	if !ok {
		return 0
	}
	return c
}

func spawnHost(t *testing.T, retain int) (string, *Info) {
	t.Helper()
	return spawnHostIn(t, filepath.Join(t.TempDir(), "runner"), retain)
}

func spawnHostIn(t *testing.T, dir string, retain int) (string, *Info) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o700))
	home := t.TempDir()
	in, err := Spawn(context.Background(), SpawnConfig{
		Self: runnerdBin, Dir: dir, WorkDir: t.TempDir(),
		Env:     []string{"PATH=/usr/bin:/bin", "CODEX_HOME=" + home, "HOME=" + home},
		Command: fakeBin, Args: []string{"app-server", "--delta-delay-ms", "15"},
		SeqBase: 100, DetachTimeout: 30 * time.Second, Grace: time.Second, RetainBytes: retain,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = Stop(in, time.Second) })
	require.True(t, in.HostAlive())
	require.True(t, in.ProviderAlive())
	require.Equal(t, in.ProviderPID, in.ProviderPGID)
	return dir, in
}

const prompt = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"

func TestR1_ProviderHostReplaysExactlyTheLinesAfterTheCursorToAReattachingClient(t *testing.T) {
	dir, info := spawnHost(t, 0)
	c1 := startShim(t, dir, false, 0)
	c1.request(1, "initialize", map[string]any{"clientInfo": map[string]any{"name": "t", "version": "1"}})
	init1 := c1.next()
	require.Equal(t, "1", string(init1.ID))
	c1.send(map[string]any{"jsonrpc": "2.0", "method": "initialized"})
	c1.request(2, "thread/start", map[string]any{})
	var thread string
	var lastMark uint64 = 100
	var deltas []string
	var pendingDelta string
	turnStarted := false
	for thread == "" {
		m := c1.next()
		if string(m.ID) == "2" {
			thread = m.Result["thread"].(map[string]any)["id"].(string)
		}
		if c := m.mark(); c > 0 {
			require.Equal(t, lastMark+1, c, "marks follow each line in order")
			lastMark = c
		}
	}
	c1.request(3, "turn/start", map[string]any{"threadId": thread, "input": []any{map[string]any{"type": "text", "text": prompt}}})
	for len(deltas) < 4 {
		m := c1.next()
		if c := m.mark(); c > 0 {
			require.Equal(t, lastMark+1, c)
			lastMark = c
			if pendingDelta != "" {
				deltas = append(deltas, pendingDelta)
				pendingDelta = ""
			}
			continue
		}
		switch m.Method {
		case "turn/started":
			turnStarted = true
		case "item/agentMessage/delta":
			pendingDelta = m.Params["delta"].(string)
		}
	}
	require.True(t, turnStarted)
	// The client dies (as the shim does when runnerd is killed); the
	// provider goes on into the host's buffer.
	require.NoError(t, c1.in.Close())
	require.Equal(t, ShimExitClosed, c1.exit())
	time.Sleep(150 * time.Millisecond)
	require.True(t, info.ProviderAlive())

	// A fresh session cannot take over a provider that served one.
	fresh := startShim(t, dir, false, 0)
	require.Equal(t, ShimExitRefused, fresh.exit())

	c2 := startShim(t, dir, true, lastMark)
	c2.request(1, "initialize", map[string]any{"clientInfo": map[string]any{"name": "t", "version": "2"}})
	init2 := c2.next()
	require.Equal(t, "1", string(init2.ID))
	require.Equal(t, init1.Result, init2.Result, "answered from the first initialize")
	c2.send(map[string]any{"jsonrpc": "2.0", "method": "initialized"})
	c2.request(2, "thread/resume", map[string]any{"threadId": thread, "excludeTurns": true})
	m := c2.next()
	require.Equal(t, "2", string(m.ID), "the resume answer comes before the replay: %s", m.raw)
	adopt := c2.next()
	require.Equal(t, "warning", adopt.Method)
	_, turnID, ok := ParseMark(fmt.Sprint(adopt.Params["message"]))
	require.True(t, ok)
	require.NotEmpty(t, turnID)
	started := c2.next()
	require.Equal(t, "turn/started", started.Method, "the active turn is re-announced")
	require.Equal(t, turnID, started.Params["turn"].(map[string]any)["id"])
	first := true
	final := ""
	for final == "" {
		m := c2.next()
		if c := m.mark(); c > 0 {
			if first {
				require.Equal(t, lastMark+1, c, "the replay starts right after the cursor")
				first = false
			} else {
				require.Equal(t, lastMark+1, c)
			}
			lastMark = c
			if pendingDelta != "" {
				deltas = append(deltas, pendingDelta)
				pendingDelta = ""
			}
			continue
		}
		switch m.Method {
		case "item/agentMessage/delta":
			pendingDelta = m.Params["delta"].(string)
		case "turn/started":
			t.Fatalf("turn/started replayed after the cursor: %s", m.raw)
		case "item/completed":
			if it, _ := m.Params["item"].(map[string]any); it["type"] == "agentMessage" {
				final = it["text"].(string)
			}
		}
	}
	require.Equal(t, final, strings.Join(deltas, ""), "each delta exactly once across the re-attach")
	require.Contains(t, final, prompt)

	require.NoError(t, Stop(info, time.Second))
	require.False(t, info.ProviderAlive())
	require.False(t, info.HostAlive())
	_, err := os.Stat(filepath.Join(dir, SocketName))
	require.True(t, os.IsNotExist(err), "the socket is removed")
}

func TestR1_ProviderHostRefusesAReplayFromBehindItsBuffer(t *testing.T) {
	dir, info := spawnHost(t, 512)
	c1 := startShim(t, dir, false, 0)
	c1.request(1, "initialize", map[string]any{"clientInfo": map[string]any{"name": "t", "version": "1"}})
	c1.next()
	c1.request(2, "thread/start", map[string]any{})
	var thread string
	for thread == "" {
		if m := c1.next(); string(m.ID) == "2" {
			thread = m.Result["thread"].(map[string]any)["id"].(string)
		}
	}
	c1.request(3, "turn/start", map[string]any{"threadId": thread, "input": []any{map[string]any{"type": "text", "text": prompt}}})
	// The whole turn reaches the client: every line of it was sent, so the
	// next line the host buffers (the answer to thread/read) trims the turn
	// down to the 512-byte bound and the turn's first lines are dropped.
	for m := c1.next(); m.Method != "turn/completed"; m = c1.next() {
	}
	c1.request(4, "thread/read", map[string]any{"threadId": thread})
	for m := c1.next(); string(m.ID) != "4"; m = c1.next() {
	}
	require.NoError(t, c1.in.Close())
	require.Equal(t, ShimExitClosed, c1.exit())
	c2 := startShim(t, dir, true, 100)
	require.Equal(t, ShimExitRefused, c2.exit())
	require.NoError(t, Stop(info, time.Second))
}

func TestR1_ShimWithoutAHostFails(t *testing.T) {
	s := startShim(t, t.TempDir(), true, 0)
	require.Equal(t, ShimExitNoHost, s.exit())
}

func TestR1_StoppingTheHostKillsAProviderGroupThatIgnoresStdinEOFAndTERM(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runner")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	in, err := Spawn(context.Background(), SpawnConfig{
		Self: runnerdBin, Dir: dir, WorkDir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"},
		// The shell and its child (same group) ignore TERM and stdin EOF.
		Command: "/bin/sh", Args: []string{"-c", "trap '' TERM; sleep 1000 & while :; do sleep 1; done"},
		DetachTimeout: time.Minute, Grace: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = Stop(in, time.Second) })
	require.True(t, in.ProviderAlive())
	start := time.Now()
	require.NoError(t, Stop(in, 200*time.Millisecond))
	require.False(t, in.ProviderAlive())
	require.False(t, in.HostAlive())
	require.Eventually(t, func() bool { return !groupAlive(in.ProviderPGID) }, 5*time.Second, 20*time.Millisecond,
		"the whole provider group is gone")
	require.Less(t, time.Since(start), 5*time.Second, "EOF, grace, TERM, grace, KILL")
}

func TestR1_ProviderHostStopsTheProviderWhenNoClientComesBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runner")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	in, err := Spawn(context.Background(), SpawnConfig{
		Self: runnerdBin, Dir: dir, WorkDir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"},
		Command: "/bin/sh", Args: []string{"-c", "while :; do sleep 1; done"},
		DetachTimeout: 300 * time.Millisecond, Grace: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = Stop(in, time.Second) })
	require.Eventually(t, func() bool { return !in.HostAlive() && !in.ProviderAlive() }, 10*time.Second, 20*time.Millisecond,
		"an orphaned provider does not outlive the detach timeout")
}

// groupAlive reports a live (non-zombie) member of process group pgid.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); err == syscall.ESRCH {
		return false
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 3 && f[2] == fmt.Sprint(pgid) && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}

// dialled is a client attached with Dial, driven line by line.
type dialled struct {
	t     *testing.T
	c     *Conn
	lines chan string
}

func dialClient(t *testing.T, dir string, reattach bool, resume uint64) *dialled {
	t.Helper()
	c, err := Dial(dir, reattach, resume)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	d := &dialled{t: t, c: c, lines: make(chan string, 4096)}
	go func() {
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	return d
}

func (d *dialled) request(id int, method string, params map[string]any) {
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	require.NoError(d.t, err)
	_, err = d.c.Write(append(b, '\n'))
	require.NoError(d.t, err)
}

// answer waits for the answer to request id.
func (d *dialled) answer(id int) msg {
	d.t.Helper()
	for {
		select {
		case l, ok := <-d.lines:
			require.True(d.t, ok, "the host closed the connection")
			var m msg
			require.NoError(d.t, json.Unmarshal([]byte(l), &m), l)
			if m.Method == "" && string(m.ID) == strconv.Itoa(id) {
				return m
			}
		case <-time.After(15 * time.Second):
			d.t.Fatal("no answer from the provider host")
			return msg{}
		}
	}
}

// TestP4_RunnerdAttachesToTheHostOverItsSocketWithoutAShim: runnerd drives
// a hosted provider over the host's socket itself (Dial), whatever the
// length of its state directory's path (a socket address holds about 108
// bytes: a long one is reached through a descriptor of the directory). A
// second fresh client is refused as a shim's was, and a client closing
// its side detaches (the host then takes a re-attaching one).
func TestP4_RunnerdAttachesToTheHostOverItsSocketWithoutAShim(t *testing.T) {
	dir, info := spawnHostIn(t, filepath.Join(t.TempDir(), "a-state-directory-deep-enough", "that-its-socket-path-is-long", "runner"), 0)
	require.Greater(t, len(filepath.Join(dir, SocketName)), maxSocketPath, "the test's state directory is a long path")
	short, err := os.MkdirTemp("", "ph")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	require.NoError(t, os.Symlink(dir, filepath.Join(short, "r")))
	require.Less(t, len(filepath.Join(short, "r", SocketName)), maxSocketPath)

	c1 := dialClient(t, dir, false, 0)
	c1.request(1, "initialize", map[string]any{"clientInfo": map[string]any{"name": "t", "version": "1"}})
	require.NotNil(t, c1.answer(1).Result)
	c1.request(2, "thread/start", map[string]any{"cwd": t.TempDir()})
	require.NotNil(t, c1.answer(2).Result)

	_, err = Dial(filepath.Join(short, "r"), false, 0)
	var ref *RefusedError
	require.ErrorAs(t, err, &ref, "a fresh session cannot attach to a provider that already served one")

	require.NoError(t, c1.c.CloseWrite())
	for range c1.lines {
	}
	c2 := dialClient(t, filepath.Join(short, "r"), true, 0)
	c2.request(1, "initialize", map[string]any{"clientInfo": map[string]any{"name": "t", "version": "1"}})
	require.NotNil(t, c2.answer(1).Result, "the re-attached client is answered from the cached initialize")
	require.True(t, info.ProviderAlive())

	_, err = Dial(t.TempDir(), true, 0)
	require.Error(t, err, "no host listens there")
	require.False(t, errors.As(err, &ref))
}
