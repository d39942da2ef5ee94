package config

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

var drives = []string{"acpx-claude", "acpx-codex", "codex", "opencode"}

func TestR10_RunnersConfigurationIsValidatedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		parseErr bool
		err      string
		provider string
	}{
		{name: "valid", args: []string{"--provider-command", "/bin/codex", "--log-format", "text"}},
		{name: "an unknown flag", args: []string{"--no-such-flag"}, parseErr: true},
		{name: "positional arguments", args: []string{"--provider-command", "/bin/codex", "extra"}, err: `unexpected arguments ["extra"]`},
		{name: "unknown log format", args: []string{"--log-format", "xml"}, err: "--log-format must be json or text"},
		{name: "a profile this build drives", args: []string{"--provider", "opencode"}},
		{name: "a profile this build does not drive", args: []string{"--provider", "acpx-pi"}, provider: `--provider "acpx-pi": this build drives acpx-claude, acpx-codex, codex, opencode`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse(tc.args, io.Discard, drives)
			if tc.parseErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			if tc.err != "" {
				require.EqualError(t, c.Validate(), tc.err)
				return
			}
			require.NoError(t, c.Validate())
			if tc.provider != "" {
				require.EqualError(t, c.CheckProvider(drives), tc.provider)
				return
			}
			require.NoError(t, c.CheckProvider(drives))
		})
	}
}

// The provider flags are named for any provider; the old codex names stay
// for one release as deprecated aliases that still set them (in the order
// given, mixed with the new ones) and are reported.
func TestR10_TheOldCodexFlagsStillSetTheProviderCommandAndAreReportedDeprecated(t *testing.T) {
	t.Parallel()
	c, err := Parse([]string{"--codex-command", "/bin/fake", "--codex-arg", "app-server", "--provider-arg", "-v", "--codex-arg", "--x"}, io.Discard, drives)
	require.NoError(t, err)
	require.Equal(t, "/bin/fake", c.Runner.ProviderCommand)
	require.Equal(t, []string{"app-server", "-v", "--x"}, c.Runner.ProviderArgs)
	require.Equal(t, []string{
		"-codex-command is deprecated and will be removed in the next release; use -provider-command",
		"-codex-arg is deprecated and will be removed in the next release; use -provider-arg",
	}, c.Deprecated)

	c, err = Parse([]string{"--provider-command", "/bin/fake", "--provider-arg", "app-server"}, io.Discard, drives)
	require.NoError(t, err)
	require.Equal(t, "/bin/fake", c.Runner.ProviderCommand)
	require.Equal(t, []string{"app-server"}, c.Runner.ProviderArgs)
	require.Empty(t, c.Deprecated)
}
