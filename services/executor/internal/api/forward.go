package api

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/authz"
)

// ownerCall is a method answered by the replica that drives the run (it
// holds the run's live provider session): reply makes an empty response
// for a forwarded call; endedHere answers a run that has ended on this
// replica instead of refusing it (its authority is revoked wherever it is
// asked, SPEC E13).
type ownerCall struct {
	reply     func() any
	endedHere bool
}

var ownerCalls = map[string]ownerCall{
	executorv1.ExecutorService_GetSteeringState_FullMethodName: {reply: func() any { return new(executorv1.GetSteeringStateResponse) }},
	executorv1.ExecutorService_SteerRun_FullMethodName:         {reply: func() any { return new(executorv1.SteerRunResponse) }},
	executorv1.ExecutorService_ResolveRuntimeRequest_FullMethodName: {
		reply: func() any { return new(executorv1.ResolveRuntimeRequestResponse) }},
	executorv1.ExecutorService_CompleteToolCall_FullMethodName: {
		reply: func() any { return new(executorv1.CompleteToolCallResponse) }, endedHere: true},
}

// ForwardToOwner is a unary interceptor: a call of ownerCalls for a run
// driven by another replica (the address recorded with its lease) is sent
// there as it came, after this replica's validation; every other call, and
// a run driven here or by nobody, goes to the handler.
func (s *Server) ForwardToOwner(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	call, ok := ownerCalls[info.FullMethod]
	r, hasRun := req.(interface{ GetRunId() string })
	if !ok || !hasRun {
		return handler(ctx, req)
	}
	conn, company, err := s.ownerOf(ctx, r.GetRunId(), companyOf(req))
	if call.endedHere && failure.CodeOf(err) == failure.NativeRunAlreadyTerminal {
		return handler(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	if conn == nil {
		return handler(ctx, req)
	}
	reply := call.reply()
	if err := conn.Invoke(forwardedAuth(ctx), info.FullMethod, withCompany(req, company), reply); err != nil {
		return nil, err
	}
	return reply, nil
}

// ownerOf is owner of the run a caller names (SPEC T2: by the id its
// company chose; the call is forwarded as it came, and the owner resolves
// it again).
func (s *Server) ownerOf(ctx context.Context, id, company string) (*grpc.ClientConn, string, error) {
	if s.Controls == nil {
		return nil, "", nil
	}
	run, err := s.resolve(ctx, id, company)
	if err != nil {
		return nil, "", err
	}
	conn, err := s.owner(ctx, run.Key)
	return conn, run.Company, err
}

// withCompany is a forwarded request naming the run's company: the owner
// authorizes the call again, maybe as this replica (its certificate, an
// operator's reach), and must find the same run however many companies
// use its id (SPEC T2).
func withCompany(req any, company string) any {
	m, ok := req.(proto.Message)
	if !ok || company == "" || companyOf(req) != "" {
		return req
	}
	f := m.ProtoReflect().Descriptor().Fields().ByName("company_id")
	if f == nil {
		return req
	}
	m = proto.Clone(m)
	m.ProtoReflect().Set(f, protoreflect.ValueOfString(company))
	return m
}

func companyOf(req any) string {
	r, _ := req.(interface{ GetCompanyId() string })
	if r == nil {
		return ""
	}
	return r.GetCompanyId()
}

// owner returns a connection to the replica driving the run, or nil when
// the call is answered here.
func (s *Server) owner(ctx context.Context, runID string) (*grpc.ClientConn, error) {
	if s.Controls == nil || s.Controls.Has(runID) {
		return nil, nil
	}
	addr, err := s.Store.ControllerAddr(ctx, runID)
	if err != nil {
		return nil, err
	}
	if addr == "" || addr == s.SelfAddr {
		return nil, nil
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conns == nil {
		s.conns = map[string]*grpc.ClientConn{}
	}
	conn := s.conns[addr]
	if conn == nil {
		dial := s.DialPeer
		if dial == nil {
			dial = func(addr string) (*grpc.ClientConn, error) { return grpcx.Dial(addr, "") }
		}
		if conn, err = dial(addr); err != nil {
			return nil, err
		}
		s.conns[addr] = conn
	}
	return conn, nil
}

// forwardedAuth carries the caller's bearer token (SPEC T1) to the replica
// the call is forwarded to, which authorizes it again; over mTLS this
// replica's own certificate identifies it as well.
func forwardedAuth(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(authz.MetadataKey) {
		ctx = metadata.AppendToOutgoingContext(ctx, authz.MetadataKey, v)
	}
	return ctx
}
