package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnergw/internal/announce"
	"github.com/tether-run/tether/services/runnergw/internal/api"
	"github.com/tether-run/tether/services/runnergw/internal/config"
	"github.com/tether-run/tether/services/runnergw/internal/confine"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

// gatewayProcess is one runnergw process being wired: each step of run
// fills some fields from the config and the earlier steps; close releases
// what they opened, in reverse order.
type gatewayProcess struct {
	cfg     *config.Config
	closers []func()

	grants   *grant.Verifier
	rpath    string // runnerd
	confiner *confine.Confiner
	build    *gatewayv1.BuildMetadata
	key      []byte

	srv         *grpcx.Server
	log         *slog.Logger
	lis, tlsLis net.Listener
	gcfg        gateway.Config
	gw          *gateway.Gateway
}

func (g *gatewayProcess) onClose(f func()) { g.closers = append(g.closers, f) }

func (g *gatewayProcess) close() {
	for i := len(g.closers) - 1; i >= 0; i-- {
		g.closers[i]()
	}
}

// loadGrants reads the executor fleet's grant public keys: every call
// needs a grant for this gateway signed by one of them (SPEC S1).
func (g *gatewayProcess) loadGrants() error {
	pubKeys, err := grant.LoadPublicKeys(g.cfg.GrantPublicKeys)
	if err != nil {
		return err
	}
	g.grants, err = grant.NewVerifier(g.cfg.GatewayID, pubKeys, nil)
	return err
}

// lockStateRoot creates the state root and holds its lock: one gateway
// per state root.
func (g *gatewayProcess) lockStateRoot() error {
	if err := os.MkdirAll(g.cfg.StateRoot, 0o700); err != nil {
		return err
	}
	unlock, err := gateway.LockStateRoot(g.cfg.StateRoot)
	if err != nil {
		return err
	}
	g.onClose(unlock)
	return nil
}

// prepareLaunch finds runnerd, resolves the runners' confinement, reads
// runnerd's build metadata and the runner credential key.
func (g *gatewayProcess) prepareLaunch(ctx context.Context) error {
	c := g.cfg
	var err error
	if g.rpath, err = findRunnerd(ctx, c.RunnerdPath); err != nil {
		return err
	}
	g.confiner, err = newConfiner(confineFlags{
		mode: confine.Mode(c.Confinement), offLoopback: !grpcx.IsLoopbackAddr(c.Server.GRPCAddr),
		cfg: confine.Config{
			StateRoot: c.StateRoot, WorkspaceRoot: c.WorkspaceRoot, UIDBase: c.UIDBase, UIDCount: c.UIDCount,
			BwrapPath: c.BwrapPath, ReadOnly: c.SandboxReadOnly,
			Hidden: append(strings.Split(c.GrantPublicKeys, ","), c.RunnerAuthKeyFile, c.Server.TLSKeyFile, c.RunnerTLSKey, c.IngressTLSKey, c.RegistrationSecretFile,
				c.CodexHomeTemplate, c.ProviderHomeTemplates, c.RegistryTLS.KeyFile),
			Executables: executables(g.rpath, c.CodexCommand, c.Providers),
		},
	})
	if err != nil {
		return err
	}
	if g.build, err = gateway.ReadBuildMetadata(ctx, g.rpath, prp.ModeDialWSLoopback); err != nil {
		return err
	}
	g.key, err = keyfile.LoadOrCreate(c.RunnerAuthKeyFile)
	return err
}

// newServer builds the gRPC server and starts tracing.
func (g *gatewayProcess) newServer(ctx context.Context) error {
	srv, err := grpcx.New(*g.cfg.Server)
	if err != nil {
		return err
	}
	g.srv, g.log = srv, srv.Logger()
	stopTracing, err := g.cfg.Server.StartTracing(ctx, g.log)
	if err != nil {
		return err
	}
	g.onClose(stopTracing)
	return nil
}

