package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/budget"
	"github.com/tether-run/tether/services/executor/internal/config"
	"github.com/tether-run/tether/services/executor/internal/dispatch"
	"github.com/tether-run/tether/services/executor/internal/fleet"
	"github.com/tether-run/tether/services/executor/internal/quotametrics"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
	"github.com/tether-run/tether/services/executor/internal/watch"
	"github.com/tether-run/tether/services/executor/internal/web"
)

// executor is one executor process being wired: each step of run fills
// some fields from the config and the earlier steps; close releases what
// they opened, in reverse order.
type executor struct {
	cfg     *config.Config
	closers []func()

	az         *authz.Authorizer
	signingKey ed25519.PrivateKey
	keys       *secrets.Keyring

	st, watchStore *store.Store
	router         *fleet.Router
	srv            *grpcx.Server
	log            *slog.Logger

	hub         *watch.Hub
	vault       *secrets.Vault
	checkpoints retention.CheckpointDeleter
	purger      *retention.Purger
	budgets     *budget.Enforcer
	d           *dispatch.Dispatcher
	sus         *suspend.Suspender
	drainer     *fleet.Drainer
	apiSrv      *api.Server
}

func (e *executor) onClose(f func()) { e.closers = append(e.closers, f) }

func (e *executor) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// loadKeys decides who may call (SPEC T1) before anything starts, so that
// an executor off loopback without an authentication configuration never
// serves (the company lookups use the store opened later), and reads the
// grant signing key and the secrets key.
func (e *executor) loadKeys() error {
	var err error
	if e.az, err = authz.New(e.cfg.Server.GRPCAddr, e.cfg.Server.TLSCertFile, e.cfg.Server.TLSClientCAFile, e.cfg.Auth, nil); err != nil {
		return err
	}
	if e.signingKey, err = grant.LoadSigningKey(e.cfg.GrantKeyFile); err != nil {
		return err
	}
	if e.keys, err = secrets.Load(e.cfg.SecretsKeyFile); err != nil {
		return fmt.Errorf("-secrets-key-file: %w", err)
	}
	return nil
}

// openStores migrates (or checks) the schema and opens the main pool and
// the pool WatchRun reads with.
func (e *executor) openStores(ctx context.Context) error {
	dsn := e.cfg.DatabaseURL
	if e.cfg.Migrate {
		if err := store.Migrate(ctx, dsn); err != nil {
			return fmt.Errorf("migrating: %w", err)
		}
	} else if err := store.CheckSchema(ctx, dsn); err != nil {
		return err
	}
	st, err := store.Open(ctx, dsn, runrules.New(), pgstore.MaxConns(e.cfg.DatabaseMaxConns))
	if err != nil {
		return err
	}
	e.st = st
	e.onClose(st.Close)
	watchStore, err := store.Open(ctx, dsn, runrules.New(), pgstore.MaxConns(e.cfg.DatabaseWatchConns))
	if err != nil {
		return err
	}
	e.watchStore = watchStore
	e.onClose(watchStore.Close)
	return nil
}

// dialGateways builds the router: each session scope's calls go to the
// gateway it is placed on (SPEC F2), over one connection per gateway;
// -gateway-addr/-gateway-id is the static gateway every scope is placed on
// while no gateway is registered.
func (e *executor) dialGateways() error {
	c := e.cfg
	gwDial := c.GatewayTLS.WithDefaults(c.Server, "")
	e.router = fleet.NewRouter(e.st, grant.NewSigner(e.signingKey, c.GrantTTL, nil), func(addr string) (*grpc.ClientConn, error) {
		return gwDial.Dial(addr, grpcx.PeerConnectParams())
	}, fleet.Static{ID: c.GatewayID, Addr: c.GatewayAddr}, c.GatewayTTL)
	e.onClose(e.router.Close)
	_, err := e.router.Client(c.GatewayID, c.GatewayAddr)
	return err
}

