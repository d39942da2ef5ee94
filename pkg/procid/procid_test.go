package procid

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProcessIdentitySurvivesPIDReuseChecks(t *testing.T) {
	self := os.Getpid()
	ticks, err := StartTicks(self)
	require.NoError(t, err)
	require.NotZero(t, ticks)
	boot := BootID()
	require.NotEmpty(t, boot)
	require.True(t, Alive(self, ticks, boot))
	require.False(t, Alive(self, ticks+1, boot), "another start time is another process")
	require.False(t, Alive(self, ticks, "another-boot"))
	require.False(t, Dead(self, ticks, boot))
	require.True(t, Dead(self, ticks+1, boot), "the pid was reused")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.False(t, Alive(cmd.Process.Pid, 0, ""))
	require.False(t, Exists(cmd.Process.Pid))
	require.True(t, Exists(self))
	require.True(t, Dead(cmd.Process.Pid, 1, boot))
	require.False(t, Dead(cmd.Process.Pid, 1, "another-boot"), "not provable from another host")
	require.False(t, Dead(0, 0, boot))
}
