package grant

import (
	"context"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// Client wraps a RunnerGateway client so that every call carries a grant
// signed by s for the gateway named audience. Unary calls are signed from
// their request; an Attach stream is opened (its headers carry the grant)
// when its first message, the Open, is sent, because only the Open names
// the run and its lease.
func Client(inner gatewayv1.RunnerGatewayClient, s *Signer, audience string) gatewayv1.RunnerGatewayClient {
	return &client{inner: inner, s: s, aud: audience}
}

type client struct {
	inner gatewayv1.RunnerGatewayClient
	s     *Signer
	aud   string
}

// Outgoing returns ctx carrying a grant for c signed by s.
func (s *Signer) Outgoing(ctx context.Context, c Claims) (context.Context, error) {
	tok, err := s.Sign(c)
	if err != nil {
		return nil, err
	}
	return metadata.AppendToOutgoingContext(ctx, Header, tok), nil
}

func (c *client) ctx(ctx context.Context, cl Claims) (context.Context, error) {
	cl.Audience = c.aud
	return c.s.Outgoing(ctx, cl)
}

// ClaimsForOpen are the claims an Attach with this Open needs.
func ClaimsForOpen(o *gatewayv1.Open) Claims {
	return Claims{Method: MethodAttach, RunID: o.GetRunId(), Owner: o.GetFence().GetOwner(),
		Attempt: o.GetFence().GetAttempt(), Scope: scope.OfRun(o.GetRunId(), o.GetInput()), Turn: o.GetTurn()}
}

func (c *client) ListRunners(ctx context.Context, in *gatewayv1.ListRunnersRequest, opts ...grpc.CallOption) (*gatewayv1.ListRunnersResponse, error) {
	ctx, err := c.ctx(ctx, Claims{Method: MethodListRunners})
	if err != nil {
		return nil, err
	}
	return c.inner.ListRunners(ctx, in, opts...)
}

func (c *client) GetRunner(ctx context.Context, in *gatewayv1.GetRunnerRequest, opts ...grpc.CallOption) (*gatewayv1.GetRunnerResponse, error) {
	ctx, err := c.ctx(ctx, Claims{Method: MethodGetRunner})
	if err != nil {
		return nil, err
	}
	return c.inner.GetRunner(ctx, in, opts...)
}

func (c *client) SuspendRunner(ctx context.Context, in *gatewayv1.SuspendRunnerRequest, opts ...grpc.CallOption) (*gatewayv1.SuspendRunnerResponse, error) {
	ctx, err := c.ctx(ctx, Claims{Method: MethodSuspendRunner, RunID: in.GetRunId(), Scope: scope.OfRun(in.GetRunId(), in.GetInput())})
	if err != nil {
		return nil, err
	}
	return c.inner.SuspendRunner(ctx, in, opts...)
}

func (c *client) CloseRunner(ctx context.Context, in *gatewayv1.CloseRunnerRequest, opts ...grpc.CallOption) (*gatewayv1.CloseRunnerResponse, error) {
	ctx, err := c.ctx(ctx, Claims{Method: MethodCloseRunner, RunID: in.GetRunId(), Scope: scope.OfRun(in.GetRunId(), in.GetInput())})
	if err != nil {
		return nil, err
	}
	return c.inner.CloseRunner(ctx, in, opts...)
}

func (c *client) Attach(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[gatewayv1.AttachRequest, gatewayv1.AttachResponse], error) {
	return &attachStream{c: c, ctx: ctx, opts: opts, ready: make(chan struct{})}, nil
}

// attachStream opens the real stream on its first Send.
type attachStream struct {
	c    *client
	ctx  context.Context
	opts []grpc.CallOption

	once   sync.Once
	ready  chan struct{} // closed once stream or err is set
	stream grpc.BidiStreamingClient[gatewayv1.AttachRequest, gatewayv1.AttachResponse]
	err    error
}

func (a *attachStream) open(first *gatewayv1.AttachRequest) {
	a.once.Do(func() {
		defer close(a.ready)
		cl := Claims{Method: MethodAttach}
		if o := first.GetOpen(); o != nil {
			cl = ClaimsForOpen(o)
		}
		ctx, err := a.c.ctx(a.ctx, cl)
		if err != nil {
			a.err = err
			return
		}
		a.stream, a.err = a.c.inner.Attach(ctx, a.opts...)
	})
}

// wait blocks until the stream is opened (or the context ends).
func (a *attachStream) wait() error {
	select {
	case <-a.ready:
		return a.err
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

func (a *attachStream) Send(m *gatewayv1.AttachRequest) error {
	a.open(m)
	if err := a.wait(); err != nil {
		return err
	}
	return a.stream.Send(m)
}

func (a *attachStream) Recv() (*gatewayv1.AttachResponse, error) {
	if err := a.wait(); err != nil {
		return nil, err
	}
	return a.stream.Recv()
}

func (a *attachStream) Header() (metadata.MD, error) {
	if err := a.wait(); err != nil {
		return nil, err
	}
	return a.stream.Header()
}

func (a *attachStream) Trailer() metadata.MD {
	select {
	case <-a.ready:
		if a.stream != nil {
			return a.stream.Trailer()
		}
	default:
	}
	return nil
}

func (a *attachStream) CloseSend() error {
	select {
	case <-a.ready:
		if a.stream != nil {
			return a.stream.CloseSend()
		}
		return a.err
	default:
		// Never opened: nothing to close; a Recv waiting for the open
		// learns the stream ended.
		a.once.Do(func() { a.err = io.EOF; close(a.ready) })
		return nil
	}
}

func (a *attachStream) Context() context.Context {
	select {
	case <-a.ready:
		if a.stream != nil {
			return a.stream.Context()
		}
	default:
	}
	return a.ctx
}

func (a *attachStream) SendMsg(m any) error {
	req, ok := m.(*gatewayv1.AttachRequest)
	if !ok {
		return fmt.Errorf("grant: Attach sends *AttachRequest, not %T", m)
	}
	return a.Send(req)
}

func (a *attachStream) RecvMsg(m any) error {
	if err := a.wait(); err != nil {
		return err
	}
	return a.stream.RecvMsg(m)
}
