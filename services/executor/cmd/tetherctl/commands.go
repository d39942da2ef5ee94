package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// ctl is what an API command works with.
type ctl struct {
	exec  *replicaSet
	fleet executorv1.GatewayRegistryClient
	conn  grpc.ClientConnInterface
	// company is the global -company, TETHER_COMPANY or the profile's.
	company string
	out     io.Writer
	in      io.Reader
}

// command is one API command and the gRPC methods it calls.
type command struct {
	// name is the command as typed: one word, or a group and a verb.
	name    string
	methods []string
	usage   string
	run     func(ctx context.Context, c *ctl, args []string) error
}

// commands is tetherctl's API surface. TestU1_EveryPublicMethodHasACommand
// checks that every method of ExecutorService and GatewayRegistry (but
// RegisterGateway, the gateways' own) is called by one of them.
var commands = []command{
	{"submit", []string{executorv1.ExecutorService_SubmitRun_FullMethodName, executorv1.ExecutorService_WatchRun_FullMethodName},
		"submit a run: -session S -prompt P [-provider codex|opencode|acpx] [-model M] [-env K=V]... [-secret ENV=NAME]... [-input-file F] [-watch]", submitCmd},
	{"get", []string{executorv1.ExecutorService_GetRun_FullMethodName}, "a run: RUN_ID", getCmd},
	{"list", []string{executorv1.ExecutorService_ListRuns_FullMethodName},
		"runs, newest first: [-session S] [-state S] [-page-size N] [-page-token T | -all]", listCmd},
	{"watch", []string{executorv1.ExecutorService_WatchRun_FullMethodName}, "a run's events, live: RUN_ID [-after SEQ]", watchCmd},
	{"cancel", []string{executorv1.ExecutorService_CancelRun_FullMethodName}, "cancel a run: RUN_ID [-scope run|turn|issue] [-reason R]", cancelCmd},
	{"steering state", []string{executorv1.ExecutorService_GetSteeringState_FullMethodName}, "whether a run's turn can be steered now: RUN_ID", steeringStateCmd},
	{"steer", []string{executorv1.ExecutorService_SteerRun_FullMethodName}, "send a message into a run's active turn: RUN_ID -message M [-timeout D]", steerCmd},
	{"resolve", []string{executorv1.ExecutorService_ResolveRuntimeRequest_FullMethodName, executorv1.ExecutorService_GetSteeringState_FullMethodName},
		"answer a runtime request (an approval): RUN_ID -request-id ID (-decision accept|decline|... | -resolution JSON) [-turn-id T]", resolveCmd},
	{"tool complete", []string{executorv1.ExecutorService_CompleteToolCall_FullMethodName}, "answer a dynamic tool call: RUN_ID -call-id ID -text T [-failed]", toolCompleteCmd},
	{"sessions get", []string{executorv1.ExecutorService_GetSession_FullMethodName}, "a session's scopes: -session S", sessionsGetCmd},
	{"sessions close", []string{executorv1.ExecutorService_CloseSession_FullMethodName}, "close an idle warm session: -session S [-suspend] [-reason R]", sessionsCloseCmd},
	{"sessions replace", []string{executorv1.ExecutorService_ReplaceSession_FullMethodName},
		"give a session's provider thread up (SPEC F3, audited): -session S -reason WHY [-agent A] [-by NAME]", sessionsReplaceCmd},
	{"replace-session", []string{executorv1.ExecutorService_ReplaceSession_FullMethodName}, "the same as sessions replace", sessionsReplaceCmd},
	{"interactions list", []string{executorv1.ExecutorService_ListInteractions_FullMethodName},
		"durable interactions: [-run R] [-status pending|answered] [-page-size N] [-page-token T | -all]", interactionsListCmd},
	{"interactions get", []string{executorv1.ExecutorService_GetInteraction_FullMethodName}, "one interaction: ID", interactionsGetCmd},
	{"interactions show", []string{executorv1.ExecutorService_GetInteraction_FullMethodName}, "the same as interactions get", interactionsGetCmd},
	{"interactions answer", []string{executorv1.ExecutorService_AnswerInteraction_FullMethodName, executorv1.ExecutorService_WatchRun_FullMethodName},
		"answer an interaction: ID -answer Q=OPT[,OPT] [-text Q=TEXT] [-watch]", interactionsAnswerCmd},
	{"secrets put", []string{executorv1.ExecutorService_PutSecret_FullMethodName}, "store or rotate a secret: -name N [-value-file F, default stdin]", secretsPutCmd},
	{"secrets list", []string{executorv1.ExecutorService_ListSecrets_FullMethodName}, "a company's secrets (names and versions, never values)", secretsListCmd},
	{"secrets delete", []string{executorv1.ExecutorService_DeleteSecret_FullMethodName}, "delete a secret: -name N", secretsDeleteCmd},
	{"delete", []string{executorv1.ExecutorService_DeleteRun_FullMethodName},
		"delete an ended run with its events, interactions and superseded checkpoints (operator; SPEC L1): RUN_ID [-reason R]", deleteCmd},
	{"purge-company", []string{executorv1.ExecutorService_PurgeCompany_FullMethodName},
		"delete everything of a company: runs, events, checkpoints and their archives, secrets (fleet operator; SPEC L1) [-reason R]", purgeCompanyCmd},
	{"gateways list", []string{executorv1.GatewayRegistry_ListGateways_FullMethodName},
		"the gateway registry: state, load, capacity, placed scopes, last heartbeat, drain [-page-size N] [-page-token T]", gatewaysListCmd},
	{"gateways drain", []string{executorv1.GatewayRegistry_DrainGateway_FullMethodName, executorv1.GatewayRegistry_ListGateways_FullMethodName},
		"drain a gateway: ID [-reason R] [-wait] [-timeout D]", gatewaysDrainCmd},
	{"companies limits get", []string{executorv1.Companies_GetCompanyLimits_FullMethodName},
		"a company's limits and budget (SPEC Q1, Q2), its own or the default's: [-company C | -company '*']", companiesLimitsGetCmd},
	{"companies limits set", []string{executorv1.Companies_GetCompanyLimits_FullMethodName, executorv1.Companies_SetCompanyLimits_FullMethodName},
		"set a company's limits (fleet operator, audited; unset flags keep their values): [-company C | '*'] [-max-running-runs N|none] [-max-warm-sessions N|none] [-max-queued-runs N|none] [-weight W] [-monthly-budget-usd USD|none] [-budget-warn-ratio R] [-budget-policy finish_turn|cancel] [-reason R]",
		companiesLimitsSetCmd},
	{"companies usage", []string{executorv1.Companies_GetCompanyUsage_FullMethodName},
		"what a company uses now against its limits: running, queued, warm sessions, this month's spend, refusals (SPEC Q4)", companiesUsageCmd},
	{"health", nil, "gRPC health of the service at -addr (any tether service); exit 1 unless SERVING [-service S] [-timeout 3s]", healthCmd},
}

