package grpcx

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"buf.build/go/protovalidate"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	protovalidatemw "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/protovalidate"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/buildinfo"
	"github.com/tether-run/tether/pkg/envflag"
)

// Keepalive settings shared by servers and clients. Client pings (Dial) are
// no more frequent than the server's enforcement MinTime.
const (
	KeepaliveMinTime       = 10 * time.Second // server: minimum client ping interval
	KeepaliveServerTime    = 30 * time.Second // server: ping idle clients after
	KeepaliveServerTimeout = 10 * time.Second
	KeepaliveClientTime    = 30 * time.Second
	KeepaliveClientTimeout = 10 * time.Second
)

// MaxRecvMsgBytes bounds one request message a Server reads (16 MiB).
const MaxRecvMsgBytes = 16 << 20

// Server is a gRPC server with tether's interceptors, health, reflection and
// a separate metrics HTTP server.
type Server struct {
	cfg      Config
	log      *slog.Logger
	gs       *grpc.Server
	health   *health.Server
	reg      *prometheus.Registry
	metrics  *grpcprom.ServerMetrics
	secure   bool
	tls      *tls.Config
	draining chan struct{}
	drainMu  sync.Once
	serving  atomic.Bool
	ready    readiness

	access *accessLog

	mu         sync.Mutex
	lis        net.Listener
	metricsLis net.Listener
	served     bool
	http       *httpAPI // AddHTTP
}

