package grpcx

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// drainingHealth is grpc's health server whose Watch streams end once the
// server drains (after delivering NOT_SERVING), so they do not hold up
// GracefulStop until the shutdown timeout.
type drainingHealth struct {
	*health.Server
	draining <-chan struct{}
}

func (h *drainingHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	notServingSent := make(chan struct{}, 1)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-h.draining:
		}
		// Give the watcher its NOT_SERVING (or whatever) update first.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-notServingSent:
		case <-t.C:
		case <-ctx.Done():
		}
		cancel()
	}()
	err := h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx, draining: h.draining, notServingSent: notServingSent})
	select {
	case <-h.draining:
		if stream.Context().Err() == nil {
			return status.Error(codes.Unavailable, "server is shutting down")
		}
	default:
	}
	return err
}

type watchStream struct {
	healthpb.Health_WatchServer
	ctx            context.Context
	draining       <-chan struct{}
	notServingSent chan struct{}
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(m *healthpb.HealthCheckResponse) error {
	err := w.Health_WatchServer.Send(m)
	select {
	case <-w.draining:
		if m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			select {
			case w.notServingSent <- struct{}{}:
			default:
			}
		}
	default:
	}
	return err
}

// SendMsg keeps the embedded stream's SendMsg from bypassing Send.
func (w *watchStream) SendMsg(m any) error {
	if r, ok := m.(*healthpb.HealthCheckResponse); ok {
		return w.Send(r)
	}
	return w.Health_WatchServer.SendMsg(m)
}

var _ grpc.ServerStream = (*watchStream)(nil)
