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

// gatewaysCmd is `tetherctl gateways [list] [-json]` (the gateway registry,
// SPEC F1: each gateway's state, load, capacity, placed scopes, last
// heartbeat and drain progress) and `tetherctl gateways drain ID [-wait]`
// (SPEC F4).
func gatewaysCmd(ctx context.Context, conn grpc.ClientConnInterface, args []string, w io.Writer) error {
	if len(args) > 0 && args[0] == "drain" {
		return drainCmd(ctx, conn, args[1:], w)
	}
	if len(args) > 0 && args[0] == "list" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("gateways", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print raw JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("usage: tetherctl gateways [list] [-json] | gateways drain ID [-reason R] [-wait] [-timeout D]")
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

// drainPoll is how often `gateways drain -wait` reads the progress.
const drainPoll = 500 * time.Millisecond

// drainCmd starts a drain and, with -wait, prints its progress on every
// change until no scope is left on the gateway.
func drainCmd(ctx context.Context, conn grpc.ClientConnInterface, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("gateways drain", flag.ContinueOnError)
	reason := fs.String("reason", "", "why (kept with the drain)")
	wait := fs.Bool("wait", false, "wait until every scope moved off, printing the progress")
	timeout := fs.Duration("timeout", 0, "with -wait: give up after this long (0: no limit)")
	id := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if id == "" || fs.NArg() > 0 {
		return errors.New("usage: tetherctl gateways drain ID [-reason R] [-wait] [-timeout D]")
	}
	reg := executorv1.NewGatewayRegistryClient(conn)
	resp, err := reg.DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: id, Reason: *reason})
	if err != nil {
		return err
	}
	last := drainLine(resp.GetGateway())
	fmt.Fprintln(w, last)
	if !*wait {
		return nil
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	for !resp.GetGateway().GetDrain().GetDone() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("gateway %s is not drained yet: %w", id, ctx.Err())
		case <-time.After(drainPoll):
		}
		list, err := reg.ListGateways(ctx, &executorv1.ListGatewaysRequest{})
		if err != nil {
			return err
		}
		for _, g := range list.GetGateways() {
			if g.GetGatewayId() == id {
				resp.Gateway = g
			}
		}
		if line := drainLine(resp.GetGateway()); line != last {
			fmt.Fprintln(w, line)
			last = line
		}
	}
	return nil
}

// drainLine is one line of a drain's progress.
func drainLine(g *executorv1.Gateway) string {
	return fmt.Sprintf("gateway %s %s: %s", g.GetGatewayId(),
		strings.ToLower(strings.TrimPrefix(g.GetState().String(), "GATEWAY_STATE_")), drainText(g.GetDrain()))
}

// drainText renders a drain's progress ("" when none was requested).
func drainText(d *executorv1.DrainProgress) string {
	switch {
	case d == nil:
		return ""
	case d.GetDone():
		return fmt.Sprintf("drained, %d moved", d.GetMovedScopes())
	}
	return fmt.Sprintf("draining, %d moved, %d left (%d busy)", d.GetMovedScopes(), d.GetRemainingScopes(), d.GetBusyScopes())
}

// renderGateways prints one line per gateway.
func renderGateways(w io.Writer, gs []*executorv1.Gateway, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY\tSTATE\tLOAD\tSESSIONS/CAPACITY\tPLACED\tLAST HEARTBEAT\tADDRESS\tLABELS\tDRAIN")
	for _, g := range gs {
		load := 0.0
		if g.GetCapacity() > 0 {
			load = float64(g.GetSessions()) / float64(g.GetCapacity())
		}
		ago := now.Sub(g.GetLastHeartbeatAt().AsTime()).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "%s\t%s\t%.0f%%\t%d/%d\t%d\t%s ago\t%s\t%s\t%s\n", g.GetGatewayId(),
			strings.ToLower(strings.TrimPrefix(g.GetState().String(), "GATEWAY_STATE_")), 100*load,
			g.GetSessions(), g.GetCapacity(), g.GetPlacedScopes(), ago, g.GetAddress(), placement.FormatLabels(g.GetLabels()),
			drainText(g.GetDrain()))
	}
	_ = tw.Flush()
}
