// Command tetherctl is the command line of tether's public API: every RPC
// of ExecutorService and of the gateway registry (but the gateways' own
// RegisterGateway) has a command (commands.go maps each command to the
// methods it calls; a test checks the map against the service
// descriptors). Every command prints a table, or with -o json the
// response as protojson; list commands page (-page-size, -page-token,
// -all). Connection settings come from flags, environment variables or a
// named profile (profile.go); a command that acts for a company takes it
// from -company, TETHER_COMPANY or the profile, and never guesses one.
//
//	tetherctl [-profile P] [-addr HOST:PORT] [-company C] <command> [flags]
//	tetherctl help            lists the commands
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/buildinfo"
	"github.com/tether-run/tether/pkg/envflag"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/audit"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func main() {
	os.Exit(exitCode(run(os.Args[1:]), os.Stderr))
}

// exitCode reports err (if any) on w and returns the process's exit code:
// 0 for success and for -h (the usage was printed, as asked), 1 otherwise.
func exitCode(err error, w io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errViolations):
		return 1 // the report says what
	}
	if st, ok := status.FromError(err); ok {
		fmt.Fprintf(w, "tetherctl: %s: %s\n", st.Code(), st.Message())
	} else {
		fmt.Fprintln(w, "tetherctl:", err)
	}
	return 1
}

// DefaultAgent is the agent id submit uses unless -agent names another.
const DefaultAgent = "agent-1"

// DefaultAddr is the executor address when no flag, environment variable
// or profile names one.
const DefaultAddr = "127.0.0.1:7400"

// globals are the connection settings every API command shares.
type globals struct {
	addr, ca, cert, key, token, company string
	profile, config                     string
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.profile, "profile", "", "profile of the profiles file to use (env TETHER_PROFILE; default: the file's default_profile)")
	fs.StringVar(&g.config, "config", "", "profiles file (env TETHER_CONFIG; default $XDG_CONFIG_HOME/tether/config.json)")
	fs.StringVar(&g.addr, "addr", "", "executor address; several, comma separated, are replicas a watch resumes on when one drains (env TETHER_EXECUTOR_ADDR; default "+DefaultAddr+")")
	fs.StringVar(&g.ca, "ca", "", "CA bundle for the executor's TLS certificate (env TETHER_EXECUTOR_CA)")
	fs.StringVar(&g.cert, "cert", "", "client certificate for mTLS to the executor, with -ca and -key (env TETHER_CLIENT_CERT)")
	fs.StringVar(&g.key, "key", "", "client private key for -cert (env TETHER_CLIENT_KEY)")
	fs.StringVar(&g.token, "token", "", "bearer token (a JWT, SPEC T1) sent with every call (env TETHER_TOKEN); `tetherctl tokens mint` makes development ones")
	fs.StringVar(&g.company, "company", "", "the company commands act for, unless a command's own -company names another (env TETHER_COMPANY)")
}

// resolve fills every setting not given as a flag from its environment
// variable, then from the profile, then from the built-in default.
func (g *globals) resolve(fs *flag.FlagSet) (cfg *Config, cfgPath, profileName string, err error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv := func(p *string, name, env string) {
		if !set[name] {
			*p = os.Getenv(env)
		}
	}
	fromEnv(&g.profile, "profile", "TETHER_PROFILE")
	fromEnv(&g.config, "config", "TETHER_CONFIG")
	fromEnv(&g.addr, "addr", "TETHER_EXECUTOR_ADDR")
	fromEnv(&g.ca, "ca", "TETHER_EXECUTOR_CA")
	fromEnv(&g.cert, "cert", "TETHER_CLIENT_CERT")
	fromEnv(&g.key, "key", "TETHER_CLIENT_KEY")
	fromEnv(&g.token, "token", "TETHER_TOKEN")
	fromEnv(&g.company, "company", "TETHER_COMPANY")
	cfgPath = g.config
	if cfgPath == "" {
		cfgPath = defaultConfigPath()
	}
	if cfg, err = loadConfig(cfgPath, g.config != ""); err != nil {
		return nil, "", "", err
	}
	profileName, p, err := cfg.selectProfile(g.profile, cfgPath)
	if err != nil {
		return nil, "", "", err
	}
	orProfile := func(v *string, pv string) {
		if *v == "" {
			*v = pv
		}
	}
	orProfile(&g.addr, p.Address)
	orProfile(&g.ca, p.CA)
	orProfile(&g.cert, p.Cert)
	orProfile(&g.key, p.Key)
	orProfile(&g.company, p.Company)
	if g.token == "" {
		if g.token, err = p.token(); err != nil {
			return nil, "", "", err
		}
	}
	orProfile(&g.addr, DefaultAddr)
	return cfg, cfgPath, profileName, nil
}