// groupDefaults are the verbs a bare group name means.
var groupDefaults = map[string]string{"gateways": "list", "interactions": "list", "sessions": "get", "secrets": "list"}

// findCommand returns the command args name and the arguments after its name.
func findCommand(args []string) (*command, []string) {
	if len(args) == 0 {
		return nil, nil
	}
	// The longest name first: a group, a subgroup and a verb
	// (companies limits set), a group and a verb, a word.
	for n := min(len(args), 3); n > 1; n-- {
		for i := range commands {
			if commands[i].name == strings.Join(args[:n], " ") {
				return &commands[i], args[n:]
			}
		}
	}
	for i := range commands {
		if commands[i].name == args[0] {
			return &commands[i], args[1:]
		}
	}
	if verb, ok := groupDefaults[args[0]]; ok && (len(args) == 1 || strings.HasPrefix(args[1], "-")) {
		return findCommand(append([]string{args[0], verb}, args[1:]...))
	}
	return nil, nil
}

func printUsage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprintln(w, "usage: tetherctl [global flags] <command> [flags]   (every API command takes -o table|json)")
	fmt.Fprintln(w, "commands:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.usage)
	}
	for _, l := range [][2]string{
		{"profiles", "the profiles of the profiles file; * marks the selected one"},
		{"audit", "check the exactly-once promises in the executor's database; exit 1 on any violation (-database-url or TETHER_DATABASE_URL, [-since 1h|RFC3339] [-run RUN_ID])"},
		{"certs", "certs init DIR [-host H]... | certs issue DIR -name N -role acme:writer: a development PKI (SPEC T1)"},
		{"tokens", "tokens init DIR | tokens mint -key DIR/token-signing.key -subject N -role acme:writer [-ttl 24h]: development tokens"},
		{"grant", "print a gateway grant for ListRunners/GetRunner (-key-file, -gateway-id, -method)"},
		{"version", "print the build (version, commit, Go); also -version"},
	} {
		fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "global flags (a flag overrides its environment variable, which overrides the profile):")
	global.SetOutput(w)
	global.PrintDefaults()
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return fs
}

