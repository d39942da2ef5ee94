// Command tetherctl talks to the executor: submit runs, watch them live, get
// and list them.
//
//	tetherctl submit -prompt "hello" -session demo [-watch]
//	tetherctl watch RUN_ID [-json] [-after N]
//	tetherctl get RUN_ID
//	tetherctl list [-session S] [-state succeeded]
//	tetherctl audit -database-url URL [-since 1h|RFC3339] [-run RUN_ID] [-json]
//	tetherctl interactions list|show|answer (see interactions.go)
//	tetherctl replace-session -session S -reason WHY [-by NAME]
//	tetherctl -addr HOST:PORT health (probes: exit 1 unless SERVING)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/buildinfo"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/audit"
	"github.com/tether-run/tether/services/executor/internal/cli"
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

const usage = `usage: tetherctl [-addr HOST:PORT] <command> [flags]
commands:
  submit   submit a run (-prompt, -session, -company, -agent, -lifecycle, -cwd, -labels, -secret ENV=NAME, -run-id, -watch)
  watch    stream a run's events live (RUN_ID [-json] [-after N])
  get      print a run as JSON (RUN_ID)
  list     list runs (-session, -state, -limit)
  version  print the build (version, commit, Go); also -version
  cancel   cancel a run (RUN_ID [-reason R] [-scope run|turn|issue])
  certs    certs init DIR [-host H]...: a development CA, service certificates and the grant key pair
           certs issue DIR -name N -role acme:writer [-role ...]: a client certificate naming a principal (SPEC T1)
  tokens   tokens init DIR: a token signing key and the executor's JWKS (-auth-jwks)
           tokens mint -key DIR/token-signing.key -subject N -role acme:writer|acme:reader|operator [-ttl 24h]: a development token
  grant    print a gateway grant for ListRunners/GetRunner (-key-file, -gateway-id, -method)
  audit    check the exactly-once promises in the executor's database; exit 1 on any violation
           (-database-url or TETHER_DATABASE_URL, [-since 1h|RFC3339] [-run RUN_ID] [-json])
  interactions  list [-run R] [-status S] | show ID | answer ID -answer Q=OPT[,OPT] [-text Q=TEXT] [-watch]
  gateways list the runner gateway registry: state (active|draining|lost), load, sessions/capacity, placed scopes, last heartbeat, drain ([-json])
           gateways drain ID [-reason R] [-wait] [-timeout D]: no new placements there; its scopes move to other gateways
  replace-session  give a session's provider thread up after its state was lost (SPEC F3; audited):
           -session S -reason WHY [-company C] [-agent A] [-by NAME]; the next run starts a fresh provider session
  secrets  a company's secrets (SPEC T3; values never printed): put -name N [-company C] [-value-file F, default stdin] |
           list [-company C] | delete -name N [-company C]; runs name them with submit -secret ENV=NAME
  health   gRPC health of the service at -addr (any tether service); exit 1 unless SERVING ([-service S] [-timeout 3s])
identity: -token (TETHER_TOKEN) sends a bearer token; -cert/-key present a client certificate
environment: TETHER_EXECUTOR_ADDR (default 127.0.0.1:7400), TETHER_EXECUTOR_CA, TETHER_CLIENT_CERT, TETHER_CLIENT_KEY, TETHER_TOKEN`

