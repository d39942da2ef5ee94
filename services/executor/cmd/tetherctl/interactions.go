package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// Durable interactions (SPEC E4/E5): list, get and answer.

func interactionsListCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("interactions list")
	run := fs.String("run", "", "only interactions of this source run")
	status := fs.String("status", "", "only pending or answered")
	company := companyFlag(fs, "only this company's interactions")
	page := pagingFlags(fs, 50)
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	req := &executorv1.ListInteractionsRequest{RunId: *run, Status: *status, CompanyId: c.companyOf(*company),
		PageSize: int32(*page.size), PageToken: *page.token}
	all := &executorv1.ListInteractionsResponse{}
	for {
		resp, err := c.exec.ListInteractions(ctx, req)
		if err != nil {
			return err
		}
		all.Interactions = append(all.Interactions, resp.GetInteractions()...)
		all.NextPageToken = resp.GetNextPageToken()
		if !*page.all || resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	return emit(c.out, out, all, func() error {
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INTERACTION\tKIND\tSTATUS\tCOMPANY\tRUN\tTITLE\tCONTINUATION\tCREATED")
		for _, in := range all.GetInteractions() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.GetInteractionId(), in.GetKind(), in.GetStatus(), in.GetCompanyId(),
				in.GetSourceRunId(), in.GetTitle(), in.GetContinuationRunId(), in.GetCreatedAt().AsTime().Local().Format(time.DateTime))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		moreHint(all.GetNextPageToken())
		return nil
	})
}

func interactionsGetCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("interactions get")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	resp, err := c.exec.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: fs.Arg(0)})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		in := resp.GetInteraction()
		fmt.Fprintf(c.out, "%s %s (%s) of run %s: %s\n", in.GetInteractionId(), in.GetKind(), in.GetStatus(), in.GetSourceRunId(), in.GetTitle())
		if in.GetSummary() != "" {
			fmt.Fprintf(c.out, "  %s\n", in.GetSummary())
		}
		for _, q := range in.GetQuestions() {
			fmt.Fprintf(c.out, "  question %s (%s): %s\n", q.GetId(), q.GetSelectionMode(), q.GetPrompt())
			for _, o := range q.GetOptions() {
				free := ""
				if o.GetFreeText() {
					free = " (free text: -text " + q.GetId() + "=...)"
				}
				fmt.Fprintf(c.out, "    -answer %s=%s   %s%s\n", q.GetId(), o.GetId(), o.GetLabel(), free)
			}
		}
		if in.GetContinuationRunId() != "" {
			fmt.Fprintf(c.out, "  continuation run %s (answered by %s)\n", in.GetContinuationRunId(), in.GetAnsweredBy())
		}
		return nil
	})
}

func interactionsAnswerCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("interactions answer")
	var picks, texts cli.Repeated
	fs.Var(&picks, "answer", "QUESTION=OPTION[,OPTION] (repeatable)")
	fs.Var(&texts, "text", "QUESTION=TEXT for a free-text answer (repeatable)")
	doWatch := fs.Bool("watch", false, "watch the continuation run")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		return err
	}
	answers, err := cli.Answers(picks, texts)
	if err != nil {
		return err
	}
	resp, err := c.exec.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: fs.Arg(0), Answers: answers})
	if err != nil {
		return err
	}
	run := resp.GetContinuationRun().GetRunId()
	err = emit(c.out, out, resp, func() error {
		if run == "" {
			fmt.Fprintf(c.out, "interaction %s: %s (partial answer recorded)\n", fs.Arg(0), resp.GetInteraction().GetStatus())
		} else {
			fmt.Fprintf(c.out, "interaction %s answered; continuation run %s\n", fs.Arg(0), run)
		}
		return nil
	})
	if err != nil || run == "" || !*doWatch {
		return err
	}
	return watchRun(ctx, c, run, resp.GetInteraction().GetCompanyId(), 0, *out == outJSON)
}
