package dispatch

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestE7_ControllerDeathIsProvenOnlyOnThisHost(t *testing.T) {
	self := SelfController()
	require.NotZero(t, self.StartTicks)
	require.False(t, ControllerDead(self), "a live process is not dead")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	gone := store.Controller{BootID: self.BootID, PID: cmd.Process.Pid, StartTicks: 1}
	require.True(t, ControllerDead(gone), "an exited pid is dead")

	reused := self
	reused.StartTicks++
	require.True(t, ControllerDead(reused), "the same pid with another start time is another process")

	other := gone
	other.BootID = "another-boot"
	require.False(t, ControllerDead(other), "another host's process cannot be proven dead from here")
	require.False(t, ControllerDead(store.Controller{BootID: self.BootID}), "no pid recorded")
	_ = os.Getpid()
}
