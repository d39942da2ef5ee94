package codex

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
)

// R1: one provider process per session, own process group, identity,
// exit detection, group kill on close.

func TestR1_ProcessInfoOwnProcessGroup(t *testing.T) {
	t.Parallel()
	before := time.Now()
	s, _ := startSession(t, stubConfig(t, "echo"))
	info := s.Process()
	require.Positive(t, info.PID)
	assert.Equal(t, info.PID, info.PGID, "provider leads its own group")
	pgid, err := syscall.Getpgid(info.PID)
	require.NoError(t, err)
	assert.Equal(t, info.PGID, pgid)
	assert.NotEqual(t, syscall.Getpgrp(), pgid, "not in runnerd's group")
	ticks, err := ProcStartTicks(info.PID)
	require.NoError(t, err)
	assert.Equal(t, ticks, info.StartTicks)
	assert.NotZero(t, info.StartTicks)
	assert.False(t, info.StartedAt.Before(before))
	assert.False(t, info.StartedAt.After(time.Now()))
	assert.Nil(t, s.ExitErr())
}

func TestR1_ParseProcStatCommWithSpacesAndParens(t *testing.T) {
	t.Parallel()
	tail := make([]string, 0, 50)
	for i := 4; i <= 52; i++ {
		switch i {
		case 5:
			tail = append(tail, "4242")
		case 22:
			tail = append(tail, "987654321")
		default:
			tail = append(tail, strconv.Itoa(i*10))
		}
	}
	for _, comm := range []string{"codex", "a b c", "x) S 1 2 (y", "((", ")"} {
		line := "4242 (" + comm + ") S " + strings.Join(tail, " ") + "\n"
		st, err := parseProcStat([]byte(line))
		require.NoError(t, err, comm)
		assert.Equal(t, byte('S'), st.State, comm)
		assert.Equal(t, 4242, st.PGRP, comm)
		assert.Equal(t, uint64(987654321), st.StartTicks, comm)
	}
	for _, bad := range []string{"", "123 codex S 1", "1 (x) S 1 2 3", "1 (x) S 1 notanumber " + strings.Repeat("0 ", 30)} {
		_, err := parseProcStat([]byte(bad))
		assert.Error(t, err, bad)
	}
	ticks, err := ProcStartTicks(os.Getpid())
	require.NoError(t, err)
	assert.NotZero(t, ticks)
}

func TestR1_EnvIsExactlyTheAllowList(t *testing.T) {
	t.Setenv("TETHER_TEST_MUST_NOT_LEAK", "secret-value")
	dump := filepath.Join(t.TempDir(), "env.json")
	cfg := stubConfig(t, "echo", stubEnvDumpEnv+"="+dump, "ALLOWED_ONE=1", "HOME=/nonexistent-home")
	s, _ := startSession(t, cfg)
	_ = s
	var got struct {
		Env []string `json:"env"`
		Cwd string   `json:"cwd"`
	}
	b, err := os.ReadFile(dump)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, cfg.Env, got.Env, "environment is exactly Config.Env")
	wantDir, err := filepath.EvalSymlinks(cfg.Dir)
	require.NoError(t, err)
	gotDir, err := filepath.EvalSymlinks(got.Cwd)
	require.NoError(t, err)
	assert.Equal(t, wantDir, gotDir)
}

func TestR1_NilEnvMeansEmptyEnvironment(t *testing.T) {
	t.Setenv("TETHER_TEST_MUST_NOT_LEAK", "x")
	dump := filepath.Join(t.TempDir(), "export.txt")
	cfg := Config{
		Command: "/bin/sh",
		// $0 is the dump path; the shell then never answers initialize.
		Args:           []string{"-c", `export -p > "$0"; exec sleep 30`, dump},
		Env:            nil,
		Dir:            t.TempDir(),
		StartupTimeout: 300 * time.Millisecond,
	}
	_, err := Start(context.Background(), cfg, nil)
	require.Equal(t, failure.ProviderInitializeTimeout, CodeOf(err))
	b, err := os.ReadFile(dump)
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// dash exports PWD by itself; nothing else may be there.
		assert.True(t, strings.HasPrefix(line, "export PWD="), "unexpected variable: %q", line)
	}
}