func run(args []string) error {
	global := flag.NewFlagSet("tetherctl", flag.ContinueOnError)
	addr := grpcx.StringFlag(global, "addr", "TETHER_EXECUTOR_ADDR", "127.0.0.1:7400", "executor address; several, comma separated, are replicas a watch resumes on when one drains")
	ca := grpcx.StringFlag(global, "ca", "TETHER_EXECUTOR_CA", "", "CA bundle for the executor's TLS certificate")
	cert := grpcx.StringFlag(global, "cert", "TETHER_CLIENT_CERT", "", "client certificate for mTLS to the executor (with -ca and -key)")
	key := grpcx.StringFlag(global, "key", "TETHER_CLIENT_KEY", "", "client private key for -cert")
	token := grpcx.StringFlag(global, "token", "TETHER_TOKEN", "", "bearer token (a JWT, SPEC T1) sent with every call; `tetherctl tokens mint` makes development ones")
	showVersion := global.Bool("version", false, "print the build (version, commit, Go) and exit")
	global.Usage = func() { fmt.Fprintln(os.Stderr, usage) }
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
	case "certs":
		return certs(global.Args()[1:])
	case "grant":
		return grantCmd(global.Args()[1:])
	case "audit":
		return auditCmd(context.Background(), global.Args()[1:], os.Stdout)
	case "tokens":
		return tokensCmd(global.Args()[1:], os.Stdout)
	}
	var dialOpts []grpc.DialOption
	if *token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(tenancy.Bearer(strings.TrimSpace(*token))))
	}
	client := &replicaSet{}
	for _, a := range strings.Split(*addr, ",") {
		conn, err := (&grpcx.Config{TLSCertFile: *cert, TLSKeyFile: *key}).DialPeer(strings.TrimSpace(a), *ca, dialOpts...)
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
	cmd, rest := global.Arg(0), global.Args()[1:]
	// With OTEL_EXPORTER_OTLP_ENDPOINT set, a command's calls are one
	// trace that starts here.
	stopTracing, err := telemetry.Setup(context.Background(), "tetherctl", "", nil)
	if err != nil {
		return err
	}
	ctx, span := telemetry.Tracer().Start(context.Background(), "tetherctl "+cmd)
	defer func() {
		span.End()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	switch cmd {
	case "submit":
		return submit(ctx, client, rest)
	case "watch":
		return watch(ctx, client, rest)
	case "get":
		return get(ctx, client, rest)
	case "list":
		return list(ctx, client, rest)
	case "cancel":
		return cancelRun(ctx, client, rest)
	case "interactions":
		return interactions(ctx, client, rest)
	case "health":
		return health(ctx, client.conn, rest)
	case "gateways":
		return gatewaysCmd(ctx, client.conn, rest, os.Stdout)
	case "replace-session":
		return replaceSessionCmd(ctx, client, rest, os.Stdout)
	case "secrets":
		return secretsCmd(ctx, client, rest, os.Stdin, os.Stdout)
	}
	global.Usage()
	return fmt.Errorf("unknown command %q", cmd)
}

// The binding tetherctl submits under unless told otherwise: the one the
// documentation's grpcurl examples use, so GetSession/CloseSession with
// company_id "acme" find tetherctl's sessions.
const (
	DefaultCompany = "acme"
	DefaultAgent   = "agent-1"
)

// replicaSet is the executor replicas -addr names: calls go to the first; a
// watch resumes on the next one when a replica drains.
type replicaSet struct {
	executorv1.ExecutorServiceClient
	all  []executorv1.ExecutorServiceClient
	conn grpc.ClientConnInterface // the first replica's connection
}

func submit(ctx context.Context, c *replicaSet, args []string) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	var spec cli.InputSpec
	runID := fs.String("run-id", "", "run id (default: generated)")
	fs.StringVar(&spec.Prompt, "prompt", "", "the task for this turn (required)")
	fs.StringVar(&spec.Session, "session", "", "normalized session id (required)")
	fs.StringVar(&spec.Company, "company", DefaultCompany, "company id")
	fs.StringVar(&spec.Agent, "agent", DefaultAgent, "agent id")
	fs.StringVar(&spec.Issue, "issue", "", "issue id")
	fs.StringVar(&spec.Lifecycle, "lifecycle", "warm", "warm or per_turn")
	fs.StringVar(&spec.Cwd, "cwd", "", "workspace directory on the runner host, inside <workspace-root>/<company> (default: assigned)")
	fs.StringVar(&spec.Model, "model", "", "provider model")
	fs.StringVar(&spec.Labels, "labels", "", "placement labels the session's gateway must carry, e.g. zone=a,gpu=false (SPEC F2)")
	doWatch := fs.Bool("watch", false, "watch the run after submitting")
	asJSON := fs.Bool("json", false, "print raw JSON")
	refs := secretRefs{}
	fs.Var(refs, "secret", "ENV=NAME: the provider's variable ENV gets the company secret NAME (repeatable; tetherctl secrets put)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *runID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		*runID = "run-" + hex.EncodeToString(b)
	}
	in, err := spec.Input()
	if err != nil {
		return err
	}
	if len(refs) > 0 {
		in.Environment = &prpv1.ProviderEnvironment{SecretRefs: refs}
	}
	resp, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: *runID, Input: in})
	if err != nil {
		return err
	}
	if *asJSON {
		printJSON(resp)
	} else {
		verb := "submitted"
		if !resp.GetCreated() {
			verb = "already submitted"
		}
		fmt.Printf("%s %s (%s)\n", verb, resp.GetRun().GetRunId(), strings.ToLower(strings.TrimPrefix(resp.GetRun().GetState().String(), "RUN_STATE_")))
	}
	if *doWatch {
		return watchRun(ctx, c, *runID, 0, *asJSON, os.Stdout)
	}
	return nil
}

