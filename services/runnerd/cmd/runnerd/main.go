// Command runnerd is tether's durable runner: it supervises one provider
// session, journals every event before sending it and stays connected to the
// runner gateway over PRP.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/buildinfo"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
)

// version is set with -ldflags "-X main.version=...".
var version = "0.1.0"

const (
	packageName           = "github.com/tether-run/tether/services/runnerd"
	binaryContractVersion = 2
)

// BuildMetadata is printed by --build-metadata.
type BuildMetadata struct {
	Schema                string   `json:"schema"`
	BinaryName            string   `json:"binaryName"`
	PackageName           string   `json:"packageName"`
	PackageVersion        string   `json:"packageVersion"`
	BinaryContractVersion int      `json:"binaryContractVersion"`
	PRPTransportModes     []string `json:"prpTransportModes"`
}

func buildMetadata() BuildMetadata {
	return BuildMetadata{
		Schema:                "tether/runnerd-build-metadata/v1",
		BinaryName:            "runnerd",
		PackageName:           packageName,
		PackageVersion:        version,
		BinaryContractVersion: binaryContractVersion,
		PRPTransportModes:     append([]string(nil), runner.TransportModes...),
	}
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "provider-host":
			os.Exit(runProviderHost(os.Args[2:], os.Stderr))
		case "provider-shim":
			os.Exit(runProviderShim(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		}
	}
	// A ticket in the environment (the compatibility path; see
	// --bootstrap-ticket-fd) is taken out before anything else, though the
	// kernel's copy in /proc/<pid>/environ stays.
	ticket, hadTicket := os.LookupEnv(prp.EnvBootstrapTicket)
	_ = os.Unsetenv(prp.EnvBootstrapTicket)
	os.Exit(run(os.Args[1:], ticket, hadTicket, os.Stdout, os.Stderr))
}

