// Command runnerd is tether's durable runner: it supervises one provider
// session, journals every event before sending it and stays connected to the
// runner gateway over PRP.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/buildinfo"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/services/runnerd/internal/config"
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

// run is flags → config → logger and ticket → runner; it returns the
// process's exit code.
func run(args []string, ticket string, hadTicket bool, stdout, stderr io.Writer) int {
	cfg, err := config.Parse(args, stderr, registeredProviders())
	if err != nil {
		return runner.ExitError
	}
	if cfg.Version {
		fmt.Fprintln(stdout, buildinfo.Read().Line("runnerd"))
		return 0
	}
	if cfg.BuildMetadata {
		if err := json.NewEncoder(stdout).Encode(buildMetadata()); err != nil {
			return runner.ExitError
		}
		return runner.ExitOK
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "runnerd: %v\n", err)
		return runner.ExitError
	}
	log := newLogger(cfg, stderr)
	for _, w := range cfg.Deprecated {
		log.Warn(w)
	}
	cred, ok := bootstrapTicket(cfg.TicketFD, ticket, hadTicket, log)
	if !ok {
		return runner.ExitError
	}
	if err := cfg.CheckProvider(registeredProviders()); err != nil {
		fmt.Fprintf(stderr, "runnerd: %v\n", err)
		return runner.ExitError
	}
	rc := cfg.Runner
	rc.Ticket, rc.Logger, rc.RunnerVersion = cred, log, version
	rc.StartProvider = providerStarters[rc.Provider]
	rc.PathEnv = os.Getenv("PATH")
	if rc.PathEnv == "" {
		rc.PathEnv = "/usr/local/bin:/usr/bin:/bin"
	}
	return serve(rc, cfg.OTLPEndpoint, log)
}

// newLogger is runnerd's logger (--log-format, already validated), with
// the runner's and the session's ids on every line.
func newLogger(cfg *config.Config, stderr io.Writer) *slog.Logger {
	var h slog.Handler = slog.NewJSONHandler(stderr, nil)
	if cfg.LogFormat == "text" {
		h = slog.NewTextHandler(stderr, nil)
	}
	return slog.New(telemetry.LogHandler(h)).With("runner_id", cfg.Runner.RunnerID, "session_id", cfg.Runner.SessionID)
}

// bootstrapTicket reads the one-use bootstrap ticket: from the inherited
// descriptor fd when there is one, else the one taken from the
// environment (ticket, hadTicket). It logs why it has none.
func bootstrapTicket(fd int, ticket string, hadTicket bool, log *slog.Logger) (prp.Credential, bool) {
	if fd >= 0 {
		t, err := readTicket(fd)
		if err != nil {
			log.Error("reading the bootstrap ticket", "fd", fd, "err", err)
			return prp.Credential{}, false
		}
		ticket, hadTicket = t, true
	} else if hadTicket {
		log.Warn("bootstrap ticket taken from the environment, where it stays readable in /proc/<pid>/environ; launchers should pass --bootstrap-ticket-fd", "env", prp.EnvBootstrapTicket)
	}
	if !hadTicket || ticket == "" {
		log.Error("no bootstrap ticket", "flag", "--bootstrap-ticket-fd", "env", prp.EnvBootstrapTicket)
		return prp.Credential{}, false
	}
	cred, err := prp.ParseCredential(ticket)
	if err != nil {
		log.Error("bootstrap ticket is malformed", "code", prp.CodeOf(err))
		return prp.Credential{}, false
	}
	return cred, true
}

// serve runs the runner until it exits or a signal stops it. The gateway
// may die; runnerd lives on in its own process group.
func serve(cfg runner.Config, otlp string, log *slog.Logger) int {
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
