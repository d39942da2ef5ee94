// Package config is the runner gateway's configuration: every flag of the
// runnergw binary with its TETHER_* environment fallback (pkg/envflag),
// parsed into one typed Config and validated once, before anything
// starts. cmd/runnergw wires the gateway from a validated Config.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/placement"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/workspace"
	"github.com/tether-run/tether/services/runnergw/internal/confine"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

// Config is the gateway's configuration. Register fills the defaults,
// Validate checks it and derives Labels, Providers and the defaults that
// depend on other settings.
type Config struct {
	// Server is the gRPC server's (listen addresses, TLS, logging, …).
	Server *grpcx.Config

	// Runner listeners (SPEC G2): plain WebSocket on loopback, TLS for
	// dial_wss, and the listen_ws ingress.
	RunnerAddr, RunnerConnectURL    string
	RunnerTLSAddr                   string
	RunnerTLSCert, RunnerTLSKey     string
	RunnerPublicURL, RunnerCABundle string
	IngressCompanies, IngressHost   string
	IngressTLSCert, IngressTLSKey   string
	IngressCA                       string
	PingInterval, PingTimeout       time.Duration
	HandshakeTimeout                time.Duration
	SemanticToolTimeout             time.Duration
	StateRoot, WorkspaceRoot        string
	RunnerdPath                     string
	IdleTimeout, ReconnectGrace     time.Duration
	ConnectTimeout                  time.Duration
	RunnerAuthKeyFile               string

	// CodexCommand and CodexArgs launch the codex provider (its historical
	// unpinned profile); CodexHomeTemplate holds codex's launch-only files.
	// The pinned profiles (providerlaunch) have flags of their own.
	CodexCommand          string
	CodexArgs             envflag.List
	CodexHomeTemplate     string
	ProviderHomeTemplates string
	// Providers are the pinned launch profiles (set by Validate).
	Providers     providerlaunch.Set
	providerFlags *providerlaunch.Flags

	BackupAddr, BackupCA string

	// Fleet (SPEC F1): the gateway's id, the grant keys, the registry it
	// announces itself to.
	GatewayID              string
	GrantPublicKeys        string
	RegistryAddrs          string
	AdvertiseAddr          string
	LabelsFlag             string
	Labels                 map[string]string // parsed LabelsFlag (set by Validate)
	Capacity               int
	RegistryTLS            *grpcx.ClientTLS
	DrainWait              time.Duration
	RegistrationSecretFile string

	// Confinement of runners and providers (SPEC T7).
	Confinement       string
	UIDBase, UIDCount int
	BwrapPath         string
	SandboxReadOnly   envflag.List
}

// DefaultStateRoot is $XDG_STATE_HOME/tether/runnergw (~/.local/state
// when unset).
func DefaultStateRoot() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "tether", "runnergw")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "tether", "runnergw")
}

// Register registers the gateway's flags on fs and returns the Config
// fs.Parse fills in.
func Register(fs *flag.FlagSet) *Config {
	c := &Config{Server: grpcx.RegisterFlags(fs, "runnergw", "127.0.0.1:7401", "127.0.0.1:9401")}
	// SPEC S2: over mTLS only executors may call a gateway.
	c.Server.AllowedPeers = []string{identity.Executor}
	registerRunners(fs, c)
	registerLaunch(fs, c)
	registerFleet(fs, c)
	registerConfinement(fs, c)
	return c
}

// registerRunners registers the runner listeners' flags.
func registerRunners(fs *flag.FlagSet, c *Config) {
	envflag.StringVar(fs, &c.RunnerAddr, "runner-addr", "", "127.0.0.1:7411", "plain WebSocket listener for local runners (dial_ws_loopback; loopback only)")
	envflag.StringVar(fs, &c.RunnerConnectURL, "runner-connect-url", "", "", "ws:// URL launched dial_ws_loopback runners dial (default ws://<runner-addr>"+gateway.ConnectPath+"; loopback only)")
	envflag.StringVar(fs, &c.RunnerTLSAddr, "runner-tls-addr", "", "127.0.0.1:7412", "TLS WebSocket listener for dial_wss runners (served only with -runner-tls-cert/-runner-tls-key)")
	envflag.StringVar(fs, &c.RunnerTLSCert, "runner-tls-cert", "", "", "PEM certificate (chain) of the TLS runner listener")
	envflag.StringVar(fs, &c.RunnerTLSKey, "runner-tls-key", "", "", "PEM private key of the TLS runner listener")
	envflag.StringVar(fs, &c.RunnerPublicURL, "runner-public-url", "", "", "wss:// URL launched dial_wss runners dial (default wss://<runner-tls-addr>"+gateway.ConnectPath+")")
	envflag.StringVar(fs, &c.RunnerCABundle, "runner-ca-bundle", "", "", "PEM CA bundle handed to dial_wss runners (--ca-bundle-path) to trust a privately issued gateway certificate")
	envflag.StringVar(fs, &c.IngressCompanies, "runner-ingress-companies", "", "", "companies whose ingress-authorised runs may use listen_ws (comma separated; * = all; empty = listen_ws off)")
	envflag.StringVar(fs, &c.IngressHost, "runner-ingress-host", "", "127.0.0.1", "address launched listen_ws runners listen on and the gateway dials")
	envflag.StringVar(fs, &c.IngressTLSCert, "runner-ingress-tls-cert", "", "", "PEM certificate handed to listen_ws runners: their listener serves TLS and the gateway dials wss://")
	envflag.StringVar(fs, &c.IngressTLSKey, "runner-ingress-tls-key", "", "", "PEM private key (mode 0600) for -runner-ingress-tls-cert")
	envflag.StringVar(fs, &c.IngressCA, "runner-ingress-ca", "", "", "PEM CA bundle the gateway trusts for runner listeners (default: system roots)")
	envflag.DurationVar(fs, &c.PingInterval, "runner-ping-interval", "", 10*time.Second, "how often each runner connection is pinged")
	envflag.DurationVar(fs, &c.PingTimeout, "runner-ping-timeout", "", 30*time.Second, "close a runner connection without a pong for this long")
	envflag.DurationVar(fs, &c.HandshakeTimeout, "runner-handshake-timeout", "", prp.DefaultHandshakeTimeout,
		"a runner connection that has not proven its credential this long after it opened gets a Goodbye runner_handshake_timeout and is closed")
	envflag.DurationVar(fs, &c.SemanticToolTimeout, "semantic-tool-timeout", "", 0, "how long a dynamic tool call waits for its result before runnerd answers it failed (semantic_tool_timeout); 0: runnerd's default (10m)")
}

