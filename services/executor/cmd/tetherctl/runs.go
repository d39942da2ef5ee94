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
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// submitCmd submits a run. Its input is built from flags, or read from
// -input-file (an ExecutionInput as protojson, e.g. another run's
// `get -o json` .input) with the flags given on top of it.
func submitCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("submit")
	var spec cli.InputSpec
	runID := fs.String("run-id", "", "run id (default: generated)")
	fs.StringVar(&spec.Prompt, "prompt", "", "the task for this turn (required)")
	fs.StringVar(&spec.Session, "session", "", "normalized session id (required)")
	company := companyFlag(fs, "the run's company (required)")
	fs.StringVar(&spec.Agent, "agent", DefaultAgent, "agent id")
	fs.StringVar(&spec.Issue, "issue", "", "issue id")
	fs.StringVar(&spec.Lifecycle, "lifecycle", "warm", "warm or per_turn")
	fs.StringVar(&spec.Cwd, "cwd", "", "workspace directory on the runner host, inside <workspace-root>/<company> (default: assigned)")
	fs.StringVar(&spec.Provider, "provider", "codex", "provider kind: codex, opencode (with -model provider/model) or acpx (with -provider-agent)")
	fs.StringVar(&spec.Model, "model", "", "provider model")
	fs.StringVar(&spec.ProviderAgent, "provider-agent", "", "acpx: the agent (e.g. codex, claude)")
	fs.StringVar(&spec.PermissionMode, "permission-mode", "", "opencode/acpx permission mode")
	fs.StringVar(&spec.Labels, "labels", "", "placement labels the session's gateway must carry, e.g. zone=a,gpu=false (SPEC F2)")
	inputFile := fs.String("input-file", "", "an ExecutionInput as protojson ('-': stdin); flags given override its fields")
	doWatch := fs.Bool("watch", false, "watch the run after submitting")
	out := outputFlag(fs)
	refs := keyValues{}
	fs.Var(refs, "secret", "ENV=NAME: the provider's variable ENV gets the company secret NAME (repeatable; tetherctl secrets put)")
	fs.Var(refs, "secret-ref", "the same as -secret")
	env := keyValues{}
	fs.Var(env, "env", "KEY=VALUE: a variable of the provider's environment (repeatable; not for secrets: use -secret)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("submit: unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	spec.Company = c.companyOf(*company)
	in, err := submitInput(spec, set, *inputFile, c.in)
	if err != nil {
		return err
	}
	if in.GetBinding().GetCompanyId() == "" {
		return fmt.Errorf("submit: %w", errNoCompany)
	}
	if in.GetSession().GetNormalizedSessionId() == "" || in.GetTask().GetPrompt() == "" {
		return errors.New("submit: -session and -prompt are required (or an -input-file that has them)")
	}
	if len(refs) > 0 || len(env) > 0 {
		if in.Environment == nil {
			in.Environment = &prpv1.ProviderEnvironment{}
		}
		if len(refs) > 0 {
			in.Environment.SecretRefs = refs
		}
		if len(env) > 0 {
			in.Environment.Configured = env
		}
	}
	if *runID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		*runID = "run-" + hex.EncodeToString(b)
	}
	resp, err := c.exec.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: *runID, Input: in})
	if err != nil {
		return err
	}
	err = emit(c.out, out, resp, func() error {
		verb := "submitted"
		if !resp.GetCreated() {
			verb = "already submitted"
		}
		fmt.Fprintf(c.out, "%s %s (%s)\n", verb, resp.GetRun().GetRunId(), stateName(resp.GetRun().GetState()))
		return nil
	})
	if err != nil || !*doWatch {
		return err
	}
	return watchRun(ctx, c, *runID, in.GetBinding().GetCompanyId(), 0, *out == outJSON)
}

