// Package config is runnerd's configuration: its flags parsed into one
// typed Config and validated once, before anything starts.
//
// runnerd's flags have no TETHER_* environment fallbacks: the gateway
// launches it with every setting on its command line and an allow-listed
// environment, so nothing in the environment may change a runner's
// configuration. The renamed --codex-command and --codex-arg stay as
// deprecated aliases of --provider-command and --provider-arg for one
// release (pkg/envflag.Alias); Deprecated names the ones given.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
)

// Config is runnerd's configuration.
type Config struct {
	// Runner is the runner's; Load fills ProviderArgs from the repeatable
	// --provider-arg. Ticket, Logger, StartProvider, PathEnv and
	// RunnerVersion are the caller's to set.
	Runner runner.Config

	// BuildMetadata and Version print and exit.
	BuildMetadata, Version bool
	// TicketFD is the inherited descriptor of the bootstrap ticket (-1:
	// the environment's).
	TicketFD     int
	LogFormat    string
	OTLPEndpoint string
	// Deprecated are the warnings of the deprecated aliases given.
	Deprecated []string

	providerArgs envflag.List
	args         []string // positional arguments (none are accepted)
}

// Register registers runnerd's flags on fs; fs.Parse fills the Config.
// providers names the launch profiles this build drives (for the usage).
func Register(fs *flag.FlagSet, providers []string) *Config {
	c := &Config{}
	r := &c.Runner
	fs.BoolVar(&c.BuildMetadata, "build-metadata", false, "print build metadata as JSON and exit")
	fs.IntVar(&c.TicketFD, "bootstrap-ticket-fd", -1, "read the one-use bootstrap ticket from this inherited descriptor (a pipe, or a private file the launcher removes) until EOF, then close it; "+
		"without it the ticket is taken from "+prp.EnvBootstrapTicket+", which stays readable in /proc/<pid>/environ")
	fs.StringVar(&r.ConnectURL, "connect-url", "", "gateway runner endpoint to dial: ws:// to a loopback address (dial_ws_loopback) or wss:// (dial_wss)")
	fs.StringVar(&r.CABundlePath, "ca-bundle-path", "", "dial_wss: private PEM file of extra CA certificates (<= 4 MiB; added to the system roots)")
	fs.StringVar(&r.ListenAddress, "listen-address", "", "listen_ws: IP address to listen on (the gateway dials in)")
	fs.IntVar(&r.ListenPort, "listen-port", 0, "listen_ws: TCP port to listen on")
	fs.StringVar(&r.ListenPath, "listen-path", "", "listen_ws: the only path served; must be /v1/runners/connect/<runner-id>")
	fs.StringVar(&r.ListenTLSCert, "listen-tls-cert", "", "listen_ws: serve TLS with this PEM certificate (chain)")
	fs.StringVar(&r.ListenTLSKey, "listen-tls-key", "", "listen_ws: private PEM key for --listen-tls-cert")
	fs.StringVar(&r.StateDir, "state-dir", "", "durable state directory (absolute)")
	fs.StringVar(&r.RunnerID, "runner-id", "", "runner instance id")
	fs.StringVar(&r.EnvironmentLeaseID, "environment-lease-id", "", "environment lease id")
	fs.StringVar(&r.SessionID, "session-id", "", "normalized session id")
	fs.StringVar(&r.SessionScope, "session-scope", "", "session scope digest (hex)")
	fs.StringVar(&r.Workspace, "workspace", "", "provider working directory (absolute)")
	fs.StringVar(&r.Provider, "provider", providerlaunch.Codex, "launch profile of the provider: "+strings.Join(providers, "|"))
	fs.StringVar(&r.ProviderCommand, "provider-command", "", "provider executable")
	fs.Var(&c.providerArgs, "provider-arg", "provider argument (repeatable)")
	envflag.Alias(fs, "codex-command", "provider-command")
	envflag.Alias(fs, "codex-arg", "provider-arg")
	fs.StringVar(&r.ProviderHomeTemplate, "provider-home-template", "", "directory of launch-only provider files the driver copies into the provider's home (opencode: opencode.json)")
	fs.DurationVar(&r.IdleTimeout, "idle-timeout", 10*time.Minute, "stop after this long without activity")
	fs.DurationVar(&r.ReconnectGrace, "reconnect-grace", 2*time.Minute, "exit 3 after this long without a gateway connection")
	fs.Uint64Var(&r.MaxOutboxBytes, "max-outbox-bytes", runner.DefaultMaxOutboxBytes, "unacknowledged event bytes the durable outbox may hold (16 KiB..512 MiB)")
	fs.Uint64Var(&r.P0ReserveBytes, "p0-reserve-bytes", runner.DefaultP0ReserveBytes, "part of --max-outbox-bytes only P0 events may use (less than half)")
	fs.BoolVar(&r.ProviderHost, "provider-host", true, "run the provider under a provider host so it survives a runnerd crash and a restarted runnerd re-attaches to it")
	fs.DurationVar(&r.ProviderDetachTimeout, "provider-detach-timeout", 2*time.Minute, "how long a provider host keeps a provider without runnerd")
	fs.DurationVar(&r.SemanticToolTimeout, "semantic-tool-timeout", runner.DefaultSemanticToolTimeout, "answer a dynamic tool call failed (semantic_tool_timeout) when no tool.result arrived within this long")
	fs.DurationVar(&r.SilenceTimeout, "gateway-silence-timeout", 60*time.Second, "drop and re-establish a gateway connection on which nothing arrived for this long (the gateway pings)")
	fs.StringVar(&c.LogFormat, "log-format", "json", "log format: json|text")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces over OTLP/gRPC to this endpoint (empty: "+telemetry.EnvEndpoint+" or off)")
	fs.BoolVar(&c.Version, "version", false, "print the build (version, commit, Go) and exit")
	return c
}

// Parse parses args into a Config on a flag set named runnerd whose usage
// and errors go to stderr. It does not validate: -version and
// --build-metadata are answered before validation.
func Parse(args []string, stderr io.Writer, providers []string) (*Config, error) {
	fs := flag.NewFlagSet("runnerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := Register(fs, providers)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.Runner.ProviderArgs = c.providerArgs
	c.Deprecated = envflag.Deprecated(fs)
	c.args = fs.Args()
	return c, nil
}

// Validate checks what runnerd checks before it reads its ticket: no
// positional arguments and a known log format. The runner checks its own
// settings when it starts (runner.Run).
func (c *Config) Validate() error {
	if len(c.args) > 0 {
		return fmt.Errorf("unexpected arguments %q", c.args)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return errors.New("--log-format must be json or text")
	}
	return nil
}

// CheckProvider checks that this build drives the configured launch
// profile (providers are the ones it drives).
func (c *Config) CheckProvider(providers []string) error {
	if !slices.Contains(providers, c.Runner.Provider) {
		return fmt.Errorf("--provider %q: this build drives %s", c.Runner.Provider, strings.Join(providers, ", "))
	}
	return nil
}