// New builds a Server from cfg. extra options are appended to the built-in
// ones (interceptors passed with grpc.ChainUnaryInterceptor /
// ChainStreamInterceptor run after the built-in chain: fields, metrics,
// logging, recovery, mTLS peer identities (Config.AllowedPeers),
// protovalidate), and the OpenTelemetry stats handler traces every call
// but health checks (see pkg/telemetry).
func New(cfg Config, extra ...grpc.ServerOption) (*Server, error) {
	cfg, log, err := checkConfig(cfg)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := serverTLS(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkPeersConfig(cfg); err != nil {
		return nil, err
	}
	if tlsCfg == nil && !cfg.AllowPlaintext && cfg.GRPCAddr != "" && !IsLoopbackAddr(cfg.GRPCAddr) {
		return nil, plaintextError(cfg.GRPCAddr)
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("grpcx: protovalidate: %w", err)
	}
	reg, metrics, err := newRegistry(cfg.Name)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		log:      log,
		health:   health.NewServer(),
		reg:      reg,
		metrics:  metrics,
		secure:   tlsCfg != nil,
		tls:      tlsCfg,
		draining: make(chan struct{}),
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	opts := s.serverOptions(peerCheck{allowed: cfg.AllowedPeers, secure: tlsCfg != nil}, validator)
	s.gs = grpc.NewServer(append(opts, extra...)...)
	healthpb.RegisterHealthServer(s.gs, &drainingHealth{Server: s.health, draining: s.draining})
	reflection.Register(s.gs)
	return s, nil
}

// checkConfig reports the flags' invalid environment values and bad log
// settings, fills the defaults and returns cfg with the logger to use.
func checkConfig(cfg Config) (Config, *slog.Logger, error) {
	if cfg.flagErrs != nil {
		if err := cfg.flagErrs(); err != nil {
			return cfg, nil, fmt.Errorf("grpcx: %w", err)
		}
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Name == "" {
		cfg.Name = "grpc"
	}
	if _, err := ParseLevel(cfg.LogLevel); err != nil && cfg.Logger == nil {
		return cfg, nil, err
	}
	if err := checkFormat(cfg.LogFormat); err != nil && cfg.Logger == nil {
		return cfg, nil, err
	}
	if err := checkAccessLog(cfg.AccessLog); err != nil {
		return cfg, nil, err
	}
	if cfg.AccessLogSlow < 0 || cfg.AccessLogInterval < 0 {
		return cfg, nil, errors.New("grpcx: -access-log-slow and -access-log-interval must not be negative")
	}
	log := cfg.Logger
	if log == nil {
		log = NewLogger(cfg.LogLevel, cfg.LogFormat, os.Stderr)
	}
	return cfg, log.With("service", cfg.Name), nil
}

// newRegistry is the server's Prometheus registry: Go and process
// collectors, the build gauge and go-grpc-middleware's server metrics
// (grpc_server_started_total, grpc_server_handled_total,
// grpc_server_msg_received_total, grpc_server_msg_sent_total and
// grpc_server_handling_seconds, labelled grpc_type, grpc_service,
// grpc_method and grpc_code).
func newRegistry(name string) (*prometheus.Registry, *grpcprom.ServerMetrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfoGauge(name, buildinfo.Read()),
	)
	metrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	if err := reg.Register(metrics); err != nil {
		return nil, nil, err
	}
	return reg, metrics, nil
}

// serverOptions are the built-in interceptor chains (fields, metrics,
// logging, coded errors, recovery, peer identities, undecodable requests,
// protovalidate), the codec, tracing, keepalive, TLS and message size.
func (s *Server) serverOptions(peers peerCheck, validator protovalidate.Validator) []grpc.ServerOption {
	log := s.log
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithFieldsFromContext(func(ctx context.Context) logging.Fields {
			f, _ := ctx.Value(callFieldsKey{}).(*callFields)
			return append(replayFields(ctx), f.args()...)
		}),
	}
	s.access = &accessLog{
		log:      log,
		full:     logging.UnaryServerInterceptor(slogAdapter(log), logOpts...),
		all:      s.cfg.AccessLog == AccessLogAll,
		slow:     cmp.Or(s.cfg.AccessLogSlow, DefaultAccessLogSlow),
		interval: cmp.Or(s.cfg.AccessLogInterval, DefaultAccessLogInterval),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		s.log.ErrorContext(ctx, "panic in gRPC handler",
			append([]any{"grpc.method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack())}, LogFields(ctx)...)...)
		return status.Error(codes.Internal, "internal error")
	})
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(
			unaryFieldsInterceptor,
			s.metrics.UnaryServerInterceptor(),
			s.access.unary,
			unaryCodedErrors,
			recovery.UnaryServerInterceptor(rec),
			peers.unary,
			unaryUndecodable,
			protovalidatemw.UnaryServerInterceptor(validator),
		),
		grpc.ChainStreamInterceptor(
			streamFieldsInterceptor,
			s.metrics.StreamServerInterceptor(),
			logging.StreamServerInterceptor(slogAdapter(log), logOpts...),
			streamCodedErrors,
			recovery.StreamServerInterceptor(rec),
			peers.stream,
			streamUndecodable,
			protovalidatemw.StreamServerInterceptor(validator),
		),
		// Undecodable requests reach the interceptors marked (decode.go)
		// instead of failing as a bare Internal inside grpc-go.
		grpc.ForceServerCodecV2(Codec()),
		grpc.StatsHandler(untracedCalls{payloadless{otelgrpc.NewServerHandler(otelgrpc.WithFilter(Traced))}}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    KeepaliveServerTime,
			Timeout: KeepaliveServerTimeout,
		}),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	// Requests up to MaxRecvMsgBytes are read, so that one whose field is
	// too long (a 5 MB prompt) is refused by its validation rule with the
	// field named (invalid_request), not by the transport's bare
	// ResourceExhausted at grpc-go's 4 MiB default.
	return append(opts, grpc.MaxRecvMsgSize(MaxRecvMsgBytes))
}

// slogAdapter logs through l; successful health and reflection calls (probes,
// grpcurl) are demoted to debug so they do not flood the logs.
func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		level := slog.Level(lvl)
		if level == slog.LevelInfo && (demoted(ctx) || isInfraCall(fields)) {
			level = slog.LevelDebug
		}
		l.Log(ctx, level, msg, fields...)
	})
}

func isInfraCall(fields []any) bool {
	for i := 0; i+1 < len(fields); i += 2 {
		if k, _ := fields[i].(string); k == logging.ServiceFieldKey {
			switch fields[i+1] {
			case healthpb.Health_ServiceDesc.ServiceName,
				"grpc.reflection.v1.ServerReflection",
				"grpc.reflection.v1alpha.ServerReflection":
				return true
			}
			return false
		}
	}
	return false
}

func unaryFieldsInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	f := &callFields{}
	f.observe(req)
	return handler(context.WithValue(ctx, callFieldsKey{}, f), req)
}

func streamFieldsInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	f := &callFields{stream: ss}
	return handler(srv, &fieldsStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), callFieldsKey{}, f), f: f})
}

type fieldsStream struct {
	grpc.ServerStream
	ctx context.Context
	f   *callFields
}

func (s *fieldsStream) Context() context.Context { return s.ctx }

func (s *fieldsStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.f.observe(m)
	}
	return err
}

// GRPC is the underlying server, for registering services.
func (s *Server) GRPC() *grpc.Server { return s.gs }

// Health is the health server. Serve sets "" and every registered service
// SERVING when it starts and NOT_SERVING when shutdown begins; services may
// flip their own status in between (e.g. while their database is down).
func (s *Server) Health() *health.Server { return s.health }

