package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/placement"
)

// gatewaysCmd is `tetherctl gateways [list] [-json]`: the gateway registry
// (SPEC F1) with each gateway's state, load, capacity and last heartbeat.
func gatewaysCmd(ctx context.Context, conn grpc.ClientConnInterface, args []string, w io.Writer) error {
	if len(args) > 0 && args[0] == "list" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("gateways", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print raw JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("usage: tetherctl gateways [list] [-json]")
	}
	resp, err := executorv1.NewGatewayRegistryClient(conn).ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	if err != nil {
		return err
	}
	if *asJSON {
		printJSON(resp)
		return nil
	}
	renderGateways(w, resp.GetGateways(), time.Now())
	return nil
}

// renderGateways prints one line per gateway.
func renderGateways(w io.Writer, gs []*executorv1.Gateway, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY\tSTATE\tLOAD\tSESSIONS/CAPACITY\tLAST HEARTBEAT\tADDRESS\tLABELS")
	for _, g := range gs {
		load := 0.0
		if g.GetCapacity() > 0 {
			load = float64(g.GetSessions()) / float64(g.GetCapacity())
		}
		ago := now.Sub(g.GetLastHeartbeatAt().AsTime()).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "%s\t%s\t%.0f%%\t%d/%d\t%s ago\t%s\t%s\n", g.GetGatewayId(),
			strings.ToLower(strings.TrimPrefix(g.GetState().String(), "GATEWAY_STATE_")), 100*load,
			g.GetSessions(), g.GetCapacity(), ago, g.GetAddress(), placement.FormatLabels(g.GetLabels()))
	}
	_ = tw.Flush()
}
