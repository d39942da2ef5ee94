// Package migratecli is a service's `migrate` command (SPEC L3): apply the
// schema's migrations and exit, or with -check only report whether the
// database has them all.
package migratecli

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/pgstore"
)

// Run is `<service> migrate [-check] -database-url URL` with args after
// "migrate".
func Run(service string, args []string, m pgstore.Migrations) error {
	fs := flag.NewFlagSet(service+" migrate", flag.ExitOnError)
	dsn := grpcx.StringFlag(fs, "database-url", "", "", "PostgreSQL URL (required)")
	check := fs.Bool("check", false, "apply nothing: exit 0 when the schema has every migration this binary needs, else 1 with schema_outdated (e.g. an init container waiting for the migration job)")
	fs.Bool("version", false, "print the version and exit")
	if err := grpcx.ParseFlags(fs, args); err != nil {
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
	return pgstore.RunMigrate(ctx, os.Stdout, service, *dsn, m)
}
