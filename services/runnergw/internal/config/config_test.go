package config

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// parse registers the gateway's flags on a fresh set and parses base
// (the settings Validate reads, given so that the environment does not
// leak in) then args.
func parse(t *testing.T, args ...string) *Config {
	t.Helper()
	fs := flag.NewFlagSet("runnergw", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Register(fs)
	base := []string{"-grpc-addr", "127.0.0.1:7401", "-runner-addr", "127.0.0.1:7411", "-state-root", "/state", "-labels", "",
		"-capacity", "100", "-registry-addr", "", "-advertise-addr", "", "-runner-auth-key-file", "", "-codex-home-template", "",
		"-provider-home-templates", "", "-runner-tls-cert", "", "-runner-tls-key", "", "-runner-ingress-tls-cert", "", "-runner-ingress-tls-key", "",
		"-codex-arg", "--listen"}
	require.NoError(t, fs.Parse(append(base, args...)))
	return c
}

func TestD5_TheGatewaysConfigurationIsValidatedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		err   string
		check func(t *testing.T, c *Config)
	}{
		{name: "valid; defaults derived from other settings", check: func(t *testing.T, c *Config) {
			require.Equal(t, "/state/gateway.key", c.RunnerAuthKeyFile)
			require.Equal(t, "127.0.0.1:7401", c.AdvertiseAddr)
			require.Empty(t, c.Providers)
			require.Equal(t, []string{"--listen"}, []string(c.CodexArgs))
		}},
		{name: "labels are parsed", args: []string{"-labels", "zone=a,gpu=false"}, check: func(t *testing.T, c *Config) {
			require.Equal(t, map[string]string{"zone": "a", "gpu": "false"}, c.Labels)
		}},
		{name: "a pinned profile is built", args: []string{"-opencode-command", "/bin/opencode", "-opencode-arg", "serve"}, check: func(t *testing.T, c *Config) {
			require.Equal(t, "/bin/opencode", c.Providers["opencode"].Command)
			require.Equal(t, []string{"serve"}, c.Providers["opencode"].Args)
		}},
		{name: "no capacity without a registry is not checked", args: []string{"-capacity", "0"}},
		{name: "bad labels", args: []string{"-labels", "zone"}, err: "-labels:"},
		{name: "no capacity with a registry", args: []string{"-registry-addr", "127.0.0.1:7400", "-capacity", "0"}, err: "gateway_capacity_invalid"},
		{name: "plain runner listener off loopback", args: []string{"-runner-addr", "0.0.0.0:7411"}, err: "plain runner connections are accepted on loopback only"},
		{name: "a runner TLS certificate without its key", args: []string{"-runner-tls-cert", "/c.pem"}, err: "-runner-tls-cert and -runner-tls-key go together"},
		{name: "an ingress key without its certificate", args: []string{"-runner-ingress-tls-key", "/k.pem"}, err: "-runner-ingress-tls-cert and -runner-ingress-tls-key go together"},
		{name: "a profile's argument without its command", args: []string{"-opencode-arg", "serve"}, err: "need -opencode-command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := parse(t, tc.args...)
			err := c.Validate()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

// Without -codex-arg, TETHER_CODEX_ARGS gives the codex arguments, space
// separated.
func TestD5_CodexArgumentsFallBackToTheirEnvironmentVariable(t *testing.T) {
	t.Setenv("TETHER_CODEX_ARGS", "app-server --verbose")
	fs := flag.NewFlagSet("runnergw", flag.ContinueOnError)
	c := Register(fs)
	require.NoError(t, fs.Parse([]string{"-runner-addr", "127.0.0.1:0", "-labels", "", "-registry-addr", "", "-codex-home-template", "", "-provider-home-templates", "",
		"-runner-tls-cert", "", "-runner-tls-key", "", "-runner-ingress-tls-cert", "", "-runner-ingress-tls-key", ""}))
	require.NoError(t, c.Validate())
	require.Equal(t, []string{"app-server", "--verbose"}, []string(c.CodexArgs))
}
