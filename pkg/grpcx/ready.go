package grpcx

import (
	"context"
	"fmt"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// readinessInterval is how often readiness checks run while serving (a
// variable for tests).
var readinessInterval = 2 * time.Second

// readinessTimeout bounds one check.
const readinessTimeout = 2 * time.Second

// livenessStall: a readiness loop that has not finished a round for this
// long means the process no longer makes progress (SPEC D5): liveness fails.
var livenessStall = 30 * time.Second

// readiness runs a server's named checks (SPEC D5): the server is SERVING
// (gRPC health "" and every service, /readyz 200) only while each passes.
type readiness struct {
	mu      sync.Mutex
	checks  []namedCheck
	failing string    // the first failing check and its error, "" when all pass
	round   time.Time // when the last round finished
}

type namedCheck struct {
	name  string
	check func(context.Context) error
}

// AddReadinessCheck makes the server ready only while check passes (run
// every 2 s, each call bounded to 2 s): e.g. the executor's
// database answers, the gateway's registration is fresh. A failing check
// sets gRPC health NOT_SERVING and /readyz 503 with its name and error;
// liveness (/healthz) does not follow it (a restart would not help). Call
// before Serve.
func (s *Server) AddReadinessCheck(name string, check func(context.Context) error) {
	s.ready.mu.Lock()
	defer s.ready.mu.Unlock()
	s.ready.checks = append(s.ready.checks, namedCheck{name, check})
}

// runChecks runs every check once and records the first failure.
func (r *readiness) runChecks(ctx context.Context) string {
	r.mu.Lock()
	checks := append([]namedCheck(nil), r.checks...)
	r.mu.Unlock()
	failing := ""
	for _, c := range checks {
		cctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		err := c.check(cctx)
		cancel()
		if err != nil {
			failing = fmt.Sprintf("%s: %v", c.name, err)
			break
		}
	}
	r.mu.Lock()
	r.failing, r.round = failing, time.Now()
	r.mu.Unlock()
	return failing
}

func (r *readiness) state() (failing string, round time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failing, r.round, len(r.checks)
}

// setServing sets gRPC health for "" and every registered service.
func (s *Server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	for name := range s.gs.GetServiceInfo() {
		if name != healthpb.Health_ServiceDesc.ServiceName {
			s.health.SetServingStatus(name, st)
		}
	}
	s.health.SetServingStatus("", st)
}

// watchReadiness re-runs the checks until ctx ends, following their
// outcome in gRPC health and logging each change.
func (s *Server) watchReadiness(ctx context.Context, ready bool) {
	t := time.NewTicker(readinessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.draining:
			return
		case <-t.C:
		}
		failing := s.ready.runChecks(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.draining:
			return // shutting down: NOT_SERVING stays
		default:
		}
		switch {
		case failing == "" && !ready:
			s.log.Info("ready again: every readiness check passes")
			s.setServing(healthpb.HealthCheckResponse_SERVING)
			s.serving.Store(true)
		case failing != "" && ready:
			s.log.Warn("not ready: a readiness check fails", "check", failing)
			s.serving.Store(false)
			s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
		}
		ready = failing == ""
	}
}
