package grpcx

import (
	"context"
	"strings"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/tether-run/tether/pkg/failure"
)

// codedError is the error mapping of every handler: a domain error becomes
// its status (failure.ToStatus: a tether error as it is, a context's end as
// canceled/deadline_exceeded, anything else internal), so handlers return
// their errors as they get them. Errors produced by middleware (validation,
// recovery) get the same shape as tether's own: a stable code as the
// message prefix and an ErrorInfo detail. Errors that already carry a
// tether code pass through.
func codedError(err error) error {
	if err == nil {
		return nil
	}
	err = failure.ToStatus(err)
	st, ok := status.FromError(err)
	if !ok || failure.CodeOf(err) != "" && hasTetherInfo(st) {
		return err
	}
	var code string
	var details []protoadapt.MessageV1
	switch {
	case st.Code() == codes.InvalidArgument && hasViolations(st):
		code = failure.InvalidRequest
		var parts []string
		for _, d := range st.Details() {
			if v, ok := d.(*validate.Violations); ok {
				for _, viol := range v.GetViolations() {
					parts = append(parts, fieldPath(viol)+": "+viol.GetMessage())
				}
				details = append(details, protoadapt.MessageV1Of(v))
			}
		}
		st = status.New(codes.InvalidArgument, code+": "+strings.Join(parts, "; "))
	case st.Code() == codes.Internal && st.Message() == "internal error":
		code = failure.Internal
		st = status.New(codes.Internal, "internal: internal error")
	default:
		return err
	}
	all := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: code, Domain: failure.Domain}}, details...)
	if d, derr := st.WithDetails(all...); derr == nil {
		st = d
	}
	return st.Err()
}

func hasTetherInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == failure.Domain {
			return true
		}
	}
	return false
}

func hasViolations(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*validate.Violations); ok {
			return true
		}
	}
	return false
}

// fieldPath renders a violation's field path as dotted proto field names.
func fieldPath(v *validate.Violation) string {
	var names []string
	for _, e := range v.GetField().GetElements() {
		names = append(names, e.GetFieldName())
	}
	if len(names) == 0 {
		return "request"
	}
	return strings.Join(names, ".")
}

func unaryCodedErrors(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, codedError(err)
}

func streamCodedErrors(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return codedError(handler(srv, ss))
}