// listen opens the runner listeners (plain on loopback; TLS for dial_wss
// when configured) and builds the gateway's configuration around them.
func (g *gatewayProcess) listen() error {
	c := g.cfg
	lis, err := net.Listen("tcp", c.RunnerAddr)
	if err != nil {
		return err
	}
	g.lis = lis
	g.gcfg = gateway.Config{
		StateRoot: c.StateRoot, WorkspaceRoot: c.WorkspaceRoot, ConnectURL: c.RunnerConnectURL,
		RunnerdPath: g.rpath, CodexCommand: c.CodexCommand, CodexArgs: c.CodexArgs, CodexHomeTemplate: c.CodexHomeTemplate,
		ProviderHomeTemplates: c.ProviderHomeTemplates,
		Providers:             c.Providers,
		IdleTimeout:           c.IdleTimeout, ReconnectGrace: c.ReconnectGrace, ConnectTimeout: c.ConnectTimeout,
		Build: g.build, Authority: prp.NewAuthority(g.key, time.Now), Grants: g.grants, Logger: g.log, Draining: g.srv.Draining(), Metrics: g.srv.Registry(),
		CABundle: c.RunnerCABundle, Ingress: gateway.ParseIngressPolicy(c.IngressCompanies), IngressHost: c.IngressHost,
		IngressCert: c.IngressTLSCert, IngressKey: c.IngressTLSKey, PingInterval: c.PingInterval, PingTimeout: c.PingTimeout,
		SemanticToolTimeout: c.SemanticToolTimeout, OTLPEndpoint: c.Server.OTLPEndpoint, Confine: g.confiner,
	}
	g.gcfg.Authority.HandshakeTimeout = c.HandshakeTimeout
	if g.gcfg.ConnectURL == "" {
		g.gcfg.ConnectURL = "ws://" + lis.Addr().String() + gateway.ConnectPath
	}
	if c.IngressCA != "" {
		pool, err := loadPool(c.IngressCA)
		if err != nil {
			return fmt.Errorf("-runner-ingress-ca: %w", err)
		}
		g.gcfg.IngressTLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	if c.RunnerTLSCert == "" {
		return nil
	}
	cert, err := grpcx.LoadKeyPair(c.RunnerTLSCert, c.RunnerTLSKey)
	if err != nil {
		return fmt.Errorf("runner TLS listener: %w", err)
	}
	tlsLis, err := net.Listen("tcp", c.RunnerTLSAddr)
	if err != nil {
		return err
	}
	g.tlsLis = tls.NewListener(tlsLis, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}})
	g.gcfg.PublicURL = c.RunnerPublicURL
	if g.gcfg.PublicURL == "" {
		g.gcfg.PublicURL = "wss://" + g.tlsLis.Addr().String() + gateway.ConnectPath
	}
	return nil
}

// dialBackup connects to the backup verifier, when there is one.
func (g *gatewayProcess) dialBackup() error {
	if g.cfg.BackupAddr == "" {
		return nil
	}
	conn, err := g.cfg.Server.DialPeer(g.cfg.BackupAddr, g.cfg.BackupCA)
	if err != nil {
		return fmt.Errorf("-backup-addr: %w", err)
	}
	g.onClose(func() { _ = conn.Close() })
	g.gcfg.Backup = backupv1.NewBackupVerifierClient(conn)
	return nil
}

// newGateway builds the gateway and registers its gRPC service.
func (g *gatewayProcess) newGateway() {
	g.gw = gateway.New(g.gcfg)
	gatewayv1.RegisterRunnerGatewayServer(g.srv.GRPC(), &api.Server{Gateway: g.gw})
}

// announce announces this gateway to the registry and keeps heartbeating
// (SPEC F1), when there is a registry. It returns the context the gateway
// serves under: with -drain-wait, a SIGTERM (ctx) announces the gateway
// draining and the gateway serves on until the executors moved its
// session scopes or the wait is over (SPEC D4).
func (g *gatewayProcess) announce(ctx context.Context) (context.Context, error) {
	c := g.cfg
	if c.RegistryAddrs == "" {
		return ctx, nil
	}
	registries, regSecret, err := g.dialRegistries()
	if err != nil {
		return ctx, err
	}
	draining := make(chan struct{})
	an := announce.New(announce.Config{Registries: registries, ID: c.GatewayID, Address: c.AdvertiseAddr, Labels: c.Labels,
		Capacity: c.Capacity, Sessions: g.gw.Sessions, Logger: g.log, Secret: regSecret, Draining: draining})
	// A refused first announcement (bad capacity, an id another live
	// gateway holds) stops the gateway; an unreachable registry does not.
	if _, err := an.Announce(ctx, false); announce.Refused(err) {
		return ctx, fmt.Errorf("the gateway registry refused this gateway: %w", err)
	} else if err != nil {
		g.log.Warn("the gateway registry is not reachable yet; retrying", "err", err)
	}
	actx, stopAnnouncing := context.WithCancel(context.Background())
	announced := make(chan struct{})
	go func() { defer close(announced); an.Run(actx) }()
	g.onClose(func() { stopAnnouncing(); <-announced })
	if c.DrainWait <= 0 {
		go func() { <-ctx.Done(); stopAnnouncing() }()
		return ctx, nil
	}
	// Serve on through the drain: the executors suspend this gateway's
	// idle scopes through it and move them.
	signalled := ctx
	serveCtx, stopServing := context.WithCancel(context.Background())
	g.onClose(stopServing)
	go func() {
		<-signalled.Done()
		close(draining)
		waitDrained(serveCtx, g.gw.Sessions, c.DrainWait, g.log)
		stopAnnouncing()
		stopServing()
	}()
	return serveCtx, nil
}

