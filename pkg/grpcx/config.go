// Package grpcx bootstraps tether's gRPC servers and clients: flags with
// TETHER_* environment fallbacks, TLS (default-on off loopback), recovery,
// protovalidate, slog logging, Prometheus metrics, health, reflection,
// keepalive and graceful shutdown.
package grpcx

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/buildinfo"
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
	// OTLPEndpoint turns on OpenTelemetry trace export (see StartTracing
	// and pkg/telemetry); empty defers to OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string

	// Pprof serves net/http/pprof under /debug/pprof/ on the metrics
	// address (off by default: profiles reveal internals).
	Pprof bool

	// Version: print the build (pkg/buildinfo) and exit; ParseFlags does.
	Version bool

	flagErrs func() error // env fallback errors of RegisterFlags
}

// EnvName is the environment variable backing a flag: "grpc-addr" →
// "TETHER_GRPC_ADDR".
func EnvName(flagName string) string {
	return "TETHER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// RegisterFlags registers the common server flags on fs, each defaulting to
// its TETHER_* environment variable when set:
//
//	-grpc-addr, -metrics-addr, -tls-cert, -tls-key, -tls-client-ca,
//	-insecure-allow-plaintext, -shutdown-timeout, -drain-delay,
//	-log-level, -log-format, -otlp-endpoint, -pprof
//
// The returned Config is filled in by fs.Parse. Use ParseFlags (or let New
// report them) to surface invalid environment values.
func RegisterFlags(fs *flag.FlagSet, name, defaultGRPC, defaultMetrics string) *Config {
	c := &Config{Name: name}
	StringVar(fs, &c.GRPCAddr, "grpc-addr", "", defaultGRPC, "gRPC listen address")
	StringVar(fs, &c.MetricsAddr, "metrics-addr", "", defaultMetrics, "HTTP address for /metrics, /healthz and /readyz (empty: disabled)")
	StringVar(fs, &c.TLSCertFile, "tls-cert", "", "", "TLS certificate file (PEM)")
	StringVar(fs, &c.TLSKeyFile, "tls-key", "", "", "TLS private key file (PEM)")
	StringVar(fs, &c.TLSClientCAFile, "tls-client-ca", "", "", "CA bundle for verifying client certificates (enables mTLS)")
	BoolVar(fs, &c.AllowPlaintext, "insecure-allow-plaintext", "", false, "allow serving plaintext gRPC on a non-loopback address")
	DurationVar(fs, &c.ShutdownTimeout, "shutdown-timeout", "", DefaultShutdownTimeout, "graceful shutdown bound before RPCs are cancelled")
	DurationVar(fs, &c.DrainDelay, "drain-delay", "", 0, "time to report NOT_SERVING before refusing new RPCs at shutdown")
	StringVar(fs, &c.LogLevel, "log-level", "", "info", "log level: debug|info|warn|error")
	StringVar(fs, &c.LogFormat, "log-format", "", "json", "log format: json|text")
	StringVar(fs, &c.OTLPEndpoint, "otlp-endpoint", "", "", "export OpenTelemetry traces over OTLP/gRPC to this endpoint (http://host:4317 plaintext, https:// TLS; empty: "+telemetry.EnvEndpoint+" or off)")
	BoolVar(fs, &c.Pprof, "pprof", "", false, "serve Go profiles under /debug/pprof/ on -metrics-addr (for profiling; keep that address private)")
	fs.BoolVar(&c.Version, "version", false, "print the build (version, commit, commit time, Go) and exit")
	c.flagErrs = func() error { return envErrors(fs) }
	return c
}

// envErrs records unparsable environment values per flag set.
var (
	envErrsMu sync.Mutex
	envErrs   = map[*flag.FlagSet][]error{}
)

func recordEnvErr(fs *flag.FlagSet, err error) {
	envErrsMu.Lock()
	defer envErrsMu.Unlock()
	envErrs[fs] = append(envErrs[fs], err)
}

func envErrors(fs *flag.FlagSet) error {
	envErrsMu.Lock()
	defer envErrsMu.Unlock()
	return errors.Join(envErrs[fs]...)
}

// ParseFlags parses args into fs and reports invalid environment fallback
// values of flags registered with this package's helpers.
//
// A set with -version (RegisterFlags registers it) given -version prints
// the build on standard output and exits 0, as -h prints the usage.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := envErrors(fs); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if v := fs.Lookup("version"); v != nil && v.Value.String() == "true" {
		fmt.Println(buildinfo.Read().Line(fs.Name()))
		os.Exit(0)
	}
	return nil
}

// lookupEnv returns the env value for a flag; env "" means EnvName(name).
func lookupEnv(name, env string) (string, string, bool) {
	if env == "" {
		env = EnvName(name)
	}
	v, ok := os.LookupEnv(env)
	return env, v, ok
}

func envDefault[T any](fs *flag.FlagSet, name, env string, def T, parse func(string) (T, error)) T {
	env, v, ok := lookupEnv(name, env)
	if !ok {
		return def
	}
	x, err := parse(v)
	if err != nil {
		recordEnvErr(fs, fmt.Errorf("invalid %s=%q for -%s: %w", env, v, name, err))
		return def
	}
	return x
}

// StringVar registers a string flag whose default comes from env (or
// EnvName(name) when env is "") when set.
func StringVar(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	fs.StringVar(p, name, envDefault(fs, name, env, def, func(s string) (string, error) { return s, nil }), withEnv(usage, name, env))
}

// StringFlag is StringVar returning the pointer.
func StringFlag(fs *flag.FlagSet, name, env, def, usage string) *string {
	p := new(string)
	StringVar(fs, p, name, env, def, usage)
	return p
}

// DurationVar registers a time.Duration flag with an env fallback.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	fs.DurationVar(p, name, envDefault(fs, name, env, def, time.ParseDuration), withEnv(usage, name, env))
}

// DurationFlag is DurationVar returning the pointer.
func DurationFlag(fs *flag.FlagSet, name, env string, def time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	DurationVar(fs, p, name, env, def, usage)
	return p
}

// IntVar registers an int flag with an env fallback.
func IntVar(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	fs.IntVar(p, name, envDefault(fs, name, env, def, strconv.Atoi), withEnv(usage, name, env))
}

// IntFlag is IntVar returning the pointer.
func IntFlag(fs *flag.FlagSet, name, env string, def int, usage string) *int {
	p := new(int)
	IntVar(fs, p, name, env, def, usage)
	return p
}

// BoolVar registers a bool flag with an env fallback (strconv.ParseBool
// syntax: 1, true, 0, false, ...).
func BoolVar(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	fs.BoolVar(p, name, envDefault(fs, name, env, def, strconv.ParseBool), withEnv(usage, name, env))
}

// BoolFlag is BoolVar returning the pointer.
func BoolFlag(fs *flag.FlagSet, name, env string, def bool, usage string) *bool {
	p := new(bool)
	BoolVar(fs, p, name, env, def, usage)
	return p
}

func withEnv(usage, name, env string) string {
	if env == "" {
		env = EnvName(name)
	}
	return usage + " (env " + env + ")"
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
