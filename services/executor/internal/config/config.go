// Package config is the executor's configuration: every flag of the
// executor binary with its TETHER_* environment fallback (pkg/envflag),
// parsed into one typed Config and validated once, before anything
// starts. cmd/executor wires the service from a validated Config.
package config

import (
	"errors"
	"flag"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/pkg/workspace"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/budget"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/fleet"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
)

// Config is the executor's configuration. The zero value is not valid:
// Register fills the defaults, Validate checks it.
type Config struct {
	// Server is the gRPC server's (listen addresses, TLS, logging, …).
	Server *grpcx.Config

	// DatabaseURL is the PostgreSQL URL (required).
	DatabaseURL string
	// DatabaseMaxConns and DatabaseWatchConns size the main pool and the
	// separate pool WatchRun reads with.
	DatabaseMaxConns, DatabaseWatchConns int
	// Migrate applies migrations at start; false only checks the schema.
	Migrate bool

	// Owner is this replica's lease owner id; AdvertiseAddr where other
	// replicas reach it (default: the gRPC address).
	Owner, AdvertiseAddr string
	LeaseTTL             time.Duration
	RetryDelay           time.Duration
	PollInterval         time.Duration
	MaxActiveRuns        int
	SameHostTakeover     bool
	// PeerTLS dials other executor replicas (calls forwarded to the one
	// driving a run).
	PeerTLS *grpcx.ClientTLS

	// GatewayAddr and GatewayID name the static gateway (SPEC F2);
	// GatewayTLS dials the gateways.
	GatewayAddr, GatewayID string
	GatewayTLS             *grpcx.ClientTLS
	GatewayTTL             time.Duration
	GatewayLostWait        time.Duration
	// GrantKeyFile is the fleet's grant signing key (required); GrantTTL
	// how long a signed grant is valid.
	GrantKeyFile string
	GrantTTL     time.Duration

	// BackupAddr is the backup verifier that deletes checkpoint archives
	// (empty: checkpoints are not pruned); BackupTLS dials it.
	BackupAddr        string
	BackupTLS         *grpcx.ClientTLS
	RetentionInterval time.Duration
	// BudgetInterval is how often the budget sweep runs (SPEC Q2).
	BudgetInterval time.Duration

	IdleSweepInterval  time.Duration
	CheckpointAfter    time.Duration
	DrainSweepInterval time.Duration

	// Auth is who may call (SPEC T1) and the HTTP port (SPEC U3).
	Auth                   authz.Settings
	WorkspaceRoot          string
	RegistrationSecretFile string
	SecretsKeyFile         string
}

