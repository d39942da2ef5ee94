package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/user"
	"text/tabwriter"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// retentionCommand is `executor retention`: show the retention policies
// (SPEC L1), or set or reset one company's (or the default, "*").
func retentionCommand(args []string) error {
	fs := flag.NewFlagSet("executor retention", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: executor retention -database-url URL                       show every policy
       executor retention -company C [-runs D] [-checkpoints N]      set C's policy ("*": the default)
       executor retention -company C -reset                          C follows the default again
-runs: how long ended runs are kept (e.g. 720h; 0: for good; at least 1h).
-checkpoints: how many checkpoints of each session are kept (0: all; the one a session restores from always is).`)
		fs.PrintDefaults()
	}
	dsn := envflag.String(fs, "database-url", "", "", "PostgreSQL URL (required)")
	company := fs.String("company", "", `the company whose policy is set, or "*" for every company without its own`)
	runs := fs.Duration("runs", 0, "keep ended runs this long (0: for good)")
	cps := fs.Int("checkpoints", 0, "keep this many checkpoints per session (0: all)")
	reset := fs.Bool("reset", false, "remove the company's own policy")
	if err := envflag.Parse(fs, args); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("-database-url (or TETHER_DATABASE_URL) is required")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	if err := store.CheckSchema(ctx, *dsn); err != nil {
		return err
	}
	st, err := store.Open(ctx, *dsn, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	by := "cli"
	if u, err := user.Current(); err == nil {
		by = "cli:" + u.Username
	}
	switch {
	case *reset:
		if *company == "" {
			return fmt.Errorf("-reset needs -company")
		}
		if err := st.ResetRetention(ctx, *company, by); err != nil {
			return err
		}
	case set["runs"] || set["checkpoints"]:
		if *company == "" {
			return fmt.Errorf("-runs and -checkpoints need -company (\"*\" for the default)")
		}
		p := store.RetentionPolicy{Company: *company}
		if cur, err := st.RetentionPolicies(ctx); err == nil {
			for _, c := range cur {
				if c.Company == *company {
					p = c
				}
			}
		} else {
			return err
		}
		if set["runs"] {
			p.RunRetention = *runs
		}
		if set["checkpoints"] {
			p.CheckpointsKept = *cps
		}
		if err := st.SetRetention(ctx, p, by); err != nil {
			return err
		}
	}
	list, err := st.RetentionPolicies(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPANY\tRUNS KEPT\tCHECKPOINTS KEPT\tUPDATED\tBY")
	for _, p := range list {
		r, c := "forever", "all"
		if p.RunRetention > 0 {
			r = p.RunRetention.String()
		}
		if p.CheckpointsKept > 0 {
			c = fmt.Sprint(p.CheckpointsKept)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Company, r, c, p.UpdatedAt.UTC().Format(time.RFC3339), p.UpdatedBy)
	}
	return w.Flush()
}