// output is -o: table (for people) or json (the response as protojson).
type output string

const (
	outTable output = "table"
	outJSON  output = "json"
)

func (o *output) String() string { return string(*o) }

func (o *output) Set(v string) error {
	switch output(v) {
	case outTable, outJSON:
		*o = output(v)
		return nil
	}
	return fmt.Errorf("want table or json, not %q", v)
}

// outputFlag registers -o (and -json, the same as -o json).
func outputFlag(fs *flag.FlagSet) *output {
	o := outTable
	fs.Var(&o, "o", "output: table or json (json: the response as protojson)")
	fs.BoolFunc("json", "the same as -o json", func(string) error { o = outJSON; return nil })
	return &o
}

// emit prints m as protojson with -o json, else runs table.
func emit(w io.Writer, o *output, m proto.Message, table func() error) error {
	if *o == outJSON {
		writeJSON(w, m)
		return nil
	}
	return table()
}

func writeJSON(w io.Writer, m proto.Message) {
	b, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	fmt.Fprintln(w, string(b))
}

// companyFlag registers a command's -company.
func companyFlag(fs *flag.FlagSet, what string) *string {
	return fs.String("company", "", what+" (default: the global -company, TETHER_COMPANY or the profile's company)")
}

// companyOf returns the command's -company, else the global one.
func (c *ctl) companyOf(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	return c.company
}

// errNoCompany is the refusal of a command that needs a company none named.
var errNoCompany = errors.New("a company is required: pass -company C, set TETHER_COMPANY, or give the profile a company (tetherctl profiles)")

// requireCompany returns the company a command acts for, or errNoCompany.
func (c *ctl) requireCompany(cmd, flagValue string) (string, error) {
	if v := c.companyOf(flagValue); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s: %w", cmd, errNoCompany)
}

// parseWithID parses a command's flags around one positional id (before
// or after the flags).
func parseWithID(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
		}
		return fs.Parse(append([]string{args[0]}, fs.Args()...))
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: exactly one id is required", fs.Name())
	}
	return nil
}

// pageFlags are a list command's paging flags.
type pageFlags struct {
	size  *int
	token *string
	all   *bool
}

func pagingFlags(fs *flag.FlagSet, def int) pageFlags {
	p := pageFlags{
		size:  fs.Int("page-size", def, "rows per page (1..500)"),
		token: fs.String("page-token", "", "continue a listing: the next_page_token a call with the same filters printed"),
		all:   fs.Bool("all", false, "follow next_page_token to the last page"),
	}
	fs.IntVar(p.size, "limit", def, "the same as -page-size")
	return p
}

// moreHint tells a person where the next page is (stderr: a table on
// stdout stays a table).
func moreHint(next string) {
	if next != "" {
		fmt.Fprintf(os.Stderr, "(more: -page-token %s, or -all)\n", next)
	}
}
