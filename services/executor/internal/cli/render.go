// Package cli holds what tetherctl and the demo share: building a run's
// input from flags and rendering a live event stream for people.
package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/placement"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/plan"
)

// InputSpec is the flag-level description of a run.
type InputSpec struct {
	Prompt, Company, Agent, Issue, Session, Lifecycle, Cwd, Model, Approval, Sandbox string
	// Provider is the provider kind (codex when empty: codex, opencode or
	// acpx); ProviderAgent is acpx's agent and PermissionMode the
	// provider's permission mode (opencode, acpx).
	Provider, ProviderAgent, PermissionMode string
	IdleTimeoutSeconds                      int64
	// Labels are the run's placement labels ("zone=a,gpu=false"): its
	// session scope is placed on a gateway carrying them (SPEC F2).
	Labels string
}

// Input builds an ExecutionInput (for the codex provider unless Provider
// names another).
func (s InputSpec) Input() (*prpv1.ExecutionInput, error) {
	mode := prpv1.LifecycleMode_LIFECYCLE_MODE_WARM
	switch s.Lifecycle {
	case "", "warm":
	case "per_turn", "per-turn":
		mode = prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN
	default:
		return nil, fmt.Errorf("lifecycle %q: want warm or per_turn", s.Lifecycle)
	}
	lc := &prpv1.Lifecycle{Mode: mode}
	if s.IdleTimeoutSeconds > 0 {
		lc.IdleTimeout = durationpb.New(secondsDuration(s.IdleTimeoutSeconds))
	}
	var runner *prpv1.RunnerPlacement
	if s.Labels != "" {
		labels, err := placement.ParseLabels(s.Labels)
		if err != nil {
			return nil, fmt.Errorf("placement labels: %w", err)
		}
		runner = &prpv1.RunnerPlacement{Labels: labels}
	}
	kind := s.Provider
	if kind == "" {
		kind = provenv.KindCodex
	}
	return &prpv1.ExecutionInput{
		Runner: runner,
		Provider: &prpv1.Provider{Kind: kind, Model: s.Model, ApprovalPolicy: s.Approval, Sandbox: s.Sandbox,
			PermissionMode: s.PermissionMode, Agent: s.ProviderAgent},
		Binding:   &prpv1.Binding{CompanyId: s.Company, AgentId: s.Agent, IssueId: s.Issue},
		Task:      &prpv1.Task{Prompt: s.Prompt},
		Workspace: &prpv1.Workspace{Cwd: s.Cwd},
		Session:   &prpv1.Session{NormalizedSessionId: s.Session, DriverKind: scope.DefaultDriverKind(kind), Lifecycle: lc},
	}, nil
}

// Renderer prints a run's events as a person wants to read them: turn
// progress, the assistant's text as it streams, the outcome, and the turn's
// usage beside the session's total.
type Renderer struct {
	W io.Writer
	// JSON prints every event as one protojson line instead.
	JSON bool
	// Prefix starts every line (e.g. "turn 2 ").
	Prefix string

	midLine bool
	// Events counts rendered events.
	Events int
}

func (r *Renderer) line(format string, args ...any) {
	if r.midLine {
		fmt.Fprintln(r.W)
		r.midLine = false
	}
	fmt.Fprintf(r.W, r.Prefix+format+"\n", args...)
}

