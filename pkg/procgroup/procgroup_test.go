package procgroup

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startGroup starts script under sh as a group leader and returns its pid,
// the first line it prints and a channel closed once it was reaped.
func startGroup(t *testing.T, script string, attr *syscall.SysProcAttr) (int, string, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = attr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, Start(cmd))
	pid := cmd.Process.Pid
	t.Cleanup(func() { Kill(pid) })
	line, _ := bufio.NewReader(out).ReadString('\n')
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return pid, strings.TrimSpace(line), done
}

// gone reports whether pid no longer runs (absent, or a zombie nobody reaped).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	state, _, ok := stat(pid)
	return !ok || state == 'Z' || state == 'X'
}

func TestStopKillsAGroupWithAGrandchildThatIgnoresTERM(t *testing.T) {
	t.Parallel()
	// The leader and its child both ignore SIGTERM; the child is the
	// grandchild of this test.
	pid, line, done := startGroup(t, `trap "" TERM; sh -c 'trap "" TERM; echo $$; exec sleep 300' & wait`, nil)
	grandchild, err := strconv.Atoi(line)
	require.NoError(t, err)
	pgid, err := syscall.Getpgid(grandchild)
	require.NoError(t, err)
	assert.Equal(t, pid, pgid, "the grandchild is in the leader's group")
	require.True(t, Alive(pid))

	killed := Stop(context.Background(), pid, done, 200*time.Millisecond)
	assert.True(t, killed, "TERM was ignored: the group was killed")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("leader not reaped after SIGKILL")
	}
	require.Eventually(t, func() bool { return gone(grandchild) && !Alive(pid) }, 10*time.Second, 10*time.Millisecond,
		"no orphan outlives the group")
}

func TestStopEndsAnObedientLeaderWithoutKill(t *testing.T) {
	t.Parallel()
	pid, _, done := startGroup(t, `echo up; exec sleep 300`, nil)
	start := time.Now()
	killed := Stop(context.Background(), pid, done, 10*time.Second)
	assert.False(t, killed)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.False(t, Alive(pid))
}

func TestStopKillsAtOnceWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	pid, _, done := startGroup(t, `trap "" TERM; echo up; while :; do sleep 1; done`, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.True(t, Stop(ctx, pid, done, time.Hour))
	<-done
	require.Eventually(t, func() bool { return !Alive(pid) }, 10*time.Second, 10*time.Millisecond)
}

func TestStartKeepsTheCallersAttributes(t *testing.T) {
	t.Parallel()
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	pid, _, done := startGroup(t, `echo up; exec sleep 300`, attr)
	assert.Equal(t, syscall.SIGTERM, attr.Pdeathsig)
	assert.True(t, attr.Setpgid)
	pgid, err := syscall.Getpgid(pid)
	require.NoError(t, err)
	assert.Equal(t, pid, pgid, "the child leads a group of its own")
	mine, _ := syscall.Getpgid(0)
	assert.NotEqual(t, mine, pgid)
	Kill(pid)
	<-done
}

func TestNoGroupBelowTwo(t *testing.T) {
	t.Parallel()
	assert.False(t, Alive(0))
	assert.False(t, Alive(1))
	assert.False(t, Alive(-5))
	Signal(0, 0) // ignored: would address our own group
	Kill(1)      // ignored: would address init's
}
