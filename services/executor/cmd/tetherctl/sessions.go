package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// replaceSessionCmd is `tetherctl replace-session -session S -reason WHY
// [-company C] [-agent A] [-by NAME]`: an operator gives a session's
// provider thread up (SPEC F3); the next run of each scope starts a fresh
// provider session, on record as a continuity break.
func replaceSessionCmd(ctx context.Context, client executorv1.ExecutorServiceClient, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("replace-session", flag.ContinueOnError)
	company := fs.String("company", DefaultCompany, "company id")
	session := fs.String("session", "", "normalized session id (required)")
	agent := fs.String("agent", "", "only this agent's scope (default: every scope of the session)")
	reason := fs.String("reason", "", "why the provider thread is given up (required; recorded)")
	by := fs.String("by", os.Getenv("USER"), "who decides (recorded; where identities are required the authenticated principal is recorded instead)")
	asJSON := fs.Bool("json", false, "print raw JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *session == "" || *reason == "" || *by == "" {
		return errors.New("usage: tetherctl replace-session -session S -reason WHY [-company C] [-agent A] [-by NAME]")
	}
	resp, err := client.ReplaceSession(ctx, &executorv1.ReplaceSessionRequest{
		CompanyId: *company, NormalizedSessionId: *session, AgentId: *agent, RequestedBy: *by, Reason: *reason,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		printJSON(resp)
		return nil
	}
	for _, r := range resp.GetReplacements() {
		fmt.Fprintf(w, "%s scope %s: the next run starts a fresh provider session (requested by %s as %s at %s)\n",
			r.GetReplacementId(), r.GetSessionScope(), r.GetRequestedBy(), r.GetCaller(), r.GetRequestedAt().AsTime().Format("2006-01-02T15:04:05Z07:00"))
	}
	return nil
}