// Registry is the Prometheus registry served at /metrics; register service
// metrics here.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Logger is the server's logger (with a "service" attribute).
func (s *Server) Logger() *slog.Logger { return s.log }

// Draining is closed when shutdown begins. Long-lived stream handlers should
// select on it and return (GracefulStop waits for them up to
// ShutdownTimeout, then cancels them).
func (s *Server) Draining() <-chan struct{} { return s.draining }

// Listen binds GRPCAddr and MetricsAddr (when set) without serving yet, so
// Addr and MetricsAddr are known (useful with ":0"). Serve calls it.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		if s.cfg.GRPCAddr == "" {
			return errors.New("grpcx: no gRPC address configured")
		}
		lis, err := net.Listen("tcp", s.cfg.GRPCAddr)
		if err != nil {
			return fmt.Errorf("grpcx: %w", err)
		}
		s.lis = lis
	}
	if err := s.listenMetricsLocked(); err != nil {
		return err
	}
	return s.listenHTTPLocked()
}

func (s *Server) listenMetricsLocked() error {
	if s.metricsLis != nil || s.cfg.MetricsAddr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", s.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("grpcx: metrics: %w", err)
	}
	s.metricsLis = lis
	return nil
}

// Addr is the bound gRPC address (nil before Listen / ServeListener).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// MetricsAddr is the bound metrics address (nil when disabled or not bound yet).
func (s *Server) MetricsAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.metricsLis == nil {
		return nil
	}
	return s.metricsLis.Addr()
}

// Serve listens on GRPCAddr (unless Listen already did) and serves until ctx
// is cancelled; see ServeListener.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	return s.ServeListener(ctx, lis)
}

// ServeListener serves gRPC on lis and metrics on MetricsAddr until ctx is
// cancelled, then shuts down: health NOT_SERVING, Draining closed, DrainDelay,
// GracefulStop bounded by ShutdownTimeout, then Stop; the metrics server is
// shut down too. It returns nil after a clean shutdown. A Server serves once.
func (s *Server) ServeListener(ctx context.Context, lis net.Listener) error {
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return errors.New("grpcx: Server already served")
	}
	s.served = true
	s.lis = lis
	err := s.listenMetricsLocked()
	if err == nil {
		err = s.listenHTTPLocked()
	}
	metricsLis := s.metricsLis
	s.mu.Unlock()
	if err == nil && !s.secure && !s.cfg.AllowPlaintext && !IsLoopbackAddr(lis.Addr().String()) {
		err = plaintextError(lis.Addr().String())
	}
	if err != nil {
		lis.Close()
		if metricsLis != nil {
			metricsLis.Close()
		}
		s.mu.Lock()
		s.closeHTTPListenerLocked()
		s.mu.Unlock()
		return err
	}

	s.metrics.InitializeMetrics(s.gs)
	// SERVING once every readiness check passes (SPEC D5: not before the
	// database answers), then following them.
	ready := s.ready.runChecks(ctx) == ""
	if ready {
		s.setServing(healthpb.HealthCheckResponse_SERVING)
		s.serving.Store(true)
	} else {
		failing, _, _ := s.ready.state()
		s.log.Warn("not ready: a readiness check fails", "check", failing)
	}
	readyCtx, stopReady := context.WithCancel(ctx)
	defer stopReady()
	if _, _, n := s.ready.state(); n > 0 {
		go s.watchReadiness(readyCtx, ready)
	}

	var wg sync.WaitGroup
	grpcErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		grpcErr <- s.gs.Serve(lis)
	}()
	var hs *http.Server
	metricsErr := make(chan error, 1)
	if metricsLis != nil {
		hs = &http.Server{Handler: s.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.Serve(metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				metricsErr <- err
			}
		}()
	}
	httpErr := make(chan error, 1)
	wg.Add(1)
	if !s.startHTTP(httpErr, wg.Done) {
		wg.Done()
	}
	s.access.start()
	defer s.access.close() // after the shutdown below: every call is counted
	b := buildinfo.Read()
	s.log.Info("serving", "grpc_addr", lis.Addr().String(), "metrics_addr", addrString(metricsLis), "http_addr", addrString(s.httpListener()), "tls", s.secure,
		"version", b.Version, "commit", b.Commit, "go_version", b.Go)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-grpcErr:
		runErr = fmt.Errorf("grpcx: serve: %w", err)
	case err := <-metricsErr:
		runErr = fmt.Errorf("grpcx: metrics server: %w", err)
	case err := <-httpErr:
		runErr = fmt.Errorf("grpcx: http server: %w", err)
	}
	if err := s.shutdown(hs); err != nil && runErr == nil {
		runErr = err
	}
	wg.Wait()
	return runErr
}

