// Package grpcx bootstraps tether's gRPC servers and clients: the common
// server flags (through pkg/envflag), TLS (default-on off loopback), recovery,
// protovalidate, slog logging, Prometheus metrics, health, reflection,
// keepalive and graceful shutdown.
package grpcx

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/telemetry"
)

// DefaultShutdownTimeout bounds GracefulStop when Config.ShutdownTimeout is 0.
const DefaultShutdownTimeout = 10 * time.Second

// Config configures a Server. RegisterFlags fills one from flags/env.
type Config struct {
	// Name is the service name used in logs (e.g. "executor").
	Name string
	// GRPCAddr is the gRPC listen address, e.g. "127.0.0.1:7400" or ":7400".
	GRPCAddr string
	// MetricsAddr is the HTTP address serving /metrics, /healthz and /readyz;
	// empty disables the metrics server.
	MetricsAddr string
	// TLSCertFile and TLSKeyFile enable TLS; TLSClientCAFile additionally
	// requires and verifies client certificates (mTLS).
	TLSCertFile     string
	TLSKeyFile      string
	TLSClientCAFile string
	// AllowPlaintext permits serving without TLS on a non-loopback address.
	AllowPlaintext bool
	// AllowedPeers, when set, are the identity roles (pkg/identity) whose
	// mTLS certificates may call this server's services (health and
	// reflection excepted); it needs TLSClientCAFile with TLS. Without TLS
	// there are no identities (loopback development).
	AllowedPeers []string
	// ShutdownTimeout bounds the graceful stop (default 10s); then remaining
	// RPCs are cancelled.
	ShutdownTimeout time.Duration
	// DrainDelay is how long the server keeps answering (health NOT_SERVING)
	// after shutdown starts and before it stops accepting RPCs, so load
	// balancers can notice. Default 0.
	DrainDelay time.Duration
	// LogLevel (debug|info|warn|error) and LogFormat (json|text) build the
	// logger when Logger is nil.
	LogLevel  string
	LogFormat string
	// Logger, when set, is used as is.
	Logger *slog.Logger
	// AccessLog is how unary calls are logged: "summary" (the default)
	// logs a failed call, or one that took AccessLogSlow (1s) or longer,
	// on a line of its own and counts the others into one "grpc calls"
	// line per AccessLogInterval (1m); "all" logs every call. With the
	// logger at debug, the counted calls are logged too, at debug.
	AccessLog         string
	AccessLogSlow     time.Duration
	AccessLogInterval time.Duration
	// OTLPEndpoint turns on OpenTelemetry trace export (see StartTracing
	// and pkg/telemetry); empty defers to OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string

	// Pprof serves net/http/pprof under /debug/pprof/ on the metrics
	// address (off by default: profiles reveal internals).
	Pprof bool

	// Version: print the build (pkg/buildinfo) and exit; envflag.Parse does.
	Version bool

	flagErrs func() error // env fallback errors of RegisterFlags
}

// RegisterFlags registers the common server flags on fs, each defaulting to
// its TETHER_* environment variable when set:
//
//	-grpc-addr, -metrics-addr, -tls-cert, -tls-key, -tls-client-ca,
//	-insecure-allow-plaintext, -shutdown-timeout, -drain-delay,
//	-log-level, -log-format, -otlp-endpoint, -pprof
//
// The returned Config is filled in by fs.Parse. Use envflag.Parse (or let
// New report them) to surface invalid environment values.
func RegisterFlags(fs *flag.FlagSet, name, defaultGRPC, defaultMetrics string) *Config {
	c := &Config{Name: name}
	envflag.StringVar(fs, &c.GRPCAddr, "grpc-addr", "", defaultGRPC, "gRPC listen address")
	envflag.StringVar(fs, &c.MetricsAddr, "metrics-addr", "", defaultMetrics, "HTTP address for /metrics, /healthz and /readyz (empty: disabled)")
	envflag.StringVar(fs, &c.TLSCertFile, "tls-cert", "", "", "TLS certificate file (PEM)")
	envflag.StringVar(fs, &c.TLSKeyFile, "tls-key", "", "", "TLS private key file (PEM)")
	envflag.StringVar(fs, &c.TLSClientCAFile, "tls-client-ca", "", "", "CA bundle for verifying client certificates (enables mTLS)")
	envflag.BoolVar(fs, &c.AllowPlaintext, "insecure-allow-plaintext", "", false, "allow serving plaintext gRPC on a non-loopback address")
	envflag.DurationVar(fs, &c.ShutdownTimeout, "shutdown-timeout", "", DefaultShutdownTimeout, "graceful shutdown bound before RPCs are cancelled")
	envflag.DurationVar(fs, &c.DrainDelay, "drain-delay", "", 0, "time to report NOT_SERVING before refusing new RPCs at shutdown")
	envflag.StringVar(fs, &c.LogLevel, "log-level", "", "info", "log level: debug|info|warn|error")
	envflag.StringVar(fs, &c.LogFormat, "log-format", "", "json", "log format: json|text")
	envflag.StringVar(fs, &c.AccessLog, "access-log", "", AccessLogSummary, "unary calls' access log: summary (failed and slow calls on a line each, the others counted per method every -access-log-interval) | all (a line per call)")
	envflag.DurationVar(fs, &c.AccessLogSlow, "access-log-slow", "", DefaultAccessLogSlow, "-access-log summary: a unary call this slow or slower is logged on a line of its own")
	envflag.DurationVar(fs, &c.AccessLogInterval, "access-log-interval", "", DefaultAccessLogInterval, "-access-log summary: how often the counted calls are logged")
	envflag.StringVar(fs, &c.OTLPEndpoint, "otlp-endpoint", "", "", "export OpenTelemetry traces over OTLP/gRPC to this endpoint (http://host:4317 plaintext, https:// TLS; empty: "+telemetry.EnvEndpoint+" or off)")
	envflag.BoolVar(fs, &c.Pprof, "pprof", "", false, "serve Go profiles under /debug/pprof/ on -metrics-addr (for profiling; keep that address private)")
	fs.BoolVar(&c.Version, "version", false, "print the build (version, commit, commit time, Go) and exit")
	c.flagErrs = func() error { return envflag.Errors(fs) }
	return c
}

// StartTracing installs the process's OpenTelemetry tracer provider when an
// OTLP endpoint is configured (OTLPEndpoint or the OTEL_EXPORTER_OTLP_*
// environment; see pkg/telemetry) and returns the function that flushes
// it at exit (bounded to 5s). Without an endpoint nothing is exported.
func (c *Config) StartTracing(ctx context.Context, log *slog.Logger) (stop func(), err error) {
	shutdown, err := telemetry.Setup(ctx, c.Name, c.OTLPEndpoint, log)
	if err != nil {
		return func() {}, fmt.Errorf("grpcx: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	}, nil
}
