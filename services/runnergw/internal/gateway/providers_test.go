package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
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
