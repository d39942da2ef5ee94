// Package api is the gRPC face of the gateway: decode, delegate, map errors.
package api

import (
	"context"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

// Server implements tether.gateway.v1.RunnerGateway.
type Server struct {
	gatewayv1.UnsafeRunnerGatewayServer
	Gateway *gateway.Gateway
}

var _ gatewayv1.RunnerGatewayServer = (*Server)(nil)

// Attach relays one run between an executor and its runner.
func (s *Server) Attach(stream gatewayv1.RunnerGateway_AttachServer) error {
	return s.Gateway.Attach(stream)
}

// ListRunners lists runners.
func (s *Server) ListRunners(ctx context.Context, _ *gatewayv1.ListRunnersRequest) (*gatewayv1.ListRunnersResponse, error) {
	rs, err := s.Gateway.ListRunners(ctx)
	if err != nil {
		return nil, err
	}
	return &gatewayv1.ListRunnersResponse{Runners: rs}, nil
}

// GetRunner returns one runner.
func (s *Server) GetRunner(ctx context.Context, req *gatewayv1.GetRunnerRequest) (*gatewayv1.GetRunnerResponse, error) {
	r, err := s.Gateway.GetRunner(ctx, req.GetRunnerInstanceId())
	if err != nil {
		return nil, err
	}
	return &gatewayv1.GetRunnerResponse{Runner: r}, nil
}

// SuspendRunner suspends a session scope's runner and checkpoints it.
func (s *Server) SuspendRunner(ctx context.Context, req *gatewayv1.SuspendRunnerRequest) (*gatewayv1.SuspendRunnerResponse, error) {
	return s.Gateway.SuspendRunner(ctx, req)
}

// CloseRunner closes a scope's live runner.
func (s *Server) CloseRunner(ctx context.Context, req *gatewayv1.CloseRunnerRequest) (*gatewayv1.CloseRunnerResponse, error) {
	return s.Gateway.CloseRunner(ctx, req)
}
