// Package config is the backup verifier's configuration: every flag of the
// backup-verifier binary with its TETHER_* environment fallback
// (pkg/envflag), parsed into one typed Config and validated once, before
// anything starts. cmd/backup-verifier wires the service from it.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
)

// Config is the backup verifier's configuration.
type Config struct {
	// Server is the gRPC server's (listen addresses, TLS, logging, …).
	Server *grpcx.Config

	// StampKeyFile is the HMAC key signing stamps (created when missing).
	StampKeyFile string
	// DatabaseURL holds checkpoint metadata; empty disables checkpoints.
	DatabaseURL string
	Migrate     bool
	// BlobURL is the archives' blob store (gocloud.dev/blob URL).
	BlobURL    string
	StagingDir string
	// Limits bound an archive (0: the archive package's default).
	Limits archive.Limits
	// PackRootsFlag is -provider-pack-root; PackRoots the cleaned
	// directories it names (set by Validate).
	PackRootsFlag string
	PackRoots     []string

	maxArchive, maxExpanded int
}

// Register registers the verifier's flags on fs and returns the Config
// fs.Parse fills in.
func Register(fs *flag.FlagSet) *Config {
	c := &Config{Server: grpcx.RegisterFlags(fs, "backup-verifier", "127.0.0.1:7402", "127.0.0.1:9402")}
	// SPEC S2: over mTLS only gateways and executors may call the verifier.
	c.Server.AllowedPeers = []string{identity.Executor, identity.Gateway}
	home, _ := os.UserHomeDir()
	state := filepath.Join(home, ".local", "state", "tether", "backup")
	envflag.StringVar(fs, &c.StampKeyFile, "stamp-key-file", "", filepath.Join(state, "stamp.key"),
		"HMAC key signing backup stamps (created 0600 when missing)")
	envflag.StringVar(fs, &c.DatabaseURL, "database-url", "", "",
		"PostgreSQL URL for checkpoint metadata (schema backup); empty: checkpoints disabled")
	envflag.BoolVar(fs, &c.Migrate, "migrate", "", true, "apply database migrations at start (under a lock); false: only check that the schema has every migration this verifier needs and refuse to start otherwise (run `backup-verifier migrate` first)")
	envflag.StringVar(fs, &c.BlobURL, "blob-url", "", "file://"+filepath.Join(state, "blobs")+"?create_dir=true",
		"blob store for checkpoint archives (gocloud.dev/blob URL: file:///dir, s3://bucket, gs://bucket)")
	envflag.StringVar(fs, &c.StagingDir, "staging-dir", "", filepath.Join(state, "staging"),
		"private directory where uploads are checked and staged (created 0700; refused when a symlink, another user's or writable by others)")
	envflag.IntVar(fs, &c.maxArchive, "max-archive-bytes", "", archive.DefaultMaxArchiveBytes, "largest archive accepted, as transferred")
	envflag.IntVar(fs, &c.maxExpanded, "max-expanded-bytes", "", archive.DefaultMaxExpandedBytes, "largest total of file sizes an archive may expand to")
	envflag.IntVar(fs, &c.Limits.MaxEntries, "max-entries", "", archive.DefaultMaxEntries, "most entries an archive may hold")
	envflag.StringVar(fs, &c.PackRootsFlag, "provider-pack-root", "",
		"/opt/tether/provider-pack,"+filepath.Join(home, ".local", "share", "tether", "provider-pack"),
		"comma-separated directories VerifyProviderPack may read (a pack root must be one of them or below one)")
	return c
}

// Load parses args (flags, then TETHER_* fallbacks) into a Config and
// validates it.
func Load(args []string) (*Config, error) {
	fs := flag.NewFlagSet("backup-verifier", flag.ExitOnError)
	c := Register(fs)
	if err := envflag.Parse(fs, args); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks the configuration and derives Limits and PackRoots.
func (c *Config) Validate() error {
	if c.StampKeyFile == "" {
		return errors.New("-stamp-key-file is required: the key that signs backup stamps")
	}
	if c.StagingDir == "" {
		return errors.New("-staging-dir is required: uploads are checked there")
	}
	if c.DatabaseURL != "" && c.BlobURL == "" {
		return errors.New("-blob-url is required with -database-url: checkpoint archives are stored there")
	}
	for name, v := range map[string]int{"-max-archive-bytes": c.maxArchive, "-max-expanded-bytes": c.maxExpanded, "-max-entries": c.Limits.MaxEntries} {
		if v < 0 {
			return fmt.Errorf("%s %d: must not be negative (0: the default)", name, v)
		}
	}
	c.Limits.MaxArchiveBytes, c.Limits.MaxExpandedBytes = int64(c.maxArchive), int64(c.maxExpanded)
	c.PackRoots = nil
	for r := range strings.SplitSeq(c.PackRootsFlag, ",") {
		if r = strings.TrimSpace(r); r != "" {
			c.PackRoots = append(c.PackRoots, filepath.Clean(r))
		}
	}
	return nil
}
