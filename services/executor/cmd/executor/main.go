// Command executor is tether's executor: it owns runs in PostgreSQL, claims
// due runs under fenced leases and drives them through the runner gateway.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/tether-run/tether/pkg/envflag"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/pgstore/migratecli"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/pkg/workspace"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/fleet"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
	"github.com/tether-run/tether/services/executor/internal/watch"
	"github.com/tether-run/tether/services/executor/internal/web"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		return migratecli.Run("executor", os.Args[2:], store.Schema, partitionEventsStep)
	}
	if len(os.Args) > 1 && os.Args[1] == "retention" {
		return retentionCommand(os.Args[2:])
	}
	fs := flag.NewFlagSet("executor", flag.ExitOnError)
	cfg := grpcx.RegisterFlags(fs, "executor", "127.0.0.1:7400", "127.0.0.1:9400")
	dsn := envflag.String(fs, "database-url", "", "", "PostgreSQL URL (required)")
	gwAddr := envflag.String(fs, "gateway-addr", "", "127.0.0.1:7401", "the static runner gateway's gRPC address: scopes are placed on it while no gateway is registered (SPEC F2), and it serves the scopes placed on -gateway-id when that gateway is not registered")
	gwTLS := grpcx.RegisterClientTLSFlags(fs, "gateway", "the runner gateways")
	owner := envflag.String(fs, "owner-id", "", dispatch.DefaultOwner(), "this replica's lease owner id")
	ttl := envflag.Duration(fs, "lease-ttl", "", store.DefaultLeaseTTL, "lease TTL (1s..20m); renewed every TTL/3")
	retryDelay := envflag.Duration(fs, "retry-delay", "", 30*time.Second, "delay before retrying a failed attempt (attempts 1 and 2; the third is terminal)")
	poll := envflag.Duration(fs, "poll-interval", "", time.Second, "claim poll interval when no notification arrives")
	maxActive := envflag.Int(fs, "max-active-runs", "", 64, "runs this replica drives at once")
	advertise := envflag.String(fs, "advertise-addr", "", "", "address other replicas use to reach this one (default: -grpc-addr)")
	// Forwarding to the replica that drives a run (e.g. -peer-server-name
	// executor when replicas advertise pod IPs); -peer-ca defaults to
	// -tls-client-ca, the CA that verifies clients.
	peerTLS := grpcx.RegisterClientTLSFlags(fs, "peer", "other executor replicas (calls forwarded to the one driving a run)")
	sameHost := envflag.Bool(fs, "same-host-takeover", "", true, "take over at once a run whose controller on this host is provably dead (else wait for lease expiry)")
	migrate := envflag.Bool(fs, "migrate", "", true, "apply database migrations at start (under a lock; replicas wait for each other); false: only check that the schema has every migration this executor needs and refuse to start otherwise (run `executor migrate` first, e.g. as a Kubernetes Job)")
	grantKey := envflag.String(fs, "grant-key-file", "", "", "the executor fleet's Ed25519 private key (PEM, mode 0600) that signs a grant for every gateway call (required; `tetherctl certs init DIR` writes grant.key)")
	gatewayID := envflag.String(fs, "gateway-id", "", "runnergw", "the id of the -gateway-addr gateway (its -gateway-id), the audience of the grants signed for it; every scope is placed on it while no gateway is registered")
	grantTTL := envflag.Duration(fs, "grant-ttl", "", grant.DefaultTTL, "how long a signed gateway grant is valid (checked when the call starts)")
	backupAddr := envflag.String(fs, "backup-addr", "", "", "the backup verifier that deletes checkpoint archives for retention, DeleteRun and PurgeCompany (SPEC L1); empty: checkpoints are not pruned and a deletion that has checkpoints to delete is refused")
	backupTLS := grpcx.RegisterClientTLSFlags(fs, "backup", "the backup verifier")
	purgeEvery := envflag.Duration(fs, "retention-interval", "", retention.DefaultInterval, "how often the retention purge runs (on one replica at a time; policies: `executor retention`); 0 turns it off on this replica")
	maxConns := envflag.Int(fs, "database-max-conns", "", store.DefaultMaxConns(), "connections of the main database pool (leases, event appends, claims, unary calls); default 4 per core, at least 8")
	watchConns := envflag.Int(fs, "database-watch-conns", "", 2, "connections of the separate pool WatchRun reads events with (one read per notification per watched run), so watches never take the main pool's connections")
	gatewayTTL := envflag.Duration(fs, "gateway-ttl", "", api.DefaultGatewayTTL, "a registered gateway without a heartbeat for this long is lost (SPEC F1); gateways heartbeat every third of it")
	lostWait := envflag.Duration(fs, "gateway-lost-wait", "", fleet.DefaultLostWait, "how long a run waits (queued, waiting_for_gateway) for the lost gateway its session is placed on when no verified checkpoint covers the session's newest turn; past it the run fails with gateway_lost_wait_exceeded (SPEC F7); 0: no bound")
	idleSweep := envflag.Duration(fs, "idle-sweep-interval", "", time.Second, "how often idle warm sessions are looked for (verified suspension after their idle timeout; 0 turns it off)")
	checkpointAfter := envflag.Duration(fs, "checkpoint-after", "", suspend.DefaultCheckpointAfter, "a warm session idle this long after a settled run gets a verified checkpoint, online: its runnerd and provider keep running (SPEC P6), so a lost gateway host loses no turn settled longer ago (SPEC F3); 0: only at the idle timeout (its suspension)")
	drainSweep := envflag.Duration(fs, "drain-sweep-interval", "", time.Second, "how often the idle session scopes of drained gateways are looked for and moved (SPEC F4; 0 turns it off)")
	var auth authz.Settings
	envflag.StringVar(fs, &auth.HTTPAddr, "http-addr", "", "", "serve the public API (ExecutorService, GatewayRegistry) to browsers and HTTP clients on this address too — Connect (JSON or binary), gRPC-web and gRPC, through the same handlers, authentication and authorization as the gRPC port (SPEC U3; docs/api.md) — and the operator console at /console/ (SPEC U4); empty: off. TLS as the gRPC port (-tls-cert; a client certificate is verified when presented, not required); plaintext off loopback only with -insecure-allow-plaintext")
	envflag.StringVar(fs, &auth.JWKSFile, "auth-jwks", "", "", "JWKS file of the public keys bearer tokens are verified against (SPEC T1; `tetherctl tokens init DIR` writes one); with -tls-client-ca, client certificates naming principals are accepted too. Off loopback one of them is required; on loopback without either every caller is admitted (development mode)")
	envflag.StringVar(fs, &auth.Issuer, "auth-issuer", "", tenancy.DefaultIssuer, "the issuer (iss) bearer tokens must carry")
	envflag.StringVar(fs, &auth.Audience, "auth-audience", "", tenancy.DefaultAudience, "the audience (aud) bearer tokens must carry")
	workspaceRoot := envflag.String(fs, "workspace-root", "", workspace.DefaultRoot, "a run's workspace.cwd must lie in <this>/<company_id> (SPEC T6; the same as the gateways' -workspace-root), or the run is refused at submit with workspace_outside_root")
	regSecretFile := envflag.String(fs, "registration-secret-file", "", identity.DefaultRegistrationSecretFile(), "the registration secret gateways without a runnergw certificate prove when they call RegisterGateway (SPEC T5; a 0600 key file, created when missing, read only without -tls-client-ca); give the gateways the same file")
	secretsKey := envflag.String(fs, "secrets-key-file", "", filepath.Join(filepath.Dir(identity.DefaultRegistrationSecretFile()), "secrets.key"), "the key (a 0600 key file, created when missing) that seals company secrets in the database (SPEC T3: envelope encryption, a data key per secret version sealed with this key); every executor replica of a fleet needs the same file")
	if err := envflag.Parse(fs, os.Args[1:]); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("-database-url (or TETHER_DATABASE_URL) is required")
	}
	// Who may call (SPEC T1): decided before anything starts, so that an
	// executor off loopback without an authentication configuration never
	// serves; the company lookups use the store opened below.
	az, err := authz.New(cfg.GRPCAddr, cfg.TLSCertFile, cfg.TLSClientCAFile, auth, nil)
	if err != nil {
		return err
	}
	if err := store.CheckLeaseTTL(*ttl); err != nil {
		return err
	}
	if *grantKey == "" {
		return fmt.Errorf("-grant-key-file (or TETHER_GRANT_KEY_FILE) is required: the key that signs gateway grants (`tetherctl certs init DIR` writes one)")
	}
	signingKey, err := grant.LoadSigningKey(*grantKey)
	if err != nil {
		return err
	}
	if err := cfg.CheckTLS(); err != nil {
		return err
	}
	keys, err := secrets.Load(*secretsKey)
	if err != nil {
		return fmt.Errorf("-secrets-key-file: %w", err)
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	if *migrate {
		if err := store.Migrate(ctx, *dsn); err != nil {
			return fmt.Errorf("migrating: %w", err)
		}
	} else if err := store.CheckSchema(ctx, *dsn); err != nil {
		return err
	}
	st, err := store.Open(ctx, *dsn, pgstore.MaxConns(*maxConns))
	if err != nil {
		return err
	}
	defer st.Close()
	watchStore, err := store.Open(ctx, *dsn, pgstore.MaxConns(max(*watchConns, 1)))
	if err != nil {
		return err
	}
	defer watchStore.Close()
	// Each session scope's calls go to the gateway it is placed on (SPEC
	// F2), over one connection per gateway; -gateway-addr/-gateway-id is
	// the static gateway every scope is placed on while no gateway is
	// registered.
	gwDial := gwTLS.WithDefaults(cfg, "")
	router := fleet.NewRouter(st, grant.NewSigner(signingKey, *grantTTL, nil), func(addr string) (*grpc.ClientConn, error) {
		return gwDial.Dial(addr, grpcx.PeerConnectParams())
	}, fleet.Static{ID: *gatewayID, Addr: *gwAddr}, *gatewayTTL)
	defer router.Close()
	if _, err := router.Client(*gatewayID, *gwAddr); err != nil {
		return err
	}
	// Calls for a run driven by another replica are forwarded there by an
	// interceptor of the API server, which is built below.
	var apiSrv *api.Server
	forward := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return apiSrv.ForwardToOwner(ctx, req, info, h)
	}
	// Every call of the public services is authorized before its handler
	// and before it is forwarded (SPEC T2).
	az.Lookup = st
	srv, err := grpcx.New(*cfg, api.WatchCodec(), grpc.ChainUnaryInterceptor(az.Unary, forward), grpc.ChainStreamInterceptor(az.Stream))
	if err != nil {
		return err
	}
	// Ready only while the database answers (SPEC D5).
	srv.AddReadinessCheck("database", func(ctx context.Context) error { return st.Pool().Ping(ctx) })
	srv.Registry().MustRegister(pgstore.PoolCollector(map[string]*pgxpool.Pool{"main": st.Pool(), "watch": watchStore.Pool()}))
	log := srv.Logger()
	// SPEC L2: on a partitioned events table, partitions exist ahead of
	// time even when this replica's purge is off (the purge job creates
	// them too).
	if err := st.EnsureEventPartitions(ctx, time.Now().Add(store.PartitionsAhead)); err != nil {
		log.Warn("creating events partitions ahead", "err", err)
	}
	log.Info("authorization", "mode", az.Mode())
	router.Logger = log
	router.LostWait = *lostWait
	stopTracing, err := cfg.StartTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	if *advertise == "" {
		*advertise = cfg.GRPCAddr
	}
	hub := watch.NewHub(watchStore, watch.WithEncoder(api.EncodeWatchEvent))
	// The runs this replica drives wake their watchers here, at their
	// commit, without the notification's round trip (other replicas'
	// watchers still learn of it by notification).
	st.OnEventsCommitted(hub.Offer)
	vault := &secrets.Vault{Keys: keys, Store: st}
	var checkpoints retention.CheckpointDeleter
	if *backupAddr != "" {
		conn, err := backupTLS.WithDefaults(cfg, "").Dial(*backupAddr)
		if err != nil {
			return fmt.Errorf("-backup-addr: %w", err)
		}
		defer conn.Close()
		checkpoints = retention.Verifier{Client: backupv1.NewBackupVerifierClient(conn)}
	}
	purger := &retention.Purger{Store: st, Checkpoints: checkpoints, Owner: *owner, Interval: *purgeEvery,
		Logger: log, Deleted: retention.NewMetrics(srv.Registry())}
	d := dispatch.New(st, dispatch.Config{
		Owner: *owner, LeaseTTL: *ttl, PollInterval: *poll, MaxActive: *maxActive, RetryDelay: *retryDelay,
		NoSameHostTakeover: !*sameHost, AdvertiseAddr: *advertise, Metrics: srv.Registry(),
		Router: router, Logger: log, Secrets: vault,
	})
	sus := &suspend.Suspender{Store: st, Gateways: router, Owner: *owner,
		Interval: *idleSweep, CheckpointAfter: *checkpointAfter, Logger: log}
	drainer := &fleet.Drainer{Store: st, Suspender: sus, Router: router, Interval: *drainSweep, Logger: log}
	apiSrv = &api.Server{Store: st, Hub: hub, Submit: d.SubmitAndClaim, KickRun: d.KickRun,
		DispatchCancellation: d.DispatchCancellation, AwaitCancellationAck: d.AwaitCancellationAck, Draining: srv.Draining(), Controls: d.Controls(), SelfAddr: *advertise,
		Gateways: router, GatewayTTL: *gatewayTTL, Suspender: sus, WorkspaceRoot: *workspaceRoot, Vault: vault, Checkpoints: checkpoints,
		DialPeer: func(addr string) (*grpc.ClientConn, error) {
			return peerTLS.WithDefaults(cfg, cfg.TLSClientCAFile).Dial(addr)
		}}
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), apiSrv)
	registry := &api.Registry{Store: st, TTL: *gatewayTTL}
	if cfg.TLSClientCAFile == "" {
		// No client certificates: a gateway proves the registration secret.
		if registry.Secret, err = keyfile.LoadOrCreate(*regSecretFile); err != nil {
			return fmt.Errorf("-registration-secret-file: %w", err)
		}
	}
	executorv1.RegisterGatewayRegistryServer(srv.GRPC(), registry)
	if auth.HTTPAddr != "" {
		h, err := web.Handler(srv.GRPC())
		if err != nil {
			return err
		}
		if err := srv.AddHTTP(auth.HTTPAddr, h); err != nil {
			return err
		}
	}
	srv.Registry().MustRegister(registry)
	defer apiSrv.Close()
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()
	go hub.Listen(bg, st.Pool(), watch.Handlers{RunDue: d.NotifiedRun, Cancel: d.CancelKick}, log)
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		if *idleSweep > 0 {
			sus.Run(bg)
		}
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		if *drainSweep > 0 {
			drainer.Run(bg)
		}
	}()
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		if *purgeEvery > 0 {
			purger.Run(bg)
		}
	}()
	// SIGTERM (ctx) stops the dispatcher at once, while the API drains:
	// it claims no more and hands every lease back under its fence, so
	// another replica resumes the runs now, not at their lease expiry
	// (SPEC F5).
	dctx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		_ = d.Run(dctx)
	}()
	err = srv.Serve(ctx)
	stopDispatch()
	<-dispatched
	cancelBG()
	<-swept
	<-drained
	<-purged
	return err
}