// stuckHandlerWait bounds the wait for handlers after Stop.
const stuckHandlerWait = 5 * time.Second

func (s *Server) shutdown(hs *http.Server) (stuckErr error) {
	s.log.Info("shutting down", "shutdown_timeout", s.cfg.ShutdownTimeout.String())
	s.serving.Store(false)
	s.drainMu.Do(func() { close(s.draining) })
	s.health.Shutdown() // NOT_SERVING for "" and every service; later updates ignored
	if s.cfg.DrainDelay > 0 {
		time.Sleep(s.cfg.DrainDelay)
	}
	// The HTTP listener's calls run on the gRPC server (ServeHTTP), whose
	// graceful stop would cut them: it is shut down first, within the same
	// bound.
	stopBy := time.Now().Add(s.cfg.ShutdownTimeout)
	s.stopHTTP(stopBy)
	done := make(chan struct{})
	go func() {
		s.gs.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(max(time.Until(stopBy), 0))
	select {
	case <-done:
		t.Stop()
	case <-t.C:
		s.log.Warn("graceful stop timed out; cancelling remaining RPCs")
		s.gs.Stop()
		// Stop cancels the RPCs' contexts; handlers that ignore them keep
		// their connection (and GracefulStop) alive. Do not hang forever.
		select {
		case <-done:
		case <-time.After(stuckHandlerWait):
			stuckErr = errors.New("grpcx: RPC handlers still running after Stop (they ignore context cancellation)")
			s.log.Error(stuckErr.Error())
		}
	}
	if hs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
		cancel()
	}
	s.log.Info("stopped")
	return stuckErr
}

func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	// Liveness (SPEC D5): the process still makes progress. With readiness
	// checks, their loop must have finished a round within livenessStall
	// (a wedged process fails it; a database that is down does not).
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if _, round, n := s.ready.state(); n > 0 && !round.IsZero() && time.Since(round) > livenessStall {
			http.Error(w, fmt.Sprintf("stalled: no readiness round for %s", time.Since(round).Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n")) //nolint:errcheck
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.serving.Load() {
			msg := "not serving"
			if failing, _, _ := s.ready.state(); failing != "" {
				msg += ": " + failing
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n")) //nolint:errcheck
	})
	return mux
}

func (s *Server) httpListener() net.Listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http == nil {
		return nil
	}
	return s.http.lis
}

func addrString(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

func plaintextError(addr string) error {
	return fmt.Errorf("grpcx: refusing to serve plaintext gRPC on non-loopback address %q: configure -tls-cert and -tls-key, or set -insecure-allow-plaintext (%s=true)", addr, envflag.EnvName("insecure-allow-plaintext"))
}

func serverTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		if cfg.TLSClientCAFile != "" {
			return nil, errors.New("grpcx: -tls-client-ca needs -tls-cert and -tls-key")
		}
		return nil, nil
	}
	if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" {
		return nil, errors.New("grpcx: -tls-cert and -tls-key must be set together")
	}
	cert, err := LoadKeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("grpcx: loading TLS key pair: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.TLSClientCAFile != "" {
		pool, err := loadCertPool(cfg.TLSClientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func loadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("grpcx: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("grpcx: no certificates in %s", file)
	}
	return pool, nil
}

// IsLoopbackAddr reports whether a host:port (or bare host) names only the
// loopback interface: "localhost", 127.0.0.0/8 or ::1. Empty hosts, 0.0.0.0
// and :: (all interfaces) are not loopback.
func IsLoopbackAddr(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// SignalContext returns a context cancelled on SIGINT or SIGTERM.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// CheckTLS loads the server's TLS settings as New would (the key through
// pkg/keyfile's checks), so a service can refuse a bad key before it does
// anything else (connects to its database, migrates).
func (c *Config) CheckTLS() error {
	_, err := serverTLS(*c)
	return err
}

// buildInfoGauge is tether_build_info{service, version, commit,
// go_version} = 1 (SPEC L4): which build each replica runs, for dashboards
// and rolling upgrades.
func buildInfoGauge(service string, b buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tether_build_info",
		Help:        "The build this process runs (value 1): its release version, VCS commit and Go toolchain.",
		ConstLabels: prometheus.Labels{"service": service, "version": b.Version, "commit": b.Commit, "go_version": b.Go},
	})
	g.Set(1)
	return g
}