func run(args []string, ticket string, hadTicket bool, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runnerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg       runner.Config
		codexArgs stringList
		logFormat string
		meta      bool
		ticketFD  int
		otlp      string
	)
	fs.BoolVar(&meta, "build-metadata", false, "print build metadata as JSON and exit")
	fs.IntVar(&ticketFD, "bootstrap-ticket-fd", -1, "read the one-use bootstrap ticket from this inherited descriptor (a pipe, or a private file the launcher removes) until EOF, then close it; "+
		"without it the ticket is taken from "+prp.EnvBootstrapTicket+", which stays readable in /proc/<pid>/environ")
	fs.StringVar(&cfg.ConnectURL, "connect-url", "", "gateway runner endpoint to dial: ws:// to a loopback address (dial_ws_loopback) or wss:// (dial_wss)")
	fs.StringVar(&cfg.CABundlePath, "ca-bundle-path", "", "dial_wss: private PEM file of extra CA certificates (<= 4 MiB; added to the system roots)")
	fs.StringVar(&cfg.ListenAddress, "listen-address", "", "listen_ws: IP address to listen on (the gateway dials in)")
	fs.IntVar(&cfg.ListenPort, "listen-port", 0, "listen_ws: TCP port to listen on")
	fs.StringVar(&cfg.ListenPath, "listen-path", "", "listen_ws: the only path served; must be /v1/runners/connect/<runner-id>")
	fs.StringVar(&cfg.ListenTLSCert, "listen-tls-cert", "", "listen_ws: serve TLS with this PEM certificate (chain)")
	fs.StringVar(&cfg.ListenTLSKey, "listen-tls-key", "", "listen_ws: private PEM key for --listen-tls-cert")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "durable state directory (absolute)")
	fs.StringVar(&cfg.RunnerID, "runner-id", "", "runner instance id")
	fs.StringVar(&cfg.EnvironmentLeaseID, "environment-lease-id", "", "environment lease id")
	fs.StringVar(&cfg.SessionID, "session-id", "", "normalized session id")
	fs.StringVar(&cfg.SessionScope, "session-scope", "", "session scope digest (hex)")
	fs.StringVar(&cfg.Workspace, "workspace", "", "provider working directory (absolute)")
	fs.StringVar(&cfg.Provider, "provider", providerlaunch.Codex, "launch profile of the provider: "+strings.Join(registeredProviders(), "|"))
	fs.StringVar(&cfg.CodexCommand, "codex-command", "", "provider executable (alias of --provider-command)")
	fs.StringVar(&cfg.CodexCommand, "provider-command", "", "provider executable")
	fs.Var(&codexArgs, "codex-arg", "provider argument (repeatable; alias of --provider-arg)")
	fs.Var(&codexArgs, "provider-arg", "provider argument (repeatable)")
	fs.StringVar(&cfg.ProviderHomeTemplate, "provider-home-template", "", "directory of launch-only provider files the driver copies into the provider's home (opencode: opencode.json)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", 10*time.Minute, "stop after this long without activity")
	fs.DurationVar(&cfg.ReconnectGrace, "reconnect-grace", 2*time.Minute, "exit 3 after this long without a gateway connection")
	fs.Uint64Var(&cfg.MaxOutboxBytes, "max-outbox-bytes", runner.DefaultMaxOutboxBytes, "unacknowledged event bytes the durable outbox may hold (16 KiB..512 MiB)")
	fs.Uint64Var(&cfg.P0ReserveBytes, "p0-reserve-bytes", runner.DefaultP0ReserveBytes, "part of --max-outbox-bytes only P0 events may use (less than half)")
	fs.BoolVar(&cfg.ProviderHost, "provider-host", true, "run the provider under a provider host so it survives a runnerd crash and a restarted runnerd re-attaches to it")
	fs.DurationVar(&cfg.ProviderDetachTimeout, "provider-detach-timeout", 2*time.Minute, "how long a provider host keeps a provider without runnerd")
	fs.DurationVar(&cfg.SemanticToolTimeout, "semantic-tool-timeout", runner.DefaultSemanticToolTimeout, "answer a dynamic tool call failed (semantic_tool_timeout) when no tool.result arrived within this long")
	fs.DurationVar(&cfg.SilenceTimeout, "gateway-silence-timeout", 60*time.Second, "drop and re-establish a gateway connection on which nothing arrived for this long (the gateway pings)")
	fs.StringVar(&logFormat, "log-format", "json", "log format: json|text")
	fs.StringVar(&otlp, "otlp-endpoint", "", "export OpenTelemetry traces over OTLP/gRPC to this endpoint (empty: "+telemetry.EnvEndpoint+" or off)")
	showVersion := fs.Bool("version", false, "print the build (version, commit, Go) and exit")
	if err := fs.Parse(args); err != nil {
		return runner.ExitError
	}
	if *showVersion {
		fmt.Fprintln(stdout, buildinfo.Read().Line("runnerd"))
		return 0
	}
	if meta {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(buildMetadata()); err != nil {
			return runner.ExitError
		}
		return runner.ExitOK
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "runnerd: unexpected arguments %q\n", fs.Args())
		return runner.ExitError
	}
	var h slog.Handler
	switch logFormat {
	case "json":
		h = slog.NewJSONHandler(stderr, nil)
	case "text":
		h = slog.NewTextHandler(stderr, nil)
	default:
		fmt.Fprintf(stderr, "runnerd: --log-format must be json or text\n")
		return runner.ExitError
	}
	log := slog.New(telemetry.LogHandler(h)).With("runner_id", cfg.RunnerID, "session_id", cfg.SessionID)
	if ticketFD >= 0 {
		t, err := readTicket(ticketFD)
		if err != nil {
			log.Error("reading the bootstrap ticket", "fd", ticketFD, "err", err)
			return runner.ExitError
		}
		ticket, hadTicket = t, true
	} else if hadTicket {
		log.Warn("bootstrap ticket taken from the environment, where it stays readable in /proc/<pid>/environ; launchers should pass --bootstrap-ticket-fd", "env", prp.EnvBootstrapTicket)
	}
	if !hadTicket || ticket == "" {
		log.Error("no bootstrap ticket", "flag", "--bootstrap-ticket-fd", "env", prp.EnvBootstrapTicket)
		return runner.ExitError
	}
	cred, err := prp.ParseCredential(ticket)
	if err != nil {
		log.Error("bootstrap ticket is malformed", "code", prp.CodeOf(err))
		return runner.ExitError
	}
	cfg.Ticket = cred
	cfg.CodexArgs = codexArgs
	cfg.Logger = log
	cfg.RunnerVersion = version
	start, ok := providerStarters[cfg.Provider]
	if !ok {
		fmt.Fprintf(stderr, "runnerd: --provider %q: this build drives %s\n", cfg.Provider, strings.Join(registeredProviders(), ", "))
		return runner.ExitError
	}
	cfg.StartProvider = start
	cfg.PathEnv = os.Getenv("PATH")
	if cfg.PathEnv == "" {
		cfg.PathEnv = "/usr/local/bin:/usr/bin:/bin"
	}

	// The gateway may die; runnerd lives on in its own process group.
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	stopTracing, err := telemetry.Setup(ctx, "runnerd", otlp, log)
	if err != nil {
		log.Error("tracing", "err", err)
		return runner.ExitError
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	log.Info("runnerd starting", "version", version, "state_dir", cfg.StateDir, "pid", os.Getpid())
	code, err := runner.Run(ctx, cfg)
	if err != nil {
		log.Error("runnerd failed", "err", err)
	}
	return code
}

// maxTicketBytes bounds what readTicket reads (an encoded ticket is a few
// hundred bytes).
const maxTicketBytes = 8 << 10

// readTicket reads the bootstrap ticket from the inherited descriptor fd to
// EOF and closes it, so nothing started later inherits it.
func readTicket(fd int) (string, error) {
	f := os.NewFile(uintptr(fd), "bootstrap-ticket")
	if f == nil {
		return "", fmt.Errorf("descriptor %d is not open", fd)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTicketBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxTicketBytes {
		return "", fmt.Errorf("more than %d bytes on descriptor %d", maxTicketBytes, fd)
	}
	return strings.TrimSpace(string(b)), nil
}
