package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/scope"
)

// An ACPX codex scope is checkpointed with the B2 profile acpx (runner,
// acpx without any credential file: codex's auth.json and launch
// config.toml, Claude Code's .credentials.json) and restored into a new
// runner whose new agent process loads the same ACP session (SPEC R11).
func TestR11_GatewaySuspendsAndRestoresAnACPXScope(t *testing.T) {
	t.Parallel()
	var fv *fakeVerifier
	rl := newRelay(t, func(c *Config) {
		var client backupv1.BackupVerifierClient
		fv, client = startFakeVerifier(t)
		c.Backup = client
		bin := filepath.Join(binDir, "fake-acp-agent")
		sum, err := providerlaunch.FileSHA256(bin)
		require.NoError(t, err)
		c.Providers = providerlaunch.Set{providerlaunch.ACPXCodex: {Name: providerlaunch.ACPXCodex, Command: bin, Args: []string{"-flavor", "codex"},
			Version: providerlaunch.Versions[providerlaunch.ACPXCodex], Pins: []providerlaunch.Pin{{Path: bin, SHA256: sum}}}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("acpx-suspend", "acme", "first words")
	in.Provider = &prpv1.Provider{Kind: "acpx", Agent: "codex", PermissionMode: "approve-all"}
	in.Session.DriverKind = "acpx_runtime"
	sc := scope.Of(in)
	stateDir := filepath.Join(rl.cfg.StateRoot, sc)
	opened, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	acpx := filepath.Join(stateDir, "acpx")
	require.NoError(t, os.WriteFile(filepath.Join(acpx, "codex-home", "auth.json"), []byte(`{"OPENAI_API_KEY":"secret"}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(acpx, "codex-home", "config.toml"), []byte("model = \"x\"\n"), 0o600))

	resp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(resp.GetProviderThreadId(), "acpx-"), resp.GetProviderThreadId())
	fv.mu.Lock()
	h := fv.headers[0]
	names := tarNames(t, fv.archives[resp.GetCheckpoint().GetCheckpointId()])
	fv.mu.Unlock()
	require.Equal(t, []string{"runner", "acpx"}, h.GetDirectories())
	require.Equal(t, "acpx_runtime", h.GetExecution().GetDriverKind())
	require.True(t, names["acpx/acp-session.json"], "%v", names)
	require.True(t, names["runner/runner-state.json"], "%v", names)
	for n := range names {
		require.NotContains(t, []string{"acpx/codex-home/auth.json", "acpx/codex-home/config.toml"}, n, "a credential travelled")
	}

	rl.restoreAndContinue(ctx, t, stateDir, in, opened, resp)
	require.NoFileExists(t, filepath.Join(acpx, "codex-home", "auth.json"))
}
