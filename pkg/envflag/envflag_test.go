package envflag

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEnvFallbacksAndErrors(t *testing.T) {
	t.Setenv("TETHER_WIDGETS", "12")
	t.Setenv("TETHER_CUSTOM_NAME", "custom")
	t.Setenv("TETHER_WAIT", "soon")
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	widgets := Int(fs, "widgets", "", 1, "how many")
	name := String(fs, "name", "TETHER_CUSTOM_NAME", "def", "a name")
	on := Bool(fs, "on", "", false, "switch")
	wait := Duration(fs, "wait", "", time.Second, "wait")
	err := Parse(fs, []string{"-on"})
	require.ErrorContains(t, err, "TETHER_WAIT")
	require.NoError(t, fs.Parse([]string{"-on"}))
	require.Equal(t, 12, *widgets)
	require.Equal(t, "custom", *name)
	require.True(t, *on)
	require.Equal(t, time.Second, *wait, "an unparsable env value leaves the default")
	require.Contains(t, fs.Lookup("widgets").Usage, "(env TETHER_WIDGETS)")
	require.Equal(t, "TETHER_GRPC_ADDR", EnvName("grpc-addr"))
}

// A renamed flag's old name still sets it, also repeatable and boolean
// ones, and Deprecated names each old flag given once.
func TestAliasSetsTheCurrentFlagAndIsReported(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	cmd := fs.String("provider-command", "", "the command")
	var args List
	fs.Var(&args, "provider-arg", "an argument")
	dry := fs.Bool("dry-run", false, "dry")
	Alias(fs, "codex-command", "provider-command")
	Alias(fs, "codex-arg", "provider-arg")
	Alias(fs, "dry", "dry-run")
	require.Empty(t, Deprecated(fs))
	require.NoError(t, Parse(fs, []string{"-codex-command", "fake", "-codex-arg", "a", "-provider-arg", "b", "-codex-arg", "c", "-dry"}))
	require.Equal(t, "fake", *cmd)
	require.Equal(t, List{"a", "b", "c"}, args)
	require.True(t, *dry)
	require.Equal(t, []string{
		"-codex-command is deprecated and will be removed in the next release; use -provider-command",
		"-codex-arg is deprecated and will be removed in the next release; use -provider-arg",
		"-dry is deprecated and will be removed in the next release; use -dry-run",
	}, Deprecated(fs))
	require.Contains(t, fs.Lookup("codex-arg").Usage, "deprecated alias of -provider-arg")
}
