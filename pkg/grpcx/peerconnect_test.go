package grpcx

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestD4_ACallToAPeerThatWentSilentFailsWithinTheConnectTimeout: a peer
// whose host vanished accepts nothing and refuses nothing (here: a
// listener that takes the connection and never speaks). With
// PeerConnectParams a call fails Unavailable once the connection attempt
// gives up (PeerConnectTimeout), so the executor fails the run's scope
// over; with grpc-go's defaults the attempt lasts 20 s and the call would
// still be waiting at this test's 15 s deadline (DeadlineExceeded).
func TestD4_ACallToAPeerThatWentSilentFailsWithinTheConnectTimeout(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	conn, err := Dial(lis.Addr().String(), "", PeerConnectParams())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err = healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a call to a silent peer: %v, want Unavailable before the 15 s deadline", err)
	}
}