// registerLaunch registers how runners and providers are launched.
func registerLaunch(fs *flag.FlagSet, c *Config) {
	envflag.StringVar(fs, &c.StateRoot, "state-root", "", DefaultStateRoot(), "directory for runner state, one subdirectory per session scope")
	envflag.StringVar(fs, &c.WorkspaceRoot, "workspace-root", "", workspace.DefaultRoot, "a run's workspace.cwd must resolve inside <this>/<company_id> (created 0700 on first use), or the run fails with workspace_outside_root (SPEC T6; the same as the executors' -workspace-root)")
	envflag.StringVar(fs, &c.RunnerdPath, "runnerd-path", "", "", "runnerd binary (default: next to this binary, then PATH)")
	envflag.StringVar(fs, &c.CodexCommand, "codex-command", "", "codex", "provider command runnerd launches (the codex native binary, or fake-codex-app-server)")
	envflag.StringVar(fs, &c.CodexHomeTemplate, "codex-home-template", "", "", "directory whose auth.json and config.toml (mode 0600) are copied into each scope's codex-home before its runner is launched (they never travel in backups)")
	envflag.StringVar(fs, &c.ProviderHomeTemplates, "provider-home-templates", "", "", "directory of provider home templates per company: <dir>/<company_id>/ holds that company's codex auth.json and config.toml (mode 0600) and <dir>/<company_id>/<provider>/ a pinned provider's launch-only files; <dir>/_default/ serves companies without their own; copied into each scope before its runner is launched (SPEC T3; never backed up)")
	c.providerFlags = providerlaunch.RegisterFlags(fs)
	fs.Var(&c.CodexArgs, "codex-arg", "argument for the provider command (repeatable; env TETHER_CODEX_ARGS, space separated)")
	envflag.DurationVar(fs, &c.IdleTimeout, "idle-timeout", "", 10*time.Minute, "how long a warm runner lives without work")
	envflag.DurationVar(fs, &c.ReconnectGrace, "reconnect-grace", "", 2*time.Minute, "how long a runner keeps reconnecting before it gives up")
	envflag.DurationVar(fs, &c.ConnectTimeout, "connect-timeout", "", 20*time.Second, "how long an Attach waits for its runner to connect")
	envflag.StringVar(fs, &c.BackupAddr, "backup-addr", "", "127.0.0.1:7402", "backup verifier: verified suspensions upload their checkpoints to it, restores verify their stamps with it (empty: off)")
	envflag.StringVar(fs, &c.BackupCA, "backup-ca", "", "", "PEM CA bundle for TLS to the backup verifier (needed off loopback); the gateway presents its -tls-cert as its client identity")
	envflag.StringVar(fs, &c.RunnerAuthKeyFile, "runner-auth-key-file", "", "", "HMAC key for runner credentials (default <state-root>/gateway.key, created 0600)")
}

