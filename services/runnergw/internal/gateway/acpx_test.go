package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

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

// restoreAndContinue removes a suspended scope's root, restores it from the
// suspension's checkpoint into a new runner of the same instance, and
// runs one more turn that sees the history ("first words") on the same
// provider thread.
func (rl *relay) restoreAndContinue(ctx context.Context, t *testing.T, stateDir string, in *prpv1.ExecutionInput, opened *gatewayv1.Opened, resp *gatewayv1.SuspendRunnerResponse) {
	t.Helper()
	require.NoError(t, os.RemoveAll(stateDir))
	spec := &gatewayv1.RestoreSpec{CheckpointId: resp.GetCheckpoint().GetCheckpointId(), Stamp: resp.GetStamp(), LeaseId: resp.GetLeaseId()}
	op, err := rl.openWith(ctx, "run-2", in, spec)
	require.NoError(t, err)
	require.Equal(t, opened.GetRunnerInstanceId(), op.GetRunnerInstanceId())
	rl.waitDetached(scope.Of(in))
	in2 := proto.Clone(in).(*prpv1.ExecutionInput)
	in2.Task.Prompt = "[history] and now?"
	_, evs := rl.turn(ctx, "run-3", nil, in2, nil)
	term := evs[len(evs)-1].GetPayload().AsMap()
	require.Equal(t, "succeeded", term["runTerminalState"], "%v", term)
	require.Equal(t, "HISTORY: first words", term["finalMessage"])
	require.Equal(t, resp.GetProviderThreadId(), term["providerThreadId"])
}
