package gateway

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/procid"
)

// A runner under its company's uid can write provider-host.json in its
// root: a record naming a process of another user (here one of root's, as
// the gateway's own would be) gets no signal; the same record in a root the
// process's user owns does.
func TestT7_AConfinedRunnersOrphanHostRecordCannotMakeTheGatewaySignalAnotherUsersProcess(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runners under their own uid need root")
	}
	victim := exec.Command("sleep", "300")
	require.NoError(t, victim.Start())
	done := make(chan struct{})
	go func() { _ = victim.Wait(); close(done) }()
	t.Cleanup(func() { _ = victim.Process.Kill(); <-done })
	ticks, err := procid.StartTicks(victim.Process.Pid)
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "scope")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "runner"), 0o700))
	rec, err := json.Marshal(map[string]any{"hostPid": victim.Process.Pid, "hostStartTicks": ticks})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "runner", "provider-host.json"), rec, 0o600))
	require.NoError(t, os.Chown(filepath.Join(dir, "runner"), 300300, 300300))

	stopOrphanProviderHost(dir)
	select {
	case <-done:
		t.Fatal("the gateway signalled a process of another user on a confined runner's word")
	default:
	}

	require.NoError(t, os.Chown(filepath.Join(dir, "runner"), 0, 0))
	stopOrphanProviderHost(dir)
	<-done
}
