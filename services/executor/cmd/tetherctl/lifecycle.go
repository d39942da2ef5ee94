package main

import (
	"context"
	"fmt"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// SPEC L1: deleting one ended run, and everything of a company.

func deleteCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("delete")
	company := companyFlag(fs, "the run's company, when you can read more than one company's run of this id")
	reason := fs.String("reason", "", "why, kept in the operator audit")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	resp, err := c.exec.DeleteRun(ctx, &executorv1.DeleteRunRequest{RunId: fs.Arg(0), CompanyId: c.companyOf(*company), Reason: *reason})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "deleted run %s of %s: %s\n", resp.GetRunId(), resp.GetCompanyId(), counts(resp.GetDeleted()))
		return nil
	})
}

func purgeCompanyCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("purge-company")
	company := companyFlag(fs, "the company whose data is deleted (required)")
	reason := fs.String("reason", "", "why, kept in the operator audit")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	comp, err := c.requireCompany("purge-company", *company)
	if err != nil {
		return err
	}
	resp, err := c.exec.PurgeCompany(ctx, &executorv1.PurgeCompanyRequest{CompanyId: comp, Reason: *reason})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "purged company %s: %s\n", resp.GetCompanyId(), counts(resp.GetDeleted()))
		return nil
	})
}

func counts(p *executorv1.PurgeCounts) string {
	return fmt.Sprintf("%d runs, %d events, %d activities, %d interactions, %d checkpoints, %d secrets",
		p.GetRuns(), p.GetEvents(), p.GetActivities(), p.GetInteractions(), p.GetCheckpoints(), p.GetSecrets())
}
