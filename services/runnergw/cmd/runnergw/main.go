// Command runnergw is tether's runner gateway: it launches local runnerd
// processes, authenticates their WebSocket connections and relays PRP events
// and commands between them and executors.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/runnergw/internal/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "runnergw:", err)
		os.Exit(1)
	}
}

// run is flags → config → wiring → serving; the steps are in wire.go.
func run() error {
	cfg, err := config.Load(os.Args[1:])
	if err != nil {
		return err
	}
	g := &gatewayProcess{cfg: cfg}
	defer g.close()
	if err := g.loadGrants(); err != nil {
		return err
	}
	if err := g.lockStateRoot(); err != nil {
		return err
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	if err := g.prepareLaunch(ctx); err != nil {
		return err
	}
	if err := g.newServer(ctx); err != nil {
		return err
	}
	if err := g.listen(); err != nil {
		return err
	}
	if err := g.dialBackup(); err != nil {
		return err
	}
	g.newGateway()
	if ctx, err = g.announce(ctx); err != nil {
		return err
	}
	return g.serve(ctx)
}