// Event renders one watched event.
func (r *Renderer) Event(m *executorv1.WatchRunResponse) {
	r.Events++
	ev := m.GetEvent()
	if r.JSON {
		b, _ := protojson.Marshal(m)
		fmt.Fprintln(r.W, string(b))
		return
	}
	p := ev.GetPayload().GetFields()
	str := func(k string) string { return p[k].GetStringValue() }
	switch ev.GetEventType() {
	case "session.started":
		verb := "started"
		if p["resumed"].GetBoolValue() {
			verb = "resumed"
		}
		r.line("· provider session %s (thread %s)", verb, str("threadId"))
	case prp.EventTurnStarted:
		r.line("▶ turn %s started", firstNonEmpty(str("providerTurnId"), ev.GetTurnId()))
	case "item.delta":
		if str("kind") == "agentMessage" || str("kind") == "" {
			if !r.midLine {
				fmt.Fprint(r.W, r.Prefix+"  assistant: ")
				r.midLine = true
			}
			fmt.Fprint(r.W, str("delta"))
		}
	case "item.completed":
		if str("kind") == "agentMessage" && r.midLine {
			fmt.Fprintln(r.W)
			r.midLine = false
		}
	case plan.EventPlanUpdated:
		if md := str("markdown"); md != "" {
			r.line("  plan:")
			for _, l := range strings.Split(md, "\n") {
				r.line("    %s", l)
			}
		}
	case prp.EventTurnCompleted, prp.EventTurnFailed, prp.EventTurnInterrupted:
		r.line("■ %s", strings.ReplaceAll(ev.GetEventType(), ".", " "))
	case prp.EventRunTerminal:
		msg := str("runTerminalState")
		if c := str("code"); c != "" {
			msg += " (" + c + ": " + str("message") + ")"
		}
		r.line("● run %s: %s", ev.GetRunId(), msg)
		r.usage(m.GetResult())
	case "runtime_request.created":
		// The run waits for an answer: say so, or it looks hung.
		what := "input requested"
		if str("requestType") == "approval" {
			what = "approval requested"
		}
		req := p["request"].GetStructValue().GetFields()
		detail := firstNonEmpty(req["prompt"].GetStringValue(), req["command"].GetStringValue(), req["reason"].GetStringValue())
		if detail != "" {
			detail = ": " + detail
		}
		r.line("⏸ %s (request %s)%s — ResolveRuntimeRequest answers it", what, str("requestId"), detail)
	case "runtime_request.resolved", "runtime_request.expired", "runtime_request.cancelled":
		r.line("· request %s %s", str("requestId"), strings.TrimPrefix(ev.GetEventType(), "runtime_request."))
	case "semantic_tool.input":
		tool := str("tool")
		if ns := str("namespace"); ns != "" {
			tool = ns + "/" + tool
		}
		r.line("⏸ tool call pending: %s (call %s)", tool, str("callId"))
	case "run.retry_scheduled":
		r.line("↻ attempt %d failed (%s: %s); retry scheduled at %s", int(p["attempt"].GetNumberValue()),
			str("code"), str("message"), localTime(str("nextAttemptAt")))
	case "harness.exited", "harness.diagnostic":
		r.line("! %s %s %s", ev.GetEventType(), str("code"), str("message"))
	}
}

// usage prints the run's own usage (and cost) and, on a separate line, the
// provider session's total (SPEC E1): a warm session's total grows over its
// turns, so it is never shown as the turn's.
func (r *Renderer) usage(res *executorv1.RunResult) {
	if u := res.GetUsage(); u != nil {
		cost := ""
		if res.CostUsd != nil {
			cost = fmt.Sprintf(", cost $%.4f", res.GetCostUsd())
		}
		r.line("  turn usage: %s%s", tokens(u), cost)
	}
	if u := res.GetSessionUsage(); u != nil {
		r.line("  session total: %s", tokens(u))
	}
}

func tokens(u *executorv1.Usage) string {
	return fmt.Sprintf("input %d (cached %d), output %d tokens", u.GetInputTokens(), u.GetCachedInputTokens(), u.GetOutputTokens())
}

// Flush ends a partial line.
func (r *Renderer) Flush() {
	if r.midLine {
		fmt.Fprintln(r.W)
		r.midLine = false
	}
}

func firstNonEmpty(a ...string) string {
	for _, s := range a {
		if s != "" {
			return s
		}
	}
	return ""
}

// localTime shows an RFC 3339 time in the local zone (as is when it does
// not parse).
func localTime(v string) string {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return v
	}
	return t.Local().Format(time.DateTime + " MST")
}
