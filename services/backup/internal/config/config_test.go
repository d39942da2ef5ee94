package config

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/archive"
)

func parse(t *testing.T, args ...string) *Config {
	t.Helper()
	fs := flag.NewFlagSet("backup-verifier", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Register(fs)
	base := []string{"-stamp-key-file", "/k/stamp.key", "-staging-dir", "/s", "-database-url", "", "-blob-url", "file:///b",
		"-max-archive-bytes", "0", "-max-expanded-bytes", "0", "-max-entries", "0", "-provider-pack-root", " /opt/packs/ ,, /home/u/packs"}
	require.NoError(t, fs.Parse(append(base, args...)))
	return c
}

func TestD5_TheVerifiersConfigurationIsValidatedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		err   string
		check func(t *testing.T, c *Config)
	}{
		{name: "valid; pack roots cleaned, zero limits are the defaults", check: func(t *testing.T, c *Config) {
			require.Equal(t, []string{"/opt/packs", "/home/u/packs"}, c.PackRoots)
			require.Equal(t, archive.DefaultMaxEntries, c.Limits.WithDefaults().MaxEntries)
		}},
		{name: "limits are carried", args: []string{"-max-archive-bytes", "1024", "-max-expanded-bytes", "4096", "-max-entries", "7"}, check: func(t *testing.T, c *Config) {
			require.Equal(t, archive.Limits{MaxArchiveBytes: 1024, MaxExpandedBytes: 4096, MaxEntries: 7}, c.Limits)
		}},
		{name: "with a database", args: []string{"-database-url", "postgres://db/x"}},
		{name: "no stamp key", args: []string{"-stamp-key-file", ""}, err: "-stamp-key-file is required"},
		{name: "no staging directory", args: []string{"-staging-dir", ""}, err: "-staging-dir is required"},
		{name: "a database without a blob store", args: []string{"-database-url", "postgres://db/x", "-blob-url", ""}, err: "-blob-url is required with -database-url"},
		{name: "a negative limit", args: []string{"-max-entries", "-1"}, err: "-max-entries -1: must not be negative"},
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
