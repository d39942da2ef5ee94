// Command runnergw is tether's runner gateway: it launches local runnerd
// processes, authenticates their WebSocket connections and relays PRP events
// and commands between them and executors.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
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

	"github.com/tether-run/tether/pkg/envflag"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/placement"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/workspace"
	"github.com/tether-run/tether/services/runnergw/internal/announce"
	"github.com/tether-run/tether/services/runnergw/internal/api"
	"github.com/tether-run/tether/services/runnergw/internal/confine"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "runnergw:", err)
		os.Exit(1)
	}
}

func defaultStateRoot() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "tether", "runnergw")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "tether", "runnergw")
}

func run() error {
	fs := flag.NewFlagSet("runnergw", flag.ExitOnError)
	cfg := grpcx.RegisterFlags(fs, "runnergw", "127.0.0.1:7401", "127.0.0.1:9401")
	// SPEC S2: over mTLS only executors may call a gateway.
	cfg.AllowedPeers = []string{identity.Executor}
	wsAddr := envflag.String(fs, "runner-addr", "", "127.0.0.1:7411", "plain WebSocket listener for local runners (dial_ws_loopback; loopback only)")
	connectURL := envflag.String(fs, "runner-connect-url", "", "", "ws:// URL launched dial_ws_loopback runners dial (default ws://<runner-addr>"+gateway.ConnectPath+"; loopback only)")
	tlsAddr := envflag.String(fs, "runner-tls-addr", "", "127.0.0.1:7412", "TLS WebSocket listener for dial_wss runners (served only with -runner-tls-cert/-runner-tls-key)")
	tlsCert := envflag.String(fs, "runner-tls-cert", "", "", "PEM certificate (chain) of the TLS runner listener")
	tlsKey := envflag.String(fs, "runner-tls-key", "", "", "PEM private key of the TLS runner listener")
	publicURL := envflag.String(fs, "runner-public-url", "", "", "wss:// URL launched dial_wss runners dial (default wss://<runner-tls-addr>"+gateway.ConnectPath+")")
	caBundle := envflag.String(fs, "runner-ca-bundle", "", "", "PEM CA bundle handed to dial_wss runners (--ca-bundle-path) to trust a privately issued gateway certificate")
	ingressCompanies := envflag.String(fs, "runner-ingress-companies", "", "", "companies whose ingress-authorised runs may use listen_ws (comma separated; * = all; empty = listen_ws off)")
	ingressHost := envflag.String(fs, "runner-ingress-host", "", "127.0.0.1", "address launched listen_ws runners listen on and the gateway dials")
	ingressCert := envflag.String(fs, "runner-ingress-tls-cert", "", "", "PEM certificate handed to listen_ws runners: their listener serves TLS and the gateway dials wss://")
	ingressKey := envflag.String(fs, "runner-ingress-tls-key", "", "", "PEM private key (mode 0600) for -runner-ingress-tls-cert")
	ingressCA := envflag.String(fs, "runner-ingress-ca", "", "", "PEM CA bundle the gateway trusts for runner listeners (default: system roots)")
	pingInterval := envflag.Duration(fs, "runner-ping-interval", "", 10*time.Second, "how often each runner connection is pinged")
	pingTimeout := envflag.Duration(fs, "runner-ping-timeout", "", 30*time.Second, "close a runner connection without a pong for this long")
	handshakeTimeout := envflag.Duration(fs, "runner-handshake-timeout", "", prp.DefaultHandshakeTimeout,
		"a runner connection that has not proven its credential this long after it opened gets a Goodbye runner_handshake_timeout and is closed")
	toolTimeout := envflag.Duration(fs, "semantic-tool-timeout", "", 0, "how long a dynamic tool call waits for its result before runnerd answers it failed (semantic_tool_timeout); 0: runnerd's default (10m)")
	stateRoot := envflag.String(fs, "state-root", "", defaultStateRoot(), "directory for runner state, one subdirectory per session scope")
	workspaceRoot := envflag.String(fs, "workspace-root", "", workspace.DefaultRoot, "a run's workspace.cwd must resolve inside <this>/<company_id> (created 0700 on first use), or the run fails with workspace_outside_root (SPEC T6; the same as the executors' -workspace-root)")
	runnerd := envflag.String(fs, "runnerd-path", "", "", "runnerd binary (default: next to this binary, then PATH)")
	codex := envflag.String(fs, "codex-command", "", "codex", "provider command runnerd launches (the codex native binary, or fake-codex-app-server)")
	codexHome := envflag.String(fs, "codex-home-template", "", "", "directory whose auth.json and config.toml (mode 0600) are copied into each scope's codex-home before its runner is launched (they never travel in backups)")
	homeTemplates := envflag.String(fs, "provider-home-templates", "", "", "directory of provider home templates per company: <dir>/<company_id>/ holds that company's codex auth.json and config.toml (mode 0600) and <dir>/<company_id>/<provider>/ a pinned provider's launch-only files; <dir>/_default/ serves companies without their own; copied into each scope before its runner is launched (SPEC T3; never backed up)")
	var codexArgs listFlag
	provFlags := providerlaunch.RegisterFlags(fs)
	fs.Var(&codexArgs, "codex-arg", "argument for the provider command (repeatable; env TETHER_CODEX_ARGS, space separated)")
	idle := envflag.Duration(fs, "idle-timeout", "", 10*time.Minute, "how long a warm runner lives without work")
	grace := envflag.Duration(fs, "reconnect-grace", "", 2*time.Minute, "how long a runner keeps reconnecting before it gives up")
	connectTimeout := envflag.Duration(fs, "connect-timeout", "", 20*time.Second, "how long an Attach waits for its runner to connect")
	backupAddr := envflag.String(fs, "backup-addr", "", "127.0.0.1:7402", "backup verifier: verified suspensions upload their checkpoints to it, restores verify their stamps with it (empty: off)")
	backupCA := envflag.String(fs, "backup-ca", "", "", "PEM CA bundle for TLS to the backup verifier (needed off loopback); the gateway presents its -tls-cert as its client identity")
	keyFile := envflag.String(fs, "runner-auth-key-file", "", "", "HMAC key for runner credentials (default <state-root>/gateway.key, created 0600)")
	gatewayID := envflag.String(fs, "gateway-id", "", "runnergw", "this gateway's id: the audience every executor grant must name")
	grantKeys := envflag.String(fs, "grant-public-keys", "", "", "the executor fleet's Ed25519 grant public keys (PEM files, comma separated; more than one while keys rotate); every call needs a grant signed by one of them (required)")
	registryAddrs := envflag.String(fs, "registry-addr", "", "", "executor replicas (comma separated) this gateway announces itself to and heartbeats (SPEC F1; empty: no registry, executors dial it by -gateway-addr)")
	advertise := envflag.String(fs, "advertise-addr", "", "", "the address executors dial this gateway at, as announced to the registry (default: -grpc-addr)")
	labelsFlag := envflag.String(fs, "labels", "", "", "labels placements select this gateway by, e.g. zone=a,gpu=false")
	capacity := envflag.Int(fs, "capacity", "", 100, "session scopes this gateway holds at most (announced to the registry; must be at least 1)")
	registryTLS := grpcx.RegisterClientTLSFlags(fs, "registry", "the executors (the gateway registry)")
	confinement := envflag.String(fs, "runner-confinement", "", string(confine.Auto), "how launched runners and providers are confined (SPEC T7): auto (off loopback the strongest available: uid+bwrap as root, uid as root without bubblewrap, bwrap unprivileged, else refuse to start; on loopback none), uid (each company's runners under a uid of their own; needs root), bwrap (providers in a bubblewrap namespace sandbox), uid+bwrap, or none (unsafe: a provider can read the gateway's keys and other companies' files)")
	uidBase := envflag.Int(fs, "runner-uid-base", "", 200000, "first uid (and gid) of the range companies' runners get a uid of their own from (uid confinement); each company gets the lowest free one, recorded in <state-root>/"+confine.UIDFile)
	uidCount := envflag.Int(fs, "runner-uid-count", "", 50000, "size of the -runner-uid-base range (the companies one gateway can hold)")
	bwrapPath := envflag.String(fs, "bwrap-path", "", "", "bubblewrap binary (default: bwrap on PATH)")
	var sandboxRO listFlag
	fs.Var(&sandboxRO, "runner-sandbox-ro-bind", "a path bound read-only into every provider sandbox besides the system directories, the provider binary, the scope root and the workspace (repeatable)")
	drainWait := envflag.Duration(fs, "drain-wait", "", 0, "with a registry: at SIGTERM announce this gateway draining and keep serving until the executors have moved every session scope it holds (idle ones at once, busy ones when their run ends) or this long has passed, then stop (SPEC D4; Kubernetes: below terminationGracePeriodSeconds); 0: stop at once, announcing draining once")
	regSecretFile := envflag.String(fs, "registration-secret-file", "", identity.DefaultRegistrationSecretFile(), "the registration secret (SPEC T5) this gateway proves to the registry when it presents no client certificate (a 0600 key file, created when missing; the executors' -registration-secret-file)")
	if err := envflag.Parse(fs, os.Args[1:]); err != nil {
		return err
	}
	labels, err := placement.ParseLabels(*labelsFlag)
	if err != nil {
		return fmt.Errorf("-labels: %w", err)
	}
	if *registryAddrs != "" && *capacity <= 0 {
		return fmt.Errorf("-capacity %d: a gateway holds at least 1 session (gateway_capacity_invalid)", *capacity)
	}
	if len(codexArgs) == 0 {
		if v := os.Getenv("TETHER_CODEX_ARGS"); v != "" {
			codexArgs = strings.Fields(v)
		}
	}
	providers, err := provFlags.Profiles()
	if err != nil {
		return err
	}
	if !grpcx.IsLoopbackAddr(*wsAddr) {
		return fmt.Errorf("-runner-addr %s: plain runner connections are accepted on loopback only; use -runner-tls-addr with -runner-tls-cert/-runner-tls-key off loopback (dial_wss)", *wsAddr)
	}
	pubKeys, err := grant.LoadPublicKeys(*grantKeys)
	if err != nil {
		return err
	}
	grants, err := grant.NewVerifier(*gatewayID, pubKeys, nil)
	if err != nil {
		return err
	}
	if err := gateway.CheckCodexHomeTemplate(*codexHome); err != nil {
		return err
	}
	if err := gateway.CheckProviderHomeTemplates(*homeTemplates); err != nil {
		return err
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("-runner-tls-cert and -runner-tls-key go together")
	}
	if (*ingressCert == "") != (*ingressKey == "") {
		return errors.New("-runner-ingress-tls-cert and -runner-ingress-tls-key go together")
	}
	if err := os.MkdirAll(*stateRoot, 0o700); err != nil {
		return err
	}
	unlock, err := gateway.LockStateRoot(*stateRoot)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	rpath, err := findRunnerd(ctx, *runnerd)
	if err != nil {
		return err
	}
	if *keyFile == "" {
		*keyFile = filepath.Join(*stateRoot, "gateway.key")
	}
	confiner, err := newConfiner(confineFlags{
		mode: confine.Mode(*confinement), offLoopback: !grpcx.IsLoopbackAddr(cfg.GRPCAddr),
		cfg: confine.Config{
			StateRoot: *stateRoot, WorkspaceRoot: *workspaceRoot, UIDBase: *uidBase, UIDCount: *uidCount,
			BwrapPath: *bwrapPath, ReadOnly: sandboxRO,
			Hidden: append(strings.Split(*grantKeys, ","), *keyFile, cfg.TLSKeyFile, *tlsKey, *ingressKey, *regSecretFile,
				*codexHome, *homeTemplates, registryTLS.KeyFile),
			Executables: executables(rpath, *codex, providers),
		},
	})
	if err != nil {
		return err
	}
	build, err := gateway.ReadBuildMetadata(ctx, rpath, prp.ModeDialWSLoopback)
	if err != nil {
		return err
	}
	key, err := keyfile.LoadOrCreate(*keyFile)
	if err != nil {
		return err
	}
	srv, err := grpcx.New(*cfg)
	if err != nil {
		return err
	}
	log := srv.Logger()
	stopTracing, err := cfg.StartTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	lis, err := net.Listen("tcp", *wsAddr)
	if err != nil {
		return err
	}
	gcfg := gateway.Config{
		StateRoot: *stateRoot, WorkspaceRoot: *workspaceRoot, ConnectURL: *connectURL,
		RunnerdPath: rpath, CodexCommand: *codex, CodexArgs: codexArgs, CodexHomeTemplate: *codexHome,
		ProviderHomeTemplates: *homeTemplates,
		Providers:             providers,
		IdleTimeout:           *idle, ReconnectGrace: *grace, ConnectTimeout: *connectTimeout,
		Build: build, Authority: prp.NewAuthority(key, time.Now), Grants: grants, Logger: log, Draining: srv.Draining(), Metrics: srv.Registry(),
		CABundle: *caBundle, Ingress: gateway.ParseIngressPolicy(*ingressCompanies), IngressHost: *ingressHost,
		IngressCert: *ingressCert, IngressKey: *ingressKey, PingInterval: *pingInterval, PingTimeout: *pingTimeout,
		SemanticToolTimeout: *toolTimeout, OTLPEndpoint: cfg.OTLPEndpoint, Confine: confiner,
	}
	gcfg.Authority.HandshakeTimeout = *handshakeTimeout
	if gcfg.ConnectURL == "" {
		gcfg.ConnectURL = "ws://" + lis.Addr().String() + gateway.ConnectPath
	}
	if *ingressCA != "" {
		pool, err := loadPool(*ingressCA)
		if err != nil {
			return fmt.Errorf("-runner-ingress-ca: %w", err)
		}
		gcfg.IngressTLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	var tlsLis net.Listener
	if *tlsCert != "" {
		cert, err := grpcx.LoadKeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("runner TLS listener: %w", err)
		}
		if tlsLis, err = net.Listen("tcp", *tlsAddr); err != nil {
			return err
		}
		tlsLis = tls.NewListener(tlsLis, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}})
		gcfg.PublicURL = *publicURL
		if gcfg.PublicURL == "" {
			gcfg.PublicURL = "wss://" + tlsLis.Addr().String() + gateway.ConnectPath
		}
	}
	if *backupAddr != "" {
		conn, err := cfg.DialPeer(*backupAddr, *backupCA)
		if err != nil {
			return fmt.Errorf("-backup-addr: %w", err)
		}
		defer conn.Close()
		gcfg.Backup = backupv1.NewBackupVerifierClient(conn)
	}
	gw := gateway.New(gcfg)
	gatewayv1.RegisterRunnerGatewayServer(srv.GRPC(), &api.Server{Gateway: gw})
	if *registryAddrs != "" {
		if *advertise == "" {
			*advertise = cfg.GRPCAddr
		}
		var registries []executorv1.GatewayRegistryClient
		regTLS := registryTLS.WithDefaults(cfg, cfg.TLSClientCAFile)
		var regSecret []byte
		if regTLS.CertFile == "" {
			// No certificate to present: prove the registration secret.
			if regSecret, err = keyfile.LoadOrCreate(*regSecretFile); err != nil {
				return fmt.Errorf("-registration-secret-file: %w", err)
			}
		}
		for _, addr := range strings.Split(*registryAddrs, ",") {
			conn, err := regTLS.Dial(strings.TrimSpace(addr))
			if err != nil {
				return fmt.Errorf("-registry-addr: %w", err)
			}
			defer conn.Close()
			registries = append(registries, executorv1.NewGatewayRegistryClient(conn))
		}
		draining := make(chan struct{})
		an := announce.New(announce.Config{Registries: registries, ID: *gatewayID, Address: *advertise, Labels: labels,
			Capacity: *capacity, Sessions: gw.Sessions, Logger: log, Secret: regSecret, Draining: draining})
		// A refused first announcement (bad capacity, an id another live
		// gateway holds) stops the gateway; an unreachable registry does not.
		if _, err := an.Announce(ctx, false); announce.Refused(err) {
			return fmt.Errorf("the gateway registry refused this gateway: %w", err)
		} else if err != nil {
			log.Warn("the gateway registry is not reachable yet; retrying", "err", err)
		}
		actx, stopAnnouncing := context.WithCancel(context.Background())
		announced := make(chan struct{})
		go func() { defer close(announced); an.Run(actx) }()
		defer func() { stopAnnouncing(); <-announced }()
		if *drainWait > 0 {
			// Serve on through the drain: the executors suspend this
			// gateway's idle scopes through it and move them.
			signalled := ctx
			serveCtx, stopServing := context.WithCancel(context.Background())
			defer stopServing()
			go func() {
				<-signalled.Done()
				close(draining)
				waitDrained(serveCtx, gw.Sessions, *drainWait, log)
				stopAnnouncing()
				stopServing()
			}()
			ctx = serveCtx
		} else {
			go func() { <-ctx.Done(); stopAnnouncing() }()
		}
	}
	var servers []*http.Server
	for _, l := range []net.Listener{lis, tlsLis} {
		if l == nil {
			continue
		}
		hs := &http.Server{Handler: gw, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("runner listener failed", "err", err)
			}
		}()
		log.Info("runner listener", "addr", l.Addr().String(), "tls", l != lis)
	}
	if confiner.Mode() == confine.None && !grpcx.IsLoopbackAddr(cfg.GRPCAddr) {
		log.Warn("runners are not confined (-runner-confinement=none): a provider can read this gateway's keys and other companies' files")
	}
	log.Info("runner gateway", "runner_confinement", string(confiner.Mode()), "runnerd", rpath, "codex_command", *codex, "connect_url", gcfg.ConnectURL,
		"public_url", gcfg.PublicURL, "ingress", gcfg.Ingress.Enabled())
	err = srv.Serve(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range servers {
		_ = hs.Shutdown(sctx)
	}
	gw.Close()
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
