package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/scope"
)

// A pinned provider whose launch profile is missing, unpinned or does not
// match the bytes on disk is refused with
// runner_remote_provider_artifact_incompatible before the attempt is
// fenced or anything is launched (no scope root appears).
func TestR10_GatewayRefusesAnUnconfiguredUnpinnedOrMismatchingProviderBeforeLaunch(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "opencode")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho 1.18.17\n"), 0o755))
	good, err := providerlaunch.FileSHA256(bin)
	require.NoError(t, err)
	wrong := "0000000000000000000000000000000000000000000000000000000000000000"
	pins := func(path, sum string) []providerlaunch.Pin { return []providerlaunch.Pin{{Path: path, SHA256: sum}} }
	for name, c := range map[string]struct {
		profile providerlaunch.Profile
		want    string
	}{
		"not configured":   {providerlaunch.Profile{}, "is not configured"},
		"no version":       {providerlaunch.Profile{Command: bin, Pins: pins(bin, good)}, "is unpinned"},
		"other version":    {providerlaunch.Profile{Command: bin, Version: "1.18.16", Pins: pins(bin, good)}, "is not the pinned 1.18.17"},
		"no digest":        {providerlaunch.Profile{Command: bin, Version: "1.18.17"}, "-opencode-sha256 is required"},
		"digest mismatch":  {providerlaunch.Profile{Command: bin, Version: "1.18.17", Pins: pins(bin, wrong)}, "digest mismatch"},
		"pinned file gone": {providerlaunch.Profile{Command: bin, Version: "1.18.17", Pins: pins(bin+".gone", good)}, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rl := newRelay(t, func(cfg *Config) {
				cfg.Providers = providerlaunch.Set{}
				if c.profile.Command != "" {
					c.profile.Name = providerlaunch.OpenCode
					cfg.Providers[providerlaunch.OpenCode] = c.profile
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			in := testInput("opencode-refused", "acme", "x")
			in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
			_, _, err := rl.attach(ctx, "run-opencode-refused", nil, in)
			require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err), "%v", err)
			require.ErrorContains(t, err, c.want)
			_, statErr := os.Stat(filepath.Join(rl.cfg.StateRoot, scope.Of(in)))
			require.True(t, errors.Is(statErr, os.ErrNotExist), "nothing was launched")
		})
	}
}

// openCodeProfile is the pinned profile of the fake OpenCode server.
func openCodeProfile(t *testing.T, args ...string) providerlaunch.Profile {
	t.Helper()
	bin := filepath.Join(binDir, "fake-opencode")
	sum, err := providerlaunch.FileSHA256(bin)
	require.NoError(t, err)
	return providerlaunch.Profile{Name: providerlaunch.OpenCode, Command: bin, Args: args, Version: providerlaunch.Versions[providerlaunch.OpenCode],
		Pins: []providerlaunch.Pin{{Path: bin, SHA256: sum}}}
}

// An OpenCode scope is checkpointed with the B2 profile opencode (runner,
// opencode without its launch-only entries and any auth.json) and
// restored into a new runner whose new server continues the same OpenCode
// session with its history.
func TestR10_GatewaySuspendsAndRestoresAnOpenCodeScope(t *testing.T) {
	t.Parallel()
	var fv *fakeVerifier
	rl := newRelay(t, func(c *Config) {
		var client backupv1.BackupVerifierClient
		fv, client = startFakeVerifier(t)
		c.Backup = client
		c.Providers = providerlaunch.Set{providerlaunch.OpenCode: openCodeProfile(t)}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("opencode-suspend", "acme", "first words")
	in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
	sc := scope.Of(in)
	stateDir := filepath.Join(rl.cfg.StateRoot, sc)
	opened, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	home := filepath.Join(stateDir, "opencode")
	require.NoError(t, os.WriteFile(filepath.Join(home, "config", "opencode", "opencode.json"), []byte(`{"provider":{"x":{"options":{"apiKey":"secret"}}}}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(home, "data", "opencode", "auth.json"), []byte(`{"token":"secret"}`), 0o600))

	resp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetProviderThreadId())
	fv.mu.Lock()
	h := fv.headers[0]
	names := tarNames(t, fv.archives[resp.GetCheckpoint().GetCheckpointId()])
	fv.mu.Unlock()
	require.Equal(t, []string{"runner", "opencode"}, h.GetDirectories())
	require.Equal(t, "opencode_server", h.GetExecution().GetDriverKind())
	require.True(t, names["opencode/data/opencode/fake-opencode.json"], "%v", names)
	require.True(t, names["runner/runner-state.json"], "%v", names)
	for n := range names {
		require.False(t, strings.HasPrefix(n, "opencode/config/") || strings.HasPrefix(n, "opencode/cache/"), "%s travelled", n)
		require.NotContains(t, []string{"opencode/server.json", "opencode/tether.json", "opencode/serve.log", "opencode/data/opencode/auth.json"}, n)
	}

	rl.restoreAndContinue(ctx, t, stateDir, in, opened, resp)
	require.NoFileExists(t, filepath.Join(stateDir, "opencode", "data", "opencode", "auth.json"))
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