// submitInput builds the run's input: from the flags, or from the input
// file with the flags that were given (set) on top.
func submitInput(spec cli.InputSpec, set map[string]bool, file string, stdin io.Reader) (*prpv1.ExecutionInput, error) {
	fromFlags, err := spec.Input()
	if err != nil {
		return nil, err
	}
	if file == "" {
		return fromFlags, nil
	}
	var b []byte
	if file == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, 8<<20))
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, err
	}
	in := &prpv1.ExecutionInput{}
	if err := protojson.Unmarshal(b, in); err != nil {
		return nil, fmt.Errorf("submit -input-file %s: not an ExecutionInput as protojson: %w", file, err)
	}
	ensure := func() {
		if in.Binding == nil {
			in.Binding = &prpv1.Binding{}
		}
		if in.Task == nil {
			in.Task = &prpv1.Task{}
		}
		if in.Session == nil {
			in.Session = &prpv1.Session{}
		}
		if in.Provider == nil {
			in.Provider = &prpv1.Provider{}
		}
		if in.Workspace == nil {
			in.Workspace = &prpv1.Workspace{}
		}
	}
	ensure()
	if spec.Company != "" && (set["company"] || in.Binding.CompanyId == "") {
		in.Binding.CompanyId = spec.Company
	}
	for name, apply := range map[string]func(){
		"prompt":          func() { in.Task.Prompt = spec.Prompt },
		"session":         func() { in.Session.NormalizedSessionId = spec.Session },
		"agent":           func() { in.Binding.AgentId = spec.Agent },
		"issue":           func() { in.Binding.IssueId = spec.Issue },
		"lifecycle":       func() { in.Session.Lifecycle = fromFlags.GetSession().GetLifecycle() },
		"cwd":             func() { in.Workspace.Cwd = spec.Cwd },
		"model":           func() { in.Provider.Model = spec.Model },
		"provider-agent":  func() { in.Provider.Agent = spec.ProviderAgent },
		"permission-mode": func() { in.Provider.PermissionMode = spec.PermissionMode },
		"labels":          func() { in.Runner = fromFlags.GetRunner() },
		"provider": func() {
			in.Provider.Kind = spec.Provider
			in.Session.DriverKind = scope.DefaultDriverKind(spec.Provider)
		},
	} {
		if set[name] {
			apply()
		}
	}
	if in.Binding.AgentId == "" {
		in.Binding.AgentId = spec.Agent
	}
	return in, nil
}

// keyValues is a repeated KEY=VALUE flag.
type keyValues map[string]string

func (s keyValues) String() string { return fmt.Sprint(map[string]string(s)) }

func (s keyValues) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want KEY=VALUE", v)
	}
	s[k] = val
	return nil
}

func stateName(s executorv1.RunState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "RUN_STATE_"))
}

func watchCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("watch")
	after := fs.Uint64("after", 0, "start after this event cursor (a seq)")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	return watchRun(ctx, c, fs.Arg(0), c.companyOf(*company), *after, *out == outJSON)
}

// watchRun prints a run's events: rendered, or one protojson
// WatchRunResponse event per line with asJSON.
func watchRun(ctx context.Context, c *ctl, runID, company string, after uint64, asJSON bool) error {
	r := &cli.Renderer{W: c.out, JSON: asJSON}
	defer r.Flush()
	return cli.Watch(ctx, c.exec.all, runID, company, after, r.Event)
}

func getCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("get")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	resp, err := c.exec.GetRun(ctx, &executorv1.GetRunRequest{RunId: fs.Arg(0), CompanyId: c.companyOf(*company)})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		r := resp.GetRun()
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		row := func(k, v string) {
			if v != "" {
				fmt.Fprintf(tw, "%s\t%s\n", k, v)
			}
		}
		row("run", r.GetRunId())
		row("state", stateName(r.GetState()))
		row("phase", r.GetPhase())
		row("company", r.GetInput().GetBinding().GetCompanyId())
		row("session", r.GetInput().GetSession().GetNormalizedSessionId())
		row("provider", r.GetInput().GetProvider().GetKind())
		row("attempt", fmt.Sprint(r.GetAttempt()))
		row("events", fmt.Sprint(r.GetEventCount()))
		row("submitted by", r.GetSubmittedBy())
		row("created", r.GetCreatedAt().AsTime().Local().Format(time.DateTime))
		if r.GetEndedAt() != nil {
			row("ended", r.GetEndedAt().AsTime().Local().Format(time.DateTime))
		}
		row("queued because", r.GetQueuedReason().GetCode())
		row("failure", strings.TrimSpace(r.GetFailure().GetCode()+" "+r.GetFailure().GetMessage()))
		row("final message", r.GetResult().GetFinalMessage())
		return tw.Flush()
	})
}

func listCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("list")
	session := fs.String("session", "", "only this session")
	state := fs.String("state", "", "only this state: queued|running|succeeded|failed|cancelled")
	company := companyFlag(fs, "only this company's runs")
	page := pagingFlags(fs, 50)
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := &executorv1.ListRunsRequest{PageSize: int32(*page.size), PageToken: *page.token, NormalizedSessionId: *session, CompanyId: c.companyOf(*company)}
	if *state != "" {
		v, ok := executorv1.RunState_value["RUN_STATE_"+strings.ToUpper(*state)]
		if !ok {
			return fmt.Errorf("list: unknown state %q", *state)
		}
		req.State = executorv1.RunState(v)
	}
	all := &executorv1.ListRunsResponse{}
	for {
		resp, err := c.exec.ListRuns(ctx, req, grpc.WaitForReady(false))
		if err != nil {
			return err
		}
		all.Runs = append(all.Runs, resp.GetRuns()...)
		all.NextPageToken = resp.GetNextPageToken()
		if !*page.all || resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	return emit(c.out, out, all, func() error {
		if err := printRuns(c.out, all.GetRuns()); err != nil {
			return err
		}
		moreHint(all.GetNextPageToken())
		return nil
	})
}

// printRuns prints runs as list's table.
func printRuns(w io.Writer, runs []*executorv1.Run) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tCOMPANY\tSESSION\tATTEMPT\tEVENTS\tCREATED\tFAILURE")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.GetRunId(), stateName(r.GetState()),
			r.GetInput().GetBinding().GetCompanyId(), r.GetInput().GetSession().GetNormalizedSessionId(),
			r.GetAttempt(), r.GetEventCount(), r.GetCreatedAt().AsTime().Local().Format(time.DateTime), r.GetFailure().GetCode())
	}
	return tw.Flush()
}

func cancelCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("cancel")
	reason := fs.String("reason", "cancelled by tetherctl", "reason, kept in the audit trail")
	scopeName := fs.String("scope", "run", "run, turn or issue")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	wait := fs.Duration("wait", 0, "how long the executor waits for the acknowledgement (default 5s, at most 60s)")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	v, ok := executorv1.CancellationScope_value["CANCELLATION_SCOPE_"+strings.ToUpper(*scopeName)]
	if !ok || v == 0 {
		return fmt.Errorf("cancel: unknown scope %q", *scopeName)
	}
	req := &executorv1.CancelRunRequest{RunId: fs.Arg(0), CompanyId: c.companyOf(*company), Scope: executorv1.CancellationScope(v), Reason: *reason}
	if *wait > 0 {
		req.WaitTimeout = durationpb.New(*wait)
	}
	resp, err := c.exec.CancelRun(ctx, req)
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		if !resp.GetActive() {
			fmt.Fprintf(c.out, "%s had already ended: nothing to cancel\n", fs.Arg(0))
			return nil
		}
		rec := resp.GetCancellation()
		fmt.Fprintf(c.out, "%s: cancellation %s (provider told to stop: %t; intent audit %s)\n",
			fs.Arg(0), rec.GetDispatchState(), rec.GetDispatched(), rec.GetIntentAuditId())
		return nil
	})
}

func steeringStateCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("steering state")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	resp, err := c.exec.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: fs.Arg(0), CompanyId: c.companyOf(*company)})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "%s: steering %s", fs.Arg(0), resp.GetDisposition())
		if t := resp.GetActiveTurnId(); t != "" {
			fmt.Fprintf(c.out, " (active turn %s)", t)
		}
		fmt.Fprintln(c.out)
		return nil
	})
}

func steerCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("steer")
	message := fs.String("message", "", "the user message for the active turn (required)")
	correlation := fs.String("correlation-id", "", "correlates the steer with your record (e.g. a queued comment)")
	timeout := fs.Duration("timeout", 0, "bound on the provider's acknowledgement (default 10s, at most 60s)")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	if *message == "" {
		return errors.New("steer: -message is required")
	}
	req := &executorv1.SteerRunRequest{RunId: fs.Arg(0), Message: *message, CorrelationId: *correlation, CompanyId: c.companyOf(*company)}
	if *timeout > 0 {
		req.Timeout = durationpb.New(*timeout)
	}
	resp, err := c.exec.SteerRun(ctx, req)
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "%s: steered turn %s\n", fs.Arg(0), resp.GetTurnId())
		return nil
	})
}

// resolveCmd answers a runtime request: an approval with -decision, or any
// resolution as JSON. The request's turn is the run's active turn unless
// -turn-id names it.
func resolveCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("resolve")
	requestID := fs.String("request-id", "", "the runtime request's id (its runtime_request.created event's requestId; required)")
	turnID := fs.String("turn-id", "", "the request's turn (default: the run's active turn)")
	decision := fs.String("decision", "", "an approval's decision, e.g. accept, acceptForSession, decline, cancel")
	resolution := fs.String("resolution", "", `the resolution as a JSON object, e.g. {"answers":{"q":{"answers":["yes"]}}}`)
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	if *requestID == "" || (*decision == "") == (*resolution == "") {
		return errors.New("resolve: -request-id and one of -decision or -resolution are required")
	}
	res := &structpb.Struct{}
	if *decision != "" {
		res.Fields = map[string]*structpb.Value{"decision": structpb.NewStringValue(*decision)}
	} else {
		var m map[string]any
		if err := json.Unmarshal([]byte(*resolution), &m); err != nil {
			return fmt.Errorf("resolve -resolution: not a JSON object: %w", err)
		}
		var err error
		if res, err = structpb.NewStruct(m); err != nil {
			return fmt.Errorf("resolve -resolution: %w", err)
		}
	}
	runID, comp := fs.Arg(0), c.companyOf(*company)
	if *turnID == "" {
		st, err := c.exec.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: runID, CompanyId: comp})
		if err != nil {
			return err
		}
		if st.GetActiveTurnId() == "" {
			return fmt.Errorf("resolve: run %s has no active turn now (steering %s); pass -turn-id", runID, st.GetDisposition())
		}
		*turnID = st.GetActiveTurnId()
	}
	resp, err := c.exec.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{
		RunId: runID, RequestId: *requestID, TurnId: *turnID, Resolution: res, CompanyId: comp})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "%s: request %s of turn %s resolved (command %s)\n", runID, *requestID, *turnID, resp.GetCommandId())
		return nil
	})
}

func toolCompleteCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("tool complete")
	callID := fs.String("call-id", "", "the tool call's id (its semantic_tool.input event's callId; required)")
	text := fs.String("text", "", "the tool's output for the model")
	textFile := fs.String("text-file", "", "read the output from this file ('-': stdin)")
	failed := fs.Bool("failed", false, "the tool call failed (success=false)")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	if *callID == "" {
		return errors.New("tool complete: -call-id is required")
	}
	if *textFile != "" {
		var b []byte
		var err error
		if *textFile == "-" {
			b, err = io.ReadAll(io.LimitReader(c.in, 1<<20))
		} else {
			b, err = os.ReadFile(*textFile)
		}
		if err != nil {
			return err
		}
		*text = string(b)
	}
	resp, err := c.exec.CompleteToolCall(ctx, &executorv1.CompleteToolCallRequest{
		RunId: fs.Arg(0), CallId: *callID, Success: !*failed, Text: *text, CompanyId: c.companyOf(*company)})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "%s: tool call %s completed (command %s)\n", fs.Arg(0), *callID, resp.GetCommandId())
		return nil
	})
}