func run(args []string) error { return runIO(args, os.Stdin, os.Stdout) }

// runIO runs a command line with the API commands' input and output on
// stdin and stdout.
func runIO(args []string, stdin io.Reader, stdout io.Writer) error {
	global := flag.NewFlagSet("tetherctl", flag.ContinueOnError)
	var g globals
	g.register(global)
	showVersion := global.Bool("version", false, "print the build (version, commit, Go) and exit")
	global.Usage = func() { printUsage(os.Stderr, global) }
	if err := global.Parse(args); err != nil {
		return err
	}
	if *showVersion || global.Arg(0) == "version" {
		fmt.Println(buildinfo.Read().Line("tetherctl"))
		return nil
	}
	if global.NArg() == 0 {
		global.Usage()
		return errors.New("missing command")
	}
	switch global.Arg(0) {
	case "help":
		printUsage(stdout, global)
		return nil
	case "certs":
		return certs(global.Args()[1:])
	case "grant":
		return grantCmd(global.Args()[1:])
	case "audit":
		return auditCmd(context.Background(), global.Args()[1:], os.Stdout)
	case "tokens":
		return tokensCmd(global.Args()[1:], os.Stdout)
	}
	cfg, cfgPath, profileName, err := g.resolve(global)
	if err != nil {
		return err
	}
	if global.Arg(0) == "profiles" {
		return profilesCmd(cfg, cfgPath, profileName, global.Args()[1:], stdout)
	}
	cmd, rest := findCommand(global.Args())
	if cmd == nil {
		global.Usage()
		return fmt.Errorf("unknown command %q", strings.Join(global.Args()[:min(2, global.NArg())], " "))
	}
	var dialOpts []grpc.DialOption
	if g.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(tenancy.Bearer(strings.TrimSpace(g.token))))
	}
	client := &replicaSet{}
	for _, a := range strings.Split(g.addr, ",") {
		conn, err := (&grpcx.Config{TLSCertFile: g.cert, TLSKeyFile: g.key}).DialPeer(strings.TrimSpace(a), g.ca, dialOpts...)
		if err != nil {
			return err
		}
		defer conn.Close()
		if client.conn == nil {
			client.conn = conn
		}
		client.all = append(client.all, executorv1.NewExecutorServiceClient(conn))
	}
	client.ExecutorServiceClient = client.all[0]
	// With OTEL_EXPORTER_OTLP_ENDPOINT set, a command's calls are one
	// trace that starts here.
	stopTracing, err := telemetry.Setup(context.Background(), "tetherctl", "", nil)
	if err != nil {
		return err
	}
	ctx, span := telemetry.Tracer().Start(context.Background(), "tetherctl "+cmd.name)
	defer func() {
		span.End()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	c := &ctl{exec: client, fleet: executorv1.NewGatewayRegistryClient(client.conn), conn: client.conn,
		company: g.company, out: stdout, in: stdin}
	return cmd.run(ctx, c, rest)
}

// replicaSet is the executor replicas -addr names: calls go to the first; a
// watch resumes on the next one when a replica drains.
type replicaSet struct {
	executorv1.ExecutorServiceClient
	all  []executorv1.ExecutorServiceClient
	conn grpc.ClientConnInterface // the first replica's connection
}

// errViolations: the audit found broken promises (exit status 1).
var errViolations = errors.New("audit found violations")

// auditCmd reads the executor's database (a database URL only, SPEC X1)
// and prints the audit report, as text or JSON. The audit has no RPC: it
// reads the database, so it needs no executor.
func auditCmd(ctx context.Context, args []string, w io.Writer) error {
	fs := newFlagSet("audit")
	dsn := envflag.String(fs, "database-url", "TETHER_DATABASE_URL", "", "the executor's PostgreSQL URL (required)")
	runID := fs.String("run", "", "audit this run only")
	since := fs.String("since", "", "audit the runs submitted since a time (RFC 3339) or within a duration (e.g. 1h)")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dsn == "" {
		return errors.New("audit: -database-url (or TETHER_DATABASE_URL) is required")
	}
	filter := store.AuditFilter{RunID: *runID}
	if *since != "" {
		if d, err := time.ParseDuration(*since); err == nil {
			filter.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, *since); err == nil {
			filter.Since = t
		} else {
			return fmt.Errorf("audit: -since %q is neither a duration nor an RFC 3339 time", *since)
		}
	}
	st, err := store.Open(ctx, *dsn, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	hist, err := st.AuditRows(ctx, filter)
	if err != nil {
		return err
	}
	rep := audit.Check(hist)
	if *out == outJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.WriteText(w)
	}
	if !rep.Clean() {
		return errViolations
	}
	return nil
}