func watch(ctx context.Context, c *replicaSet, args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print raw events as JSON lines")
	after := fs.Uint64("after", 0, "start after this event cursor")
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	return watchRun(ctx, c, fs.Arg(0), *after, *asJSON, os.Stdout)
}

// parseWithID accepts the run id before or after the flags.
func parseWithID(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return fs.Parse(append([]string{args[0]}, fs.Args()...))
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("exactly one RUN_ID is required")
	}
	return nil
}

func watchRun(ctx context.Context, c *replicaSet, runID string, after uint64, asJSON bool, w io.Writer) error {
	r := &cli.Renderer{W: w, JSON: asJSON}
	defer r.Flush()
	return cli.Watch(ctx, c.all, runID, after, r.Event)
}

func get(ctx context.Context, c executorv1.ExecutorServiceClient, args []string) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	company := fs.String("company", "", "the run's company, when more than one company you can read has a run of this id")
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	resp, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: fs.Arg(0), CompanyId: *company})
	if err != nil {
		return err
	}
	printJSON(resp.GetRun())
	return nil
}

func list(ctx context.Context, c executorv1.ExecutorServiceClient, args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	session := fs.String("session", "", "only this session")
	state := fs.String("state", "", "only this state: queued|running|succeeded|failed|cancelled")
	limit := fs.Int("limit", 50, "rows")
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := &executorv1.ListRunsRequest{PageSize: int32(*limit), NormalizedSessionId: *session}
	if *state != "" {
		v, ok := executorv1.RunState_value["RUN_STATE_"+strings.ToUpper(*state)]
		if !ok {
			return fmt.Errorf("unknown state %q", *state)
		}
		req.State = executorv1.RunState(v)
	}
	resp, err := c.ListRuns(ctx, req, grpc.WaitForReady(false))
	if err != nil {
		return err
	}
	return printRuns(os.Stdout, resp.GetRuns())
}

// printRuns prints runs as list's table.
func printRuns(w io.Writer, runs []*executorv1.Run) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tCOMPANY\tSESSION\tATTEMPT\tEVENTS\tCREATED\tFAILURE")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.GetRunId(),
			strings.ToLower(strings.TrimPrefix(r.GetState().String(), "RUN_STATE_")),
			r.GetInput().GetBinding().GetCompanyId(), r.GetInput().GetSession().GetNormalizedSessionId(),
			r.GetAttempt(), r.GetEventCount(), r.GetCreatedAt().AsTime().Local().Format(time.DateTime), r.GetFailure().GetCode())
	}
	return tw.Flush()
}

func printJSON(m proto.Message) {
	b, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	fmt.Println(string(b))
}

func cancelRun(ctx context.Context, c executorv1.ExecutorServiceClient, args []string) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	reason := fs.String("reason", "cancelled by tetherctl", "reason, kept in the audit trail")
	scope := fs.String("scope", "run", "run, turn or issue")
	company := fs.String("company", "", "the run's company, when more than one company you can read has a run of this id")
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	v, ok := executorv1.CancellationScope_value["CANCELLATION_SCOPE_"+strings.ToUpper(*scope)]
	if !ok || v == 0 {
		return fmt.Errorf("unknown scope %q", *scope)
	}
	resp, err := c.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: fs.Arg(0), CompanyId: *company, Scope: executorv1.CancellationScope(v), Reason: *reason})
	if err != nil {
		return err
	}
	if !resp.GetActive() {
		fmt.Printf("%s had already ended: nothing to cancel\n", fs.Arg(0))
		return nil
	}
	rec := resp.GetCancellation()
	fmt.Printf("%s: cancellation %s (provider told to stop: %t; intent audit %s)\n",
		fs.Arg(0), rec.GetDispatchState(), rec.GetDispatched(), rec.GetIntentAuditId())
	return nil
}

// errViolations: the audit found broken promises (exit status 1).
var errViolations = errors.New("audit found violations")

// auditCmd reads the executor's database (a database URL only, SPEC X1)
// and prints the audit report, as text or JSON.
func auditCmd(ctx context.Context, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	dsn := grpcx.StringFlag(fs, "database-url", "TETHER_DATABASE_URL", "", "the executor's PostgreSQL URL (required)")
	runID := fs.String("run", "", "audit this run only")
	since := fs.String("since", "", "audit the runs submitted since a time (RFC 3339) or within a duration (e.g. 1h)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
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
	st, err := store.Open(ctx, *dsn)
	if err != nil {
		return err
	}
	defer st.Close()
	hist, err := st.AuditRows(ctx, filter)
	if err != nil {
		return err
	}
	rep := audit.Check(hist)
	if *asJSON {
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