func TestR1_CloseKillsProcessGroupIncludingGrandchild(t *testing.T) {
	t.Parallel()
	childFile := filepath.Join(t.TempDir(), "child.pid")
	s, _ := startSession(t, stubConfig(t, "group", stubChildEnv+"="+childFile))
	info := s.Process()

	var child int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(childFile)
		if err != nil || len(b) == 0 {
			return false
		}
		child, err = strconv.Atoi(string(b))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	childStat, err := readProcStat(child)
	require.NoError(t, err)
	assert.Equal(t, info.PGID, childStat.PGRP, "grandchild is in the provider's group")
	assert.True(t, alive(child))

	// Both ignore stdin EOF and SIGTERM: only SIGKILL to the group ends them.
	start := time.Now()
	require.NoError(t, s.Close(context.Background(), 150*time.Millisecond))
	assert.Less(t, time.Since(start), 8*time.Second)

	assert.False(t, procgroup.Alive(info.PGID), "process group is gone")
	assert.False(t, alive(child), "grandchild is gone")
	assert.False(t, alive(info.PID), "leader is gone")
	ps := s.ProcessState()
	require.NotNil(t, ps, "leader was reaped")
	ws := ps.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled())
	assert.Equal(t, syscall.SIGKILL, ws.Signal())
	assert.Equal(t, failure.ProviderClosed, CodeOf(s.ExitErr()))
	select {
	case <-s.Exited():
	default:
		t.Fatal("Exited not closed after Close")
	}
	// Idempotent.
	require.NoError(t, s.Close(context.Background(), time.Second))
}

func TestR1_CloseCooperativeExitOnStdinEOF(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "echo"))
	start := time.Now()
	require.NoError(t, s.Close(context.Background(), 10*time.Second))
	assert.Less(t, time.Since(start), 5*time.Second, "no TERM/KILL wait when the provider exits on stdin EOF")
	ps := s.ProcessState()
	require.NotNil(t, ps)
	assert.Equal(t, 0, ps.ExitCode())
	err := s.ExitErr()
	assert.Equal(t, failure.ProviderClosed, CodeOf(err))
	assert.Contains(t, err.Error(), "status 0")
}

func TestR1_CloseContextCancelledKillsAtOnce(t *testing.T) {
	t.Parallel()
	childFile := filepath.Join(t.TempDir(), "child.pid")
	s, _ := startSession(t, stubConfig(t, "group", stubChildEnv+"="+childFile))
	require.Eventually(t, func() bool { b, _ := os.ReadFile(childFile); return len(b) > 0 }, 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Close(ctx, time.Hour)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 8*time.Second)
	assert.False(t, procgroup.Alive(s.Process().PGID))
}

func TestR1_ProcessExitMidTurnFailsTurn(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "please [exit]")
	require.NoError(t, err)

	res := waitTurn(t, s)
	assert.Equal(t, turnID, res.TurnID)
	assert.Equal(t, TurnFailed, res.Status)
	assert.Equal(t, failure.ProviderProcessExited, res.ErrorCode)
	waitExited(t, s)
	exitErr := s.ExitErr()
	assert.Equal(t, failure.ProviderProcessExited, CodeOf(exitErr))
	assert.Equal(t, "provider_process_exited: harness process exited with status 3", exitErr.Error())
	assert.True(t, errorsIsCode(exitErr, failure.ProviderProcessExited))

	evs := rec.events()
	last := evs[len(evs)-1]
	assert.Equal(t, "turn.failed", last.Type)
	assert.Equal(t, turnID, last.TurnID)
	assert.Equal(t, PriorityP0, last.Priority)
	assert.Equal(t, map[string]any{"code": failure.ProviderProcessExited, "message": "harness process exited with status 3"}, last.Payload["error"])

	// Calls after the exit fail with the exit cause.
	_, err = s.StartTurn(context.Background(), "again")
	assert.Error(t, err)
	assert.ErrorIs(t, s.Interrupt(context.Background(), turnID), &Error{Code: failure.ProviderProcessExited})
}

