package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/cli"
)

// interactions lists, shows and answers durable interactions (SPEC E4/E5):
//
//	tetherctl interactions list [-run RUN_ID] [-status pending|answered]
//	tetherctl interactions show INTERACTION_ID
//	tetherctl interactions answer INTERACTION_ID -answer QUESTION=OPTION[,OPTION] [-text QUESTION=TEXT] [-watch]
func interactions(ctx context.Context, c *replicaSet, args []string) error {
	if len(args) == 0 {
		return errors.New("interactions: list, show or answer")
	}
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("interactions list", flag.ContinueOnError)
		run := fs.String("run", "", "only interactions of this source run")
		status := fs.String("status", "", "only pending or answered")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		resp, err := c.ListInteractions(ctx, &executorv1.ListInteractionsRequest{RunId: *run, Status: *status})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INTERACTION\tKIND\tSTATUS\tRUN\tTITLE\tCONTINUATION\tCREATED")
		for _, in := range resp.GetInteractions() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.GetInteractionId(), in.GetKind(), in.GetStatus(), in.GetSourceRunId(),
				in.GetTitle(), in.GetContinuationRunId(), in.GetCreatedAt().AsTime().Local().Format(time.DateTime))
		}
		return tw.Flush()
	case "show":
		fs := flag.NewFlagSet("interactions show", flag.ContinueOnError)
		if err := parseWithID(fs, args[1:]); err != nil {
			return err
		}
		resp, err := c.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: fs.Arg(0)})
		if err != nil {
			return err
		}
		printJSON(resp.GetInteraction())
		return nil
	case "answer":
		fs := flag.NewFlagSet("interactions answer", flag.ContinueOnError)
		var picks, texts cli.Repeated
		fs.Var(&picks, "answer", "QUESTION=OPTION[,OPTION] (repeatable)")
		fs.Var(&texts, "text", "QUESTION=TEXT for a free-text answer (repeatable)")
		doWatch := fs.Bool("watch", false, "watch the continuation run")
		if err := parseWithID(fs, args[1:]); err != nil {
			return err
		}
		answers, err := cli.Answers(picks, texts)
		if err != nil {
			return err
		}
		resp, err := c.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: fs.Arg(0), Answers: answers})
		if err != nil {
			return err
		}
		run := resp.GetContinuationRun().GetRunId()
		switch {
		case run == "":
			fmt.Printf("interaction %s: %s (partial answer recorded)\n", fs.Arg(0), resp.GetInteraction().GetStatus())
			return nil
		case !*doWatch:
			fmt.Printf("interaction %s answered; continuation run %s\n", fs.Arg(0), run)
			return nil
		}
		return watchRun(ctx, c, run, 0, false, os.Stdout)
	}
	return fmt.Errorf("interactions: unknown subcommand %q (list, show, answer)", strings.Join(args[:1], ""))
}
