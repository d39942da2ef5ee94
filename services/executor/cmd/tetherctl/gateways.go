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

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/placement"
)

// gatewaysListCmd is `tetherctl gateways [list]` (the gateway registry,
// SPEC F1: each gateway's state, load, capacity, placed scopes, last
// heartbeat and drain progress); the table shows every page.
func gatewaysListCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("gateways list")
	page := pagingFlags(fs, 100)
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("usage: tetherctl gateways [list] [-o json] [-page-size N] [-page-token T | -all] | gateways drain ID [-reason R] [-wait] [-timeout D]")
	}
	req := &executorv1.ListGatewaysRequest{PageSize: int32(*page.size), PageToken: *page.token}
	resp, err := listGateways(ctx, c.fleet, req, *page.all)
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		renderGateways(c.out, resp.GetGateways(), time.Now())
		moreHint(resp.GetNextPageToken())
		return nil
	})
}

// listGateways lists a page, or with all every page from req's.
func listGateways(ctx context.Context, reg executorv1.GatewayRegistryClient, req *executorv1.ListGatewaysRequest, all bool) (*executorv1.ListGatewaysResponse, error) {
	out := &executorv1.ListGatewaysResponse{}
	for {
		resp, err := reg.ListGateways(ctx, req)
		if err != nil {
			return nil, err
		}
		out.Gateways = append(out.Gateways, resp.GetGateways()...)
		out.NextPageToken = resp.GetNextPageToken()
		if !all || out.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = out.NextPageToken
	}
}

// drainPoll is how often `gateways drain -wait` reads the progress.
const drainPoll = 500 * time.Millisecond

// gatewaysDrainCmd starts a drain (SPEC F4) and, with -wait, prints its
// progress on every change until no scope is left on the gateway.
func gatewaysDrainCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("gateways drain")
	reason := fs.String("reason", "", "why (kept with the drain)")
	wait := fs.Bool("wait", false, "wait until every scope moved off, printing the progress")
	timeout := fs.Duration("timeout", 0, "with -wait: give up after this long (0: no limit)")
	out := outputFlag(fs)
	if err := parseWithID(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w (usage: tetherctl gateways drain ID [-reason R] [-wait] [-timeout D])", err)
	}
	id := fs.Arg(0)
	resp, err := c.fleet.DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: id, Reason: *reason})
	if err != nil {
		return err
	}
	if *out == outJSON && !*wait {
		writeJSON(c.out, resp)
		return nil
	}
	last := drainLine(resp.GetGateway())
	fmt.Fprintln(c.out, last)
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
		list, err := listGateways(ctx, c.fleet, &executorv1.ListGatewaysRequest{PageSize: 500}, true)
		if err != nil {
			return err
		}
		for _, g := range list.GetGateways() {
			if g.GetGatewayId() == id {
				resp.Gateway = g
			}
		}
		if line := drainLine(resp.GetGateway()); line != last {
			fmt.Fprintln(c.out, line)
			last = line
		}
	}
	if *out == outJSON {
		writeJSON(c.out, resp)
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
