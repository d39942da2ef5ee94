package main

import (
	"context"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// health asks a tether service's gRPC health (any of the three: -addr names
// it) and fails unless it is SERVING. Container probes and compose
// healthchecks use it: it speaks the service's mTLS, which the kubelet's
// own gRPC probe cannot.
func healthCmd(ctx context.Context, c *ctl, args []string) error {
	conn := c.conn
	fs := newFlagSet("health")
	service := fs.String("service", "", "service name to check (empty: the server as a whole)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		return err
	}
	fmt.Fprintln(c.out, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health: %s", resp.GetStatus())
	}
	return nil
}
