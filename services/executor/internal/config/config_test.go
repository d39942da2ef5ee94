package config

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parse registers the executor's flags on a fresh set and parses base
// (every required flag given, so the environment does not leak in) then
// args.
func parse(t *testing.T, args ...string) *Config {
	t.Helper()
	fs := flag.NewFlagSet("executor", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Register(fs)
	base := []string{"-database-url", "postgres://db/x", "-grant-key-file", "/keys/grant.key", "-grpc-addr", "127.0.0.1:7400",
		"-lease-ttl", "30s", "-advertise-addr", "", "-database-watch-conns", "2", "-tls-cert", "", "-tls-key", "", "-tls-client-ca", ""}
	require.NoError(t, fs.Parse(append(base, args...)))
	return c
}

func TestD5_TheExecutorsConfigurationIsValidatedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		err   string
		check func(t *testing.T, c *Config)
	}{
		{name: "valid; -advertise-addr defaults to -grpc-addr", check: func(t *testing.T, c *Config) {
			require.Equal(t, "127.0.0.1:7400", c.AdvertiseAddr)
			require.Equal(t, 30*time.Second, c.LeaseTTL)
		}},
		{name: "an advertised address is kept", args: []string{"-advertise-addr", "10.0.0.7:7400"}, check: func(t *testing.T, c *Config) {
			require.Equal(t, "10.0.0.7:7400", c.AdvertiseAddr)
		}},
		{name: "the watch pool has at least one connection", args: []string{"-database-watch-conns", "0"}, check: func(t *testing.T, c *Config) {
			require.Equal(t, 1, c.DatabaseWatchConns)
		}},
		{name: "no database", args: []string{"-database-url", ""}, err: "-database-url (or TETHER_DATABASE_URL) is required"},
		{name: "no grant key", args: []string{"-grant-key-file", ""}, err: "-grant-key-file (or TETHER_GRANT_KEY_FILE) is required"},
		{name: "lease TTL too short", args: []string{"-lease-ttl", "10ms"}, err: "native_session_lease_ttl_invalid"},
		{name: "lease TTL too long", args: []string{"-lease-ttl", "21m"}, err: "native_session_lease_ttl_invalid"},
		{name: "a TLS certificate without its key", args: []string{"-tls-cert", "/x.pem"}, err: "-tls-cert and -tls-key must be set together"},
		{name: "client CA without a certificate", args: []string{"-tls-client-ca", "/ca.pem"}, err: "-tls-client-ca needs -tls-cert and -tls-key"},
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
			tc.check(t, c)
		})
	}
}
