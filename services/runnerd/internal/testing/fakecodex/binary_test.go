package fakecodex

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

// buildBinary is cmd/fake-codex-app-server: make test's prebuilt one
// ($TETHER_TEST_BIN), or one built once per test process (TestMain removes
// it).
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a binary")
	}
	bin, err := testbin.Path("github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server")
	require.NoError(t, err)
	return bin
}

// lockedBuffer collects a child's stderr; exec copies into it from its own
// goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// procClient speaks to a spawned binary.
type procClient struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
	nextID int
}

func spawn(t *testing.T, bin string, env []string, args ...string) *procClient {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	p := &procClient{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), stderr: stderr, nextID: 1}
	go func() {
		defer close(p.lines)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				p.lines <- strings.TrimSuffix(line, "\n")
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		for range p.lines {
		}
	})
	return p
}

func (p *procClient) request(method string, params any) int {
	p.t.Helper()
	id := p.nextID
	p.nextID++
	data, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	require.NoError(p.t, err)
	_, err = p.stdin.Write(append(data, '\n'))
	require.NoError(p.t, err)
	return id
}

func (p *procClient) next() wireMsg {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("stdout closed; stderr: %s", p.stderr.String())
		}
		var m wireMsg
		require.NoError(p.t, json.Unmarshal([]byte(line), &m), "stdout must carry protocol lines only: %q", line)
		m.Raw = line
		return m
	case <-time.After(waitTimeout):
		p.t.Fatalf("timed out; stderr: %s", p.stderr.String())
		return wireMsg{}
	}
}

func (p *procClient) call(method string, params any, out any) {
	p.t.Helper()
	id := p.request(method, params)
	for {
		m := p.next()
		if m.isResponse() && string(m.ID) == itoa(id) {
			require.Nil(p.t, m.Error, m.Raw)
			if out != nil {
				require.NoError(p.t, json.Unmarshal(m.Result, out))
			}
			return
		}
	}
}

// exit closes stdin and waits for the exit code.
func (p *procClient) exit() int {
	p.t.Helper()
	_ = p.stdin.Close()
	for range p.lines {
	}
	err := p.cmd.Wait()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode()
	}
	require.NoError(p.t, err)
	return 0
}

func TestR3_BinaryDrivesTurnOverPipes(t *testing.T) {
	bin := buildBinary(t)
	home := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "calls.log")
	env := []string{"CODEX_HOME=" + home}
	flags := []string{"app-server", "--state-file-in-codex-home", "--durable-turn-ids", "--call-log", logPath, "--record-process-start", "--delta-delay-ms", "1"}

	p := spawn(t, bin, env, flags...)
	var init struct {
		CodexHome string `json:"codexHome"`
	}
	p.call("initialize", map[string]any{"clientInfo": map[string]any{"name": "bin-test", "version": "1"}}, &init)
	require.Equal(t, home, init.CodexHome)
	var tr threadResp
	p.call("thread/start", map[string]any{"cwd": "/workspace", "approvalPolicy": "never", "sandbox": "read-only", "model": "mock-model"}, &tr)
	var ts struct {
		Turn struct {
			ID string `json:"id"`
		} `json:"turn"`
	}
	p.call("turn/start", map[string]any{"threadId": tr.Thread.ID, "input": textInput("over pipes")}, &ts)
	require.Equal(t, "provider-turn-1", ts.Turn.ID)
	var seen []wireMsg
	for {
		m := p.next()
		seen = append(seen, m)
		if m.Method == "turn/completed" {
			break
		}
	}
	require.Equal(t, plainTurnSequence, methods(seen[:len(seen)-1]))
	tc := decode[turnCompleted](t, seen[len(seen)-1].Params)
	require.Equal(t, ReplyText("over pipes", 1, 0), tc.Turn.Items[0].Text)
	require.Equal(t, 0, p.exit(), "stdin EOF exits 0")
	require.FileExists(t, filepath.Join(home, StateFileName))

	// A second process resumes the thread; --exit-after-turn-start makes it
	// die with status 1 right after the turn/start response.
	p = spawn(t, bin, env, append(flags, "--exit-after-turn-start")...)
	p.call("initialize", map[string]any{"clientInfo": map[string]any{"name": "bin-test", "version": "1"}}, nil)
	p.call("thread/resume", map[string]any{"threadId": tr.Thread.ID}, nil)
	p.call("turn/start", map[string]any{"threadId": tr.Thread.ID, "input": textInput("crash")}, &ts)
	require.Equal(t, "provider-turn-2", ts.Turn.ID)
	require.Equal(t, 1, p.exit())

	data, err := os.ReadFile(logPath)
	require.NoError(t, err)
	require.Equal(t, "process-start\ninitialize\nthread/start\nturn/start\nprocess-start\ninitialize\nthread/resume\nturn/start\n", string(data))
}