// Register registers the executor's flags on fs and returns the Config
// fs.Parse fills in.
func Register(fs *flag.FlagSet) *Config {
	c := &Config{Server: grpcx.RegisterFlags(fs, "executor", "127.0.0.1:7400", "127.0.0.1:9400")}
	envflag.StringVar(fs, &c.DatabaseURL, "database-url", "", "", "PostgreSQL URL (required)")
	envflag.StringVar(fs, &c.GatewayAddr, "gateway-addr", "", "127.0.0.1:7401", "the static runner gateway's gRPC address: scopes are placed on it while no gateway is registered (SPEC F2), and it serves the scopes placed on -gateway-id when that gateway is not registered")
	c.GatewayTLS = grpcx.RegisterClientTLSFlags(fs, "gateway", "the runner gateways")
	envflag.StringVar(fs, &c.Owner, "owner-id", "", dispatch.DefaultOwner(), "this replica's lease owner id")
	envflag.DurationVar(fs, &c.LeaseTTL, "lease-ttl", "", store.DefaultLeaseTTL, "lease TTL (1s..20m); renewed every TTL/3")
	envflag.DurationVar(fs, &c.RetryDelay, "retry-delay", "", 30*time.Second, "delay before retrying a failed attempt (attempts 1 and 2; the third is terminal)")
	envflag.DurationVar(fs, &c.PollInterval, "poll-interval", "", time.Second, "claim poll interval when no notification arrives")
	envflag.IntVar(fs, &c.MaxActiveRuns, "max-active-runs", "", 64, "runs this replica drives at once")
	envflag.StringVar(fs, &c.AdvertiseAddr, "advertise-addr", "", "", "address other replicas use to reach this one (default: -grpc-addr)")
	// Forwarding to the replica that drives a run (e.g. -peer-server-name
	// executor when replicas advertise pod IPs); -peer-ca defaults to
	// -tls-client-ca, the CA that verifies clients.
	c.PeerTLS = grpcx.RegisterClientTLSFlags(fs, "peer", "other executor replicas (calls forwarded to the one driving a run)")
	envflag.BoolVar(fs, &c.SameHostTakeover, "same-host-takeover", "", true, "take over at once a run whose controller on this host is provably dead (else wait for lease expiry)")
	envflag.BoolVar(fs, &c.Migrate, "migrate", "", true, "apply database migrations at start (under a lock; replicas wait for each other); false: only check that the schema has every migration this executor needs and refuse to start otherwise (run `executor migrate` first, e.g. as a Kubernetes Job)")
	envflag.StringVar(fs, &c.GrantKeyFile, "grant-key-file", "", "", "the executor fleet's Ed25519 private key (PEM, mode 0600) that signs a grant for every gateway call (required; `tetherctl certs init DIR` writes grant.key)")
	envflag.StringVar(fs, &c.GatewayID, "gateway-id", "", "runnergw", "the id of the -gateway-addr gateway (its -gateway-id), the audience of the grants signed for it; every scope is placed on it while no gateway is registered")
	envflag.DurationVar(fs, &c.GrantTTL, "grant-ttl", "", grant.DefaultTTL, "how long a signed gateway grant is valid (checked when the call starts)")
	envflag.StringVar(fs, &c.BackupAddr, "backup-addr", "", "", "the backup verifier that deletes checkpoint archives for retention, DeleteRun and PurgeCompany (SPEC L1); empty: checkpoints are not pruned and a deletion that has checkpoints to delete is refused")
	c.BackupTLS = grpcx.RegisterClientTLSFlags(fs, "backup", "the backup verifier")
	registerSweeps(fs, c)
	registerAccess(fs, c)
	return c
}

// registerSweeps registers the pools' and the background loops' flags.
func registerSweeps(fs *flag.FlagSet, c *Config) {
	envflag.DurationVar(fs, &c.RetentionInterval, "retention-interval", "", retention.DefaultInterval, "how often the retention purge runs (on one replica at a time; policies: `executor retention`); 0 turns it off on this replica")
	envflag.DurationVar(fs, &c.BudgetInterval, "budget-interval", "", budget.DefaultInterval, "how often the budget sweep applies each company's monthly budget to its queued and running runs (SPEC Q2: the cancel policy); 0 turns it off on this replica")
	envflag.IntVar(fs, &c.DatabaseMaxConns, "database-max-conns", "", store.DefaultMaxConns(), "connections of the main database pool (leases, event appends, claims, unary calls); default 4 per core, at least 8")
	envflag.IntVar(fs, &c.DatabaseWatchConns, "database-watch-conns", "", 2, "connections of the separate pool WatchRun reads events with (one read per notification per watched run), so watches never take the main pool's connections")
	envflag.DurationVar(fs, &c.GatewayTTL, "gateway-ttl", "", api.DefaultGatewayTTL, "a registered gateway without a heartbeat for this long is lost (SPEC F1); gateways heartbeat every third of it")
	envflag.DurationVar(fs, &c.GatewayLostWait, "gateway-lost-wait", "", fleet.DefaultLostWait, "how long a run waits (queued, waiting_for_gateway) for the lost gateway its session is placed on when no verified checkpoint covers the session's newest turn; past it the run fails with gateway_lost_wait_exceeded (SPEC F7); 0: no bound")
	envflag.DurationVar(fs, &c.IdleSweepInterval, "idle-sweep-interval", "", time.Second, "how often idle warm sessions are looked for (verified suspension after their idle timeout; 0 turns it off)")
	envflag.DurationVar(fs, &c.CheckpointAfter, "checkpoint-after", "", suspend.DefaultCheckpointAfter, "a warm session idle this long after a settled run gets a verified checkpoint, online: its runnerd and provider keep running (SPEC P6), so a lost gateway host loses no turn settled longer ago (SPEC F3); 0: only at the idle timeout (its suspension)")
	envflag.DurationVar(fs, &c.DrainSweepInterval, "drain-sweep-interval", "", time.Second, "how often the idle session scopes of drained gateways are looked for and moved (SPEC F4; 0 turns it off)")
}

