// Command executor is tether's executor: it owns runs in PostgreSQL, claims
// due runs under fenced leases and drives them through the runner gateway.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/pgstore/migratecli"
	"github.com/tether-run/tether/services/executor/internal/config"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

// run is flags → config → wiring → serving; the steps are in wire.go.
func run() error {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		return migratecli.Run("executor", os.Args[2:], store.Schema, partitionEventsStep)
	}
	if len(os.Args) > 1 && os.Args[1] == "retention" {
		return retentionCommand(os.Args[2:])
	}
	cfg, err := config.Load(os.Args[1:])
	if err != nil {
		return err
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	e := &executor{cfg: cfg}
	defer e.close()
	if err := e.loadKeys(); err != nil {
		return err
	}
	if err := e.openStores(ctx); err != nil {
		return err
	}
	if err := e.dialGateways(); err != nil {
		return err
	}
	if err := e.newServer(ctx); err != nil {
		return err
	}
	if err := e.newServices(); err != nil {
		return err
	}
	if err := e.registerAPI(); err != nil {
		return err
	}
	return e.serve(ctx)
}
