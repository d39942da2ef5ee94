package gateway

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestR1_StoppingAGoneRunnerSignalsNoGroup: Close stops a runnerd's process
// group only while its leader lives; once the leader is known gone its
// group id may belong to a process started since.
func TestR1_StoppingAGoneRunnerSignalsNoGroup(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	// The group's leader lives, but the caller says the runnerd is gone
	// (as for a reaped child whose id was reused): no signal.
	gone := make(chan struct{})
	close(gone)
	stopGroup(cmd.Process.Pid, gone, time.Minute)
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, 0), "the group was not signalled")
	select {
	case <-done:
		t.Fatal("the process was stopped")
	default:
	}

	// A live runnerd's group is stopped.
	stopGroup(cmd.Process.Pid, done, time.Minute)
	<-done
	require.Equal(t, syscall.SIGTERM, cmd.ProcessState.Sys().(syscall.WaitStatus).Signal())
}