// dialRegistries connects to every executor of -registry-addr and, when
// the gateway presents no client certificate, loads the registration
// secret it proves instead (SPEC T5).
func (g *gatewayProcess) dialRegistries() ([]executorv1.GatewayRegistryClient, []byte, error) {
	c := g.cfg
	regTLS := c.RegistryTLS.WithDefaults(c.Server, c.Server.TLSClientCAFile)
	var regSecret []byte
	if regTLS.CertFile == "" {
		var err error
		if regSecret, err = keyfile.LoadOrCreate(c.RegistrationSecretFile); err != nil {
			return nil, nil, fmt.Errorf("-registration-secret-file: %w", err)
		}
	}
	var registries []executorv1.GatewayRegistryClient
	for _, addr := range strings.Split(c.RegistryAddrs, ",") {
		conn, err := regTLS.Dial(strings.TrimSpace(addr))
		if err != nil {
			return nil, nil, fmt.Errorf("-registry-addr: %w", err)
		}
		g.onClose(func() { _ = conn.Close() })
		registries = append(registries, executorv1.NewGatewayRegistryClient(conn))
	}
	return registries, regSecret, nil
}

// serve serves the runner listeners and the gRPC server until ctx ends,
// then shuts the listeners down and closes the gateway.
func (g *gatewayProcess) serve(ctx context.Context) error {
	var servers []*http.Server
	for _, l := range []net.Listener{g.lis, g.tlsLis} {
		if l == nil {
			continue
		}
		hs := &http.Server{Handler: g.gw, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)}
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				g.log.Error("runner listener failed", "err", err)
			}
		}()
		g.log.Info("runner listener", "addr", l.Addr().String(), "tls", l != g.lis)
	}
	if g.confiner.Mode() == confine.None && !grpcx.IsLoopbackAddr(g.cfg.Server.GRPCAddr) {
		g.log.Warn("runners are not confined (-runner-confinement=none): a provider can read this gateway's keys and other companies' files")
	}
	g.log.Info("runner gateway", "runner_confinement", string(g.confiner.Mode()), "runnerd", g.rpath, "codex_command", g.cfg.CodexCommand, "connect_url", g.gcfg.ConnectURL,
		"public_url", g.gcfg.PublicURL, "ingress", g.gcfg.Ingress.Enabled())
	err := g.srv.Serve(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range servers {
		_ = hs.Shutdown(sctx)
	}
	g.gw.Close()
	return err
}

// waitDrained waits until sessions reports none left (the executors moved
// every scope away), wait has passed or ctx ends.
func waitDrained(ctx context.Context, sessions func() int, wait time.Duration, log *slog.Logger) {
	start := time.Now()
	log.Info("draining: waiting for the executors to move this gateway's session scopes", "sessions", sessions(), "drain_wait", wait)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		n := sessions()
		if n == 0 {
			log.Info("drained: no session scope left", "took", time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			log.Warn("drain wait over with session scopes left; stopping (their runs recover elsewhere)", "sessions", n)
			return
		case <-tick.C:
		}
	}
}

// loadPool reads a PEM CA bundle.
func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// findRunnerd applies G1: a configured (build-owned) runnerd is used as is;
// only when none is configured may the one next to this binary, then a
// preinstalled one (a strict `command -v runnerd` answer), be used.
func findRunnerd(ctx context.Context, p string) (string, error) {
	self, _ := os.Executable()
	path, _, err := gateway.DiscoverRunnerd(ctx, p, self, gateway.ShellWhich)
	return path, err
}

type confineFlags struct {
	mode        confine.Mode
	offLoopback bool
	cfg         confine.Config
}

// newConfiner resolves -runner-confinement against what this host can do
// (root? a working bubblewrap, tried as the user providers will run as)
// and prepares it (SPEC T7).
func newConfiner(f confineFlags) (*confine.Confiner, error) {
	host := confine.Host{Root: os.Geteuid() == 0}
	if f.mode != confine.None && f.mode != confine.UID && (f.mode != confine.Auto || f.offLoopback) {
		if f.cfg.BwrapPath == "" {
			f.cfg.BwrapPath, _ = exec.LookPath("bwrap")
		}
		var as *syscall.Credential
		if host.Root && f.mode != confine.Bwrap {
			// The sandbox runs as a company's uid: try it as the first one.
			as = &syscall.Credential{Uid: uint32(f.cfg.UIDBase), Gid: uint32(f.cfg.UIDBase), Groups: []uint32{}}
		}
		host.Bwrap, host.BwrapErr = confine.ProbeBwrap(f.cfg.BwrapPath, as)
	}
	mode, err := confine.Resolve(f.mode, f.offLoopback, host)
	if err != nil {
		return nil, err
	}
	f.cfg.Mode = mode
	return confine.New(f.cfg)
}

// executables are the absolute paths of runnerd and the provider commands
// (those found): runners under their own uid must be able to reach them.
func executables(runnerd, codex string, providers providerlaunch.Set) []string {
	out := []string{runnerd}
	cmds := []string{codex}
	for _, p := range providers {
		cmds = append(cmds, p.Command)
	}
	for _, c := range cmds {
		if p, err := exec.LookPath(c); err == nil {
			if p, err = filepath.Abs(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
