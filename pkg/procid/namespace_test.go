package procid

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF5_ProofOfDeathNeedsTheSameBootAndPIDNamespace(t *testing.T) {
	self := Self()
	require.NotEmpty(t, self.PIDNamespace)
	require.Regexp(t, `^pid:\[\d+\]$`, self.PIDNamespace)
	require.Equal(t, os.Getpid(), self.PID)
	ticks, err := StartTicks(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, ticks, self.StartTicks)
	require.False(t, ProvablyDead(self), "a live process is not dead")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	gone := self
	gone.PID = cmd.Process.Pid
	require.True(t, ProvablyDead(gone), "an exited pid of this namespace is dead")

	for name, id := range map[string]Identity{
		"another PID namespace": {BootID: self.BootID, PIDNamespace: "pid:[1]", PID: gone.PID, StartTicks: gone.StartTicks},
		"no namespace recorded": {BootID: self.BootID, PID: gone.PID, StartTicks: gone.StartTicks},
		"another boot":          {BootID: "another-boot", PIDNamespace: self.PIDNamespace, PID: gone.PID},
	} {
		require.False(t, ProvablyDead(id), name)
	}
}
