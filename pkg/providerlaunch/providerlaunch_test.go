package providerlaunch

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func TestR10_ProfileNameOfAProvider(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p    *prpv1.Provider
		want string
	}{
		{&prpv1.Provider{Kind: "codex"}, Codex},
		{&prpv1.Provider{Kind: "opencode", Agent: "ignored"}, OpenCode},
		{&prpv1.Provider{Kind: "acpx", Agent: "codex"}, ACPXCodex},
		{&prpv1.Provider{Kind: "acpx", Agent: "claude"}, ACPXClaude},
		{&prpv1.Provider{Kind: "acpx", Agent: "pi"}, "acpx-pi"},
		{nil, ""},
	} {
		require.Equal(t, c.want, Name(c.p))
	}
}

func TestR10_ParsePin(t *testing.T) {
	t.Parallel()
	sum := "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
	p, err := ParsePin(sum, "/bin/opencode")
	require.NoError(t, err)
	require.Equal(t, Pin{Path: "/bin/opencode", SHA256: "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"}, p)
	p, err = ParsePin("/x/dist/index.js=sha256:"+sum, "/usr/bin/node")
	require.NoError(t, err)
	require.Equal(t, "/x/dist/index.js", p.Path)
	for _, bad := range []string{"", "abc", "/x=", "/x=sha256:zz" + sum[2:], "=" + sum} {
		_, err := ParsePin(bad, "")
		require.Error(t, err, bad)
	}
}

// The digest is re-read when the file changes (the cache keys on its
// identity and change time).
func TestR10_VerifyChecksTheBytesOnDiskEveryTime(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "opencode")
	require.NoError(t, os.WriteFile(bin, []byte("one"), 0o755))
	sum, err := FileSHA256(bin)
	require.NoError(t, err)
	p := Profile{Name: OpenCode, Command: bin, Version: Versions[OpenCode], Pins: []Pin{{Path: bin, SHA256: sum}}}
	require.NoError(t, p.Verify())
	require.NoError(t, p.Verify())
	require.NoError(t, os.WriteFile(bin, []byte("two"), 0o755))
	err = p.Verify()
	require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err))
	require.ErrorContains(t, err, "digest mismatch")
}

func TestR10_SetForRefusesProvidersWithoutAProfile(t *testing.T) {
	t.Parallel()
	for _, p := range []*prpv1.Provider{{Kind: "acpx", Agent: "pi"}, {Kind: "codex"}, {Kind: "opencode"}} {
		_, err := Set{}.For(p)
		require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err), "%v", p)
	}
}

func TestR10_FlagsBuildPinnedProfiles(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("gw", flag.ContinueOnError)
	f := RegisterFlags(fs)
	sum := "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
	require.NoError(t, fs.Parse([]string{"-opencode-command", "/o/opencode", "-opencode-arg", "serve", "-opencode-version", "1.18.17",
		"-opencode-sha256", sum, "-opencode-sha256", "/o/lib.so=" + sum}))
	s, err := f.Profiles()
	require.NoError(t, err)
	require.Equal(t, Profile{Name: OpenCode, Command: "/o/opencode", Args: []string{"serve"}, Version: "1.18.17",
		Pins: []Pin{{Path: "/o/opencode", SHA256: sum}, {Path: "/o/lib.so", SHA256: sum}}}, s[OpenCode])
	require.NotContains(t, s, ACPXCodex)

	fs = flag.NewFlagSet("gw", flag.ContinueOnError)
	f = RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{"-opencode-sha256", sum}))
	_, err = f.Profiles()
	require.ErrorContains(t, err, "need -opencode-command")
}