// newServer builds the gRPC server: every call of the public services is
// authorized before its handler and before it is forwarded (SPEC T2) to
// the replica driving its run (by an interceptor of the API server, which
// registerAPI builds).
func (e *executor) newServer(ctx context.Context) error {
	forward := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return e.apiSrv.ForwardToOwner(ctx, req, info, h)
	}
	e.az.Lookup = e.st
	// Calls run on long-lived goroutines (grpc-go's stream workers) whose
	// stacks have grown to what a call through the interceptors and a
	// database read needs, not on a fresh goroutine whose stack is grown
	// and copied on every call: 10 % of the executor's CPU under GetRun at
	// 32 callers (SPEC P1). A call finding every worker busy (long-lived
	// streams hold one too) gets a goroutine of its own, as before.
	srv, err := grpcx.New(*e.cfg.Server, api.WatchCodec(), grpc.ChainUnaryInterceptor(e.az.Unary, forward), grpc.ChainStreamInterceptor(e.az.Stream),
		grpc.NumStreamWorkers(streamWorkers))
	if err != nil {
		return err
	}
	e.srv = srv
	// Ready only while the database answers (SPEC D5).
	srv.AddReadinessCheck("database", func(ctx context.Context) error { return e.st.Pool().Ping(ctx) })
	srv.Registry().MustRegister(pgstore.PoolCollector(map[string]*pgxpool.Pool{"main": e.st.Pool(), "watch": e.watchStore.Pool()}))
	e.log = srv.Logger()
	// SPEC L2: on a partitioned events table, partitions exist ahead of
	// time even when this replica's purge is off (the purge job creates
	// them too).
	if err := e.st.EnsureEventPartitions(ctx, time.Now().Add(store.PartitionsAhead)); err != nil {
		e.log.Warn("creating events partitions ahead", "err", err)
	}
	e.log.Info("authorization", "mode", e.az.Mode())
	e.router.Logger = e.log
	e.router.LostWait = e.cfg.GatewayLostWait
	stopTracing, err := e.cfg.Server.StartTracing(ctx, e.log)
	if err != nil {
		return err
	}
	e.onClose(stopTracing)
	return nil
}

// newServices builds the watch hub, the secrets vault, the retention
// purger, the dispatcher, the idle suspender and the drainer.
func (e *executor) newServices() error {
	c := e.cfg
	e.hub = watch.NewHub(e.watchStore, watch.WithEncoder(api.EncodeWatchEvent))
	// The runs this replica drives wake their watchers here, at their
	// commit, without the notification's round trip (other replicas'
	// watchers still learn of it by notification).
	e.st.OnEventsCommitted(e.hub.Offer)
	e.vault = &secrets.Vault{Keys: e.keys, Store: e.st}
	if c.BackupAddr != "" {
		conn, err := c.BackupTLS.WithDefaults(c.Server, "").Dial(c.BackupAddr)
		if err != nil {
			return fmt.Errorf("-backup-addr: %w", err)
		}
		e.onClose(func() { _ = conn.Close() })
		e.checkpoints = retention.Verifier{Client: backupv1.NewBackupVerifierClient(conn)}
	}
	e.purger = &retention.Purger{Store: e.st, Checkpoints: e.checkpoints, Owner: c.Owner, Interval: c.RetentionInterval,
		Logger: e.log, Deleted: retention.NewMetrics(e.srv.Registry())}
	e.budgets = &budget.Enforcer{Store: e.st, Interval: c.BudgetInterval, Logger: e.log}
	// SPEC Q4: per-company figures, bounded labels (docs/limits.md).
	e.srv.Registry().MustRegister(&quotametrics.Collector{Store: e.st, Logger: e.log})
	e.d = dispatch.New(e.st, dispatch.Config{
		Owner: c.Owner, LeaseTTL: c.LeaseTTL, PollInterval: c.PollInterval, MaxActive: c.MaxActiveRuns, RetryDelay: c.RetryDelay,
		NoSameHostTakeover: !c.SameHostTakeover, AdvertiseAddr: c.AdvertiseAddr, Metrics: e.srv.Registry(),
		Router: e.router, Logger: e.log, Secrets: e.vault,
	})
	e.sus = &suspend.Suspender{Store: e.st, Gateways: e.router, Owner: c.Owner,
		Interval: c.IdleSweepInterval, CheckpointAfter: c.CheckpointAfter, Logger: e.log}
	e.drainer = &fleet.Drainer{Store: e.st, Suspender: e.sus, Router: e.router, Interval: c.DrainSweepInterval, Logger: e.log}
	return nil
}

