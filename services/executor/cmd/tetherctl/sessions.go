package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// sessionsGetCmd prints a session's scopes (one per agent, workspace and
// provider): live owner, runner lifecycle, gateway, last run, checkpoint.
func sessionsGetCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("sessions get")
	company := companyFlag(fs, "the session's company (required)")
	session := fs.String("session", "", "normalized session id (required; or as the argument)")
	out := outputFlag(fs)
	if err := parseSession(fs, session, args); err != nil {
		return err
	}
	comp, err := c.requireCompany("sessions get", *company)
	if err != nil {
		return err
	}
	resp, err := c.exec.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: comp, NormalizedSessionId: *session})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tAGENT\tLIFECYCLE\tCONNECTED\tGATEWAY\tACTIVE RUN\tLAST RUN\tRUNS\tCHECKPOINT")
		for _, s := range resp.GetSessions() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s (%s)\t%d\t%s\n", s.GetSessionScope(), s.GetAgentId(), s.GetLifecycle(),
				s.GetRunnerConnected(), s.GetGatewayId(), s.GetActiveRunId(), s.GetLastRunId(), stateName(s.GetLastRunState()),
				s.GetRunCount(), s.GetCheckpoint().GetCheckpointId())
		}
		return tw.Flush()
	})
}

// sessionsCloseCmd closes (or with -suspend, suspends to a verified
// checkpoint) an idle warm session.
func sessionsCloseCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("sessions close")
	company := companyFlag(fs, "the session's company (required)")
	session := fs.String("session", "", "normalized session id (required; or as the argument)")
	reason := fs.String("reason", "", "why (recorded)")
	suspend := fs.Bool("suspend", false, "suspend to a verified checkpoint instead of closing (SPEC R5)")
	out := outputFlag(fs)
	if err := parseSession(fs, session, args); err != nil {
		return err
	}
	comp, err := c.requireCompany("sessions close", *company)
	if err != nil {
		return err
	}
	resp, err := c.exec.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: comp, NormalizedSessionId: *session, Reason: *reason, Suspend: *suspend})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "session %s of %s: closed runners %v\n", *session, comp, resp.GetClosedRunnerInstanceIds())
		for _, cp := range resp.GetCheckpoints() {
			fmt.Fprintf(c.out, "  scope %s suspended: checkpoint %s (%s)\n", cp.GetSessionScope(), cp.GetCheckpointId(), cp.GetManifestDigest())
		}
		return nil
	})
}

// sessionsReplaceCmd is `tetherctl sessions replace` (also
// `replace-session`): an operator gives a session's provider thread up
// (SPEC F3); the next run of each scope starts a fresh provider session, on
// record as a continuity break.
func sessionsReplaceCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("sessions replace")
	company := companyFlag(fs, "the session's company (required)")
	session := fs.String("session", "", "normalized session id (required; or as the argument)")
	agent := fs.String("agent", "", "only this agent's scope (default: every scope of the session)")
	reason := fs.String("reason", "", "why the provider thread is given up (required; recorded)")
	by := fs.String("by", os.Getenv("USER"), "who decides (recorded; where identities are required the authenticated principal is recorded instead)")
	out := outputFlag(fs)
	if err := parseSession(fs, session, args); err != nil {
		return err
	}
	if *reason == "" || *by == "" {
		return errors.New("usage: tetherctl sessions replace -session S -reason WHY [-company C] [-agent A] [-by NAME]")
	}
	comp, err := c.requireCompany("sessions replace", *company)
	if err != nil {
		return err
	}
	resp, err := c.exec.ReplaceSession(ctx, &executorv1.ReplaceSessionRequest{
		CompanyId: comp, NormalizedSessionId: *session, AgentId: *agent, RequestedBy: *by, Reason: *reason,
	})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		for _, r := range resp.GetReplacements() {
			fmt.Fprintf(c.out, "%s scope %s: the next run starts a fresh provider session (requested by %s as %s at %s)\n",
				r.GetReplacementId(), r.GetSessionScope(), r.GetRequestedBy(), r.GetCaller(), r.GetRequestedAt().AsTime().Format(time.RFC3339))
		}
		return nil
	})
}

// parseSession parses a sessions command: the session id is -session or
// the one argument, before or after the flags.
func parseSession(fs interface {
	Parse([]string) error
	NArg() int
	Arg(int) string
	Name() string
}, session *string, args []string) error {
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		*session, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *session == "" && fs.NArg() == 1 { // the id after the flags
		*session = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments", fs.Name())
	}
	if *session == "" {
		return fmt.Errorf("%s: -session is required", fs.Name())
	}
	return nil
}
