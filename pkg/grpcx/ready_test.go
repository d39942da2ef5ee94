package grpcx

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// readyServer serves with one readiness check that fails while *down holds,
// and a check that blocks (a wedged process) while *stuck holds.
func readyServer(t *testing.T, down, stuck *atomic.Bool) (*Server, healthpb.HealthClient) {
	t.Helper()
	srv, err := New(Config{Name: "test", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second,
		Logger: NewLogger("debug", "json", &syncBuffer{})})
	if err != nil {
		t.Fatal(err)
	}
	srv.AddReadinessCheck("database", func(ctx context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	srv.AddReadinessCheck("loop", func(ctx context.Context) error {
		for stuck.Load() {
			time.Sleep(10 * time.Millisecond) // ignores ctx, as a wedged call would
		}
		return nil
	})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	conn, err := Dial(srv.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stuck.Store(false)
		conn.Close()
		cancel()
		<-done
	})
	return srv, healthpb.NewHealthClient(conn)
}

func servingStatus(t *testing.T, c healthpb.HealthClient) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	res, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return res.GetStatus()
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestD5_ReadinessFollowsTheChecksAndLivenessDoesNot: a server whose check
// fails at start is NOT_SERVING (gRPC health and /readyz 503 naming the
// check) until it passes; it follows the check both ways while liveness
// (/healthz) stays ok throughout: a database that is down makes the
// process unready, not dead.
func TestD5_ReadinessFollowsTheChecksAndLivenessDoesNot(t *testing.T) {
	old := readinessInterval
	readinessInterval = 50 * time.Millisecond
	t.Cleanup(func() { readinessInterval = old })
	var down, stuck atomic.Bool
	down.Store(true)
	srv, hc := readyServer(t, &down, &stuck)
	base := "http://" + srv.MetricsAddr().String()

	if st := servingStatus(t, hc); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("a failing check at start: %v, want NOT_SERVING", st)
	}
	code, body := httpGet(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "database: connection refused") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d while only unready", code)
	}

	down.Store(false)
	eventually(t, "SERVING once the check passes", func() bool { return servingStatus(t, hc) == healthpb.HealthCheckResponse_SERVING })
	if code, _ := httpGet(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d once ready", code)
	}
	down.Store(true)
	eventually(t, "NOT_SERVING again", func() bool { return servingStatus(t, hc) == healthpb.HealthCheckResponse_NOT_SERVING })
	if code, _ := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d while only unready", code)
	}
}

// TestD5_LivenessFailsWhenTheProcessStopsMakingProgress: a check that never
// returns (a wedged process) stops the readiness rounds; past the stall
// bound /healthz answers 503, so the orchestrator restarts it.
func TestD5_LivenessFailsWhenTheProcessStopsMakingProgress(t *testing.T) {
	oldI, oldS := readinessInterval, livenessStall
	readinessInterval, livenessStall = 20*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { readinessInterval, livenessStall = oldI, oldS })
	var down, stuck atomic.Bool
	srv, hc := readyServer(t, &down, &stuck)
	base := "http://" + srv.MetricsAddr().String()
	eventually(t, "SERVING", func() bool { return servingStatus(t, hc) == healthpb.HealthCheckResponse_SERVING })
	if code, _ := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	stuck.Store(true)
	eventually(t, "liveness fails", func() bool {
		code, body := httpGet(t, base+"/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "stalled")
	})
	stuck.Store(false)
	eventually(t, "liveness recovers", func() bool { code, _ := httpGet(t, base+"/healthz"); return code == http.StatusOK })
}