// registerAPI registers ExecutorService and GatewayRegistry on the gRPC
// server, and on the HTTP port when there is one (SPEC U3).
func (e *executor) registerAPI() error {
	c := e.cfg
	d := e.d
	e.apiSrv = &api.Server{Store: e.st, Hub: e.hub, Submit: d.SubmitAndClaim, KickRun: d.KickRun,
		DispatchCancellation: d.DispatchCancellation, AwaitCancellationAck: d.AwaitCancellationAck, Draining: e.srv.Draining(), Controls: d.Controls(), SelfAddr: c.AdvertiseAddr,
		Gateways: e.router, GatewayTTL: c.GatewayTTL, Suspender: e.sus, WorkspaceRoot: c.WorkspaceRoot, Vault: e.vault, Checkpoints: e.checkpoints,
		DialPeer: func(addr string) (*grpc.ClientConn, error) {
			return c.PeerTLS.WithDefaults(c.Server, c.Server.TLSClientCAFile).Dial(addr)
		}}
	executorv1.RegisterExecutorServiceServer(e.srv.GRPC(), e.apiSrv)
	registry := &api.Registry{Store: e.st, TTL: c.GatewayTTL}
	if c.Server.TLSClientCAFile == "" {
		// No client certificates: a gateway proves the registration secret.
		var err error
		if registry.Secret, err = keyfile.LoadOrCreate(c.RegistrationSecretFile); err != nil {
			return fmt.Errorf("-registration-secret-file: %w", err)
		}
	}
	executorv1.RegisterGatewayRegistryServer(e.srv.GRPC(), registry)
	executorv1.RegisterCompaniesServer(e.srv.GRPC(), &api.Companies{Store: e.st})
	if c.Auth.HTTPAddr != "" {
		h, err := web.Handler(e.srv.GRPC())
		if err != nil {
			return err
		}
		if err := e.srv.AddHTTP(c.Auth.HTTPAddr, h); err != nil {
			return err
		}
	}
	e.srv.Registry().MustRegister(registry)
	e.onClose(e.apiSrv.Close)
	return nil
}

// serve runs the background loops and serves until ctx ends. SIGTERM (ctx)
// stops the dispatcher at once, while the API drains: it claims no more
// and hands every lease back under its fence, so another replica resumes
// the runs now, not at their lease expiry (SPEC F5).
func (e *executor) serve(ctx context.Context) error {
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()
	go e.hub.Listen(bg, e.st.Pool(), watch.Handlers{RunDue: e.d.NotifiedRun, Cancel: e.d.CancelKick,
		Own: e.st.TakeOwnNotification, Forget: e.st.ForgetOwnNotifications}, e.log)
	swept := background(e.cfg.IdleSweepInterval > 0, func() { e.sus.Run(bg) })
	drained := background(e.cfg.DrainSweepInterval > 0, func() { e.drainer.Run(bg) })
	purged := background(e.cfg.RetentionInterval > 0, func() { e.purger.Run(bg) })
	budgeted := background(e.cfg.BudgetInterval > 0, func() { e.budgets.Run(bg) })
	dctx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	dispatched := background(true, func() { _ = e.d.Run(dctx) })
	err := e.srv.Serve(ctx)
	stopDispatch()
	<-dispatched
	cancelBG()
	<-swept
	<-drained
	<-purged
	<-budgeted
	return err
}

// background runs f in a goroutine when on; the channel closes when it
// returned (at once when off).
func background(on bool, f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if on {
			f()
		}
	}()
	return done
}

// streamWorkers is the number of goroutines the gRPC server keeps to run
// calls on: the unary calls of a busy executor at once, with room for its
// long-lived streams.
const streamWorkers = 64