// registerFleet registers the gateway's place in the fleet.
func registerFleet(fs *flag.FlagSet, c *Config) {
	envflag.StringVar(fs, &c.GatewayID, "gateway-id", "", "runnergw", "this gateway's id: the audience every executor grant must name")
	envflag.StringVar(fs, &c.GrantPublicKeys, "grant-public-keys", "", "", "the executor fleet's Ed25519 grant public keys (PEM files, comma separated; more than one while keys rotate); every call needs a grant signed by one of them (required)")
	envflag.StringVar(fs, &c.RegistryAddrs, "registry-addr", "", "", "executor replicas (comma separated) this gateway announces itself to and heartbeats (SPEC F1; empty: no registry, executors dial it by -gateway-addr)")
	envflag.StringVar(fs, &c.AdvertiseAddr, "advertise-addr", "", "", "the address executors dial this gateway at, as announced to the registry (default: -grpc-addr)")
	envflag.StringVar(fs, &c.LabelsFlag, "labels", "", "", "labels placements select this gateway by, e.g. zone=a,gpu=false")
	envflag.IntVar(fs, &c.Capacity, "capacity", "", 100, "session scopes this gateway holds at most (announced to the registry; must be at least 1)")
	c.RegistryTLS = grpcx.RegisterClientTLSFlags(fs, "registry", "the executors (the gateway registry)")
	envflag.DurationVar(fs, &c.DrainWait, "drain-wait", "", 0, "with a registry: at SIGTERM announce this gateway draining and keep serving until the executors have moved every session scope it holds (idle ones at once, busy ones when their run ends) or this long has passed, then stop (SPEC D4; Kubernetes: below terminationGracePeriodSeconds); 0: stop at once, announcing draining once")
	envflag.StringVar(fs, &c.RegistrationSecretFile, "registration-secret-file", "", identity.DefaultRegistrationSecretFile(), "the registration secret (SPEC T5) this gateway proves to the registry when it presents no client certificate (a 0600 key file, created when missing; the executors' -registration-secret-file)")
}

// registerConfinement registers how launched runners are confined.
func registerConfinement(fs *flag.FlagSet, c *Config) {
	envflag.StringVar(fs, &c.Confinement, "runner-confinement", "", string(confine.Auto), "how launched runners and providers are confined (SPEC T7): auto (off loopback the strongest available: uid+bwrap as root, uid as root without bubblewrap, bwrap unprivileged, else refuse to start; on loopback none), uid (each company's runners under a uid of their own; needs root), bwrap (providers in a bubblewrap namespace sandbox), uid+bwrap, or none (unsafe: a provider can read the gateway's keys and other companies' files)")
	envflag.IntVar(fs, &c.UIDBase, "runner-uid-base", "", 200000, "first uid (and gid) of the range companies' runners get a uid of their own from (uid confinement); each company gets the lowest free one, recorded in <state-root>/"+confine.UIDFile)
	envflag.IntVar(fs, &c.UIDCount, "runner-uid-count", "", 50000, "size of the -runner-uid-base range (the companies one gateway can hold)")
	envflag.StringVar(fs, &c.BwrapPath, "bwrap-path", "", "", "bubblewrap binary (default: bwrap on PATH)")
	fs.Var(&c.SandboxReadOnly, "runner-sandbox-ro-bind", "a path bound read-only into every provider sandbox besides the system directories, the provider binary, the scope root and the workspace (repeatable)")
}

// Load parses args (flags, then TETHER_* fallbacks) into a Config and
// validates it.
func Load(args []string) (*Config, error) {
	fs := flag.NewFlagSet("runnergw", flag.ExitOnError)
	c := Register(fs)
	if err := envflag.Parse(fs, args); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks the configuration and derives Labels, Providers,
// CodexArgs (TETHER_CODEX_ARGS when no -codex-arg is given) and the
// runner key file's default.
func (c *Config) Validate() error {
	labels, err := placement.ParseLabels(c.LabelsFlag)
	if err != nil {
		return fmt.Errorf("-labels: %w", err)
	}
	c.Labels = labels
	if c.RegistryAddrs != "" && c.Capacity <= 0 {
		return fmt.Errorf("-capacity %d: a gateway holds at least 1 session (gateway_capacity_invalid)", c.Capacity)
	}
	if len(c.CodexArgs) == 0 {
		if v := os.Getenv("TETHER_CODEX_ARGS"); v != "" {
			c.CodexArgs = strings.Fields(v)
		}
	}
	if c.providerFlags != nil {
		if c.Providers, err = c.providerFlags.Profiles(); err != nil {
			return err
		}
	}
	if !grpcx.IsLoopbackAddr(c.RunnerAddr) {
		return fmt.Errorf("-runner-addr %s: plain runner connections are accepted on loopback only; use -runner-tls-addr with -runner-tls-cert/-runner-tls-key off loopback (dial_wss)", c.RunnerAddr)
	}
	if err := gateway.CheckCodexHomeTemplate(c.CodexHomeTemplate); err != nil {
		return err
	}
	if err := gateway.CheckProviderHomeTemplates(c.ProviderHomeTemplates); err != nil {
		return err
	}
	if (c.RunnerTLSCert == "") != (c.RunnerTLSKey == "") {
		return errors.New("-runner-tls-cert and -runner-tls-key go together")
	}
	if (c.IngressTLSCert == "") != (c.IngressTLSKey == "") {
		return errors.New("-runner-ingress-tls-cert and -runner-ingress-tls-key go together")
	}
	if c.RunnerAuthKeyFile == "" {
		c.RunnerAuthKeyFile = filepath.Join(c.StateRoot, "gateway.key")
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.Server.GRPCAddr
	}
	return nil
}