// registerAccess registers who may call and the keys and files the
// executor reads.
func registerAccess(fs *flag.FlagSet, c *Config) {
	envflag.StringVar(fs, &c.Auth.HTTPAddr, "http-addr", "", "", "serve the public API (ExecutorService, GatewayRegistry) to browsers and HTTP clients on this address too — Connect (JSON or binary), gRPC-web and gRPC, through the same handlers, authentication and authorization as the gRPC port (SPEC U3; docs/api.md) — and the operator console at /console/ (SPEC U4); empty: off. TLS as the gRPC port (-tls-cert; a client certificate is verified when presented, not required); plaintext off loopback only with -insecure-allow-plaintext")
	envflag.StringVar(fs, &c.Auth.JWKSFile, "auth-jwks", "", "", "JWKS file of the public keys bearer tokens are verified against (SPEC T1; `tetherctl tokens init DIR` writes one); with -tls-client-ca, client certificates naming principals are accepted too. Off loopback one of them is required; on loopback without either every caller is admitted (development mode)")
	envflag.StringVar(fs, &c.Auth.Issuer, "auth-issuer", "", tenancy.DefaultIssuer, "the issuer (iss) bearer tokens must carry")
	envflag.StringVar(fs, &c.Auth.Audience, "auth-audience", "", tenancy.DefaultAudience, "the audience (aud) bearer tokens must carry")
	envflag.StringVar(fs, &c.WorkspaceRoot, "workspace-root", "", workspace.DefaultRoot, "a run's workspace.cwd must lie in <this>/<company_id> (SPEC T6; the same as the gateways' -workspace-root), or the run is refused at submit with workspace_outside_root")
	envflag.StringVar(fs, &c.RegistrationSecretFile, "registration-secret-file", "", identity.DefaultRegistrationSecretFile(), "the registration secret gateways without a runnergw certificate prove when they call RegisterGateway (SPEC T5; a 0600 key file, created when missing, read only without -tls-client-ca); give the gateways the same file")
	envflag.StringVar(fs, &c.SecretsKeyFile, "secrets-key-file", "", filepath.Join(filepath.Dir(identity.DefaultRegistrationSecretFile()), "secrets.key"), "the key (a 0600 key file, created when missing) that seals company secrets in the database (SPEC T3: envelope encryption, a data key per secret version sealed with this key); every executor replica of a fleet needs the same file")
}

// Load parses args (flags, then TETHER_* fallbacks) into a Config and
// validates it.
func Load(args []string) (*Config, error) {
	fs := flag.NewFlagSet("executor", flag.ExitOnError)
	c := Register(fs)
	if err := envflag.Parse(fs, args); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks the configuration and fills the defaults that depend on
// other settings (-advertise-addr defaults to -grpc-addr).
func (c *Config) Validate() error {
	if c.DatabaseURL == "" {
		return errors.New("-database-url (or TETHER_DATABASE_URL) is required")
	}
	if err := store.CheckLeaseTTL(c.LeaseTTL); err != nil {
		return err
	}
	if c.GrantKeyFile == "" {
		return errors.New("-grant-key-file (or TETHER_GRANT_KEY_FILE) is required: the key that signs gateway grants (`tetherctl certs init DIR` writes one)")
	}
	if err := c.Server.CheckTLS(); err != nil {
		return err
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.Server.GRPCAddr
	}
	c.DatabaseWatchConns = max(c.DatabaseWatchConns, 1)
	return nil
}