func errorsIsCode(err error, code string) bool {
	e, ok := err.(*Error)
	return ok && e.Is(&Error{Code: code})
}

func TestR1_ProcessExitWhileIdle(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "exit_after_init"))
	waitExited(t, s)
	assert.Equal(t, "provider_process_exited: harness process exited with status 7", s.ExitErr().Error())
	assert.Empty(t, rec.ofType("turn.failed"))
	select {
	case r := <-s.TurnDone():
		t.Fatalf("unexpected turn result %+v", r)
	default:
	}
	_, _, err := s.OpenThread(context.Background(), "")
	assert.Equal(t, failure.ProviderProcessExited, CodeOf(err))
}

func TestR1_StdoutClosedWhileRunning(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "close_stdout"))
	waitExited(t, s)
	err := s.ExitErr()
	assert.Equal(t, failure.ProviderStdoutClosed, CodeOf(err))
	// The session terminates the orphaned process on its own.
	pid := s.Process().PID
	assert.Eventually(t, func() bool { return s.ProcessState() != nil && !alive(pid) }, 10*time.Second, 10*time.Millisecond)
}

func TestR1_SpawnFailure(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "echo")
	cfg.Command = filepath.Join(t.TempDir(), "no-such-codex")
	_, err := Start(context.Background(), cfg, nil)
	assert.Equal(t, failure.ProviderSpawnFailed, CodeOf(err))
	cfg.Command = ""
	_, err = Start(context.Background(), cfg, nil)
	assert.Equal(t, failure.ProviderSpawnFailed, CodeOf(err))
}

func TestR1_StderrIsBoundedAndSanitized(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "stderr"))
	require.Eventually(t, func() bool {
		tail := s.StderrTail()
		return len(tail) > 0 && tail[len(tail)-1] == "stderr-done"
	}, 10*time.Second, 10*time.Millisecond)
	tail := s.StderrTail()
	assert.Len(t, tail, stderrRingLines)
	joined := strings.Join(tail, "\n")
	assert.NotContains(t, joined, "abc.def-secret")
	assert.NotContains(t, joined, "sk-secret123456")
	assert.Contains(t, joined, "Bearer [REDACTED]")
	assert.NotContains(t, joined, "\x1b")
	assert.Contains(t, joined, "WARN stderr line 199")
	for _, l := range tail {
		assert.LessOrEqual(t, len(l), stderrLineMax+len(" …[truncated]"))
	}
}

func TestR1_ReadBoundedLinesTruncates(t *testing.T) {
	t.Parallel()
	input := strings.Repeat("y", 10_000) + "\nshort\n" + strings.Repeat("z", 8) + "\r\nlast-no-newline"
	type line struct {
		text      string
		truncated bool
	}
	var got []line
	readBoundedLines(strings.NewReader(input), 8, func(b []byte, tr bool) { got = append(got, line{string(b), tr}) })
	assert.Equal(t, []line{{"yyyyyyyy", true}, {"short", false}, {"zzzzzzzz", false}, {"last-no-", true}}, got)
}

func TestR1_OutputBeforeExitIsDeliveredToSlowConsumer(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s, err := Start(context.Background(), stubConfig(t, "echo"), rec.emit)
	require.NoError(t, err)
	t.Cleanup(func() { closeSession(t, s) })
	openStubThread(t, s)
	rec.delay.Store(int64(40 * time.Millisecond)) // ~13 events: well past the drain window
	turnID, err := s.StartTurn(context.Background(), "finish [then-exit]")
	require.NoError(t, err)
	res := waitTurn(t, s)
	assert.Equal(t, TurnCompleted, res.Status, "the turn completed before the exit")
	assert.Equal(t, turnID, res.TurnID)
	waitExited(t, s)
	assert.Equal(t, "provider_process_exited: harness process exited with status 0", s.ExitErr().Error())
	assert.Equal(t, "turn.completed", rec.events()[len(rec.events())-1].Type)
}
