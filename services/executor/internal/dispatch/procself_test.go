package dispatch

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/procid"

	"github.com/tether-run/tether/services/executor/internal/store"
)

func TestE7_ControllerDeathIsProvenOnlyOnThisHost(t *testing.T) {
	t.Parallel()
	self := SelfController()
	require.NotZero(t, self.StartTicks)
	require.False(t, ControllerDead(self), "a live process is not dead")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	gone := self
	gone.PID, gone.StartTicks = cmd.Process.Pid, 1
	require.True(t, ControllerDead(gone), "an exited pid is dead")

	reused := self
	reused.StartTicks++
	require.True(t, ControllerDead(reused), "the same pid with another start time is another process")

	other := gone
	other.BootID = "another-boot"
	require.False(t, ControllerDead(other), "another host's process cannot be proven dead from here")
	require.False(t, ControllerDead(store.Controller{Identity: procid.Identity{BootID: self.BootID, PIDNamespace: self.PIDNamespace}}), "no pid recorded")
	_ = os.Getpid()
}
