// Package migratecli is a service's `migrate` command (SPEC L3): apply the
// schema's migrations and exit, or with -check only report whether the
// database has them all.
package migratecli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/pgstore"
)

// Step is an explicit schema step of a service beyond its migrations,
// run by `<service> migrate -<Flag>` after the migrations are applied
// (e.g. the executor's -partition-events, SPEC L2).
type Step struct {
	Flag, Usage string
	Run         func(ctx context.Context, dsn string, w io.Writer) error
}

// Run is `<service> migrate [-check] -database-url URL` with args after
// "migrate", plus a flag per step.
func Run(service string, args []string, m pgstore.Migrations, steps ...Step) error {
	fs := flag.NewFlagSet(service+" migrate", flag.ExitOnError)
	dsn := envflag.String(fs, "database-url", "", "", "PostgreSQL URL (required)")
	check := fs.Bool("check", false, "apply nothing: exit 0 when the schema has every migration this binary needs, else 1 with schema_outdated (e.g. an init container waiting for the migration job)")
	fs.Bool("version", false, "print the version and exit")
	chosen := make([]*bool, len(steps))
	for i, st := range steps {
		chosen[i] = fs.Bool(st.Flag, false, st.Usage)
	}
	if err := envflag.Parse(fs, args); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("-database-url (or TETHER_DATABASE_URL) is required")
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	if *check {
		if err := pgstore.CheckCurrent(ctx, *dsn, m, service+" migrate -database-url URL"); err != nil {
			return err
		}
		fmt.Printf("%s: schema is current\n", service)
		return nil
	}
	if err := pgstore.RunMigrate(ctx, os.Stdout, service, *dsn, m); err != nil {
		return err
	}
	for i, st := range steps {
		if *chosen[i] {
			if err := st.Run(ctx, *dsn, os.Stdout); err != nil {
				return fmt.Errorf("-%s: %w", st.Flag, err)
			}
		}
	}
	return nil
}
