package grpcx

import (
	"context"
	"strings"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-run/tether/pkg/failure"
)

// codedError is the error mapping of every handler: a domain error becomes
// its status (failure.ToStatus: a tether error as it is, a context's end as
// canceled/deadline_exceeded, anything else internal), so handlers return
// their errors as they get them. Errors produced by middleware (validation,
// recovery) get the same shape as tether's own: a stable code as the
// message prefix and an ErrorInfo detail. Errors that already carry a
// tether code keep it. Every error then gets the standard details a client
// library acts on (withStandardDetails): RetryInfo where a retry helps,
// BadRequest field violations for invalid input.
func codedError(err error) error {
	if err == nil {
		return nil
	}
	err = failure.ToStatus(err)
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if failure.CodeOf(err) == "" || !hasTetherInfo(st) {
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
		}
		if code != "" {
			all := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: code, Domain: failure.Domain}}, details...)
			if d, derr := st.WithDetails(all...); derr == nil {
				st = d
			}
		}
	}
	if more := standardDetails(st); len(more) > 0 {
		if d, derr := st.WithDetails(more...); derr == nil {
			return d.Err()
		}
	}
	if code := failure.CodeOf(err); code != "" && hasTetherInfo(st) && failure.CodeOf(st.Err()) == code {
		return err // unchanged: keep the original error for the interceptors above
	}
	return st.Err()
}

// RetryDelay is the retry_delay of the RetryInfo detail: a hint for the
// first retry (clients back off from there).
const RetryDelay = time.Second

// standardDetails returns the google.rpc details st lacks (AIP-193):
//   - RetryInfo when a retry of the same request can succeed: the status code
//     is Unavailable, ResourceExhausted or Aborted, or the tether reason's
//     registered retry class is Transient (e.g. a steering refusal);
//   - BadRequest for InvalidArgument: one field violation per protovalidate
//     violation, or the field the ErrorInfo metadata names
//     (failure.MetadataField).
func standardDetails(st *status.Status) []protoadapt.MessageV1 {
	var (
		info      *errdetails.ErrorInfo
		hasRetry  bool
		hasBad    bool
		fieldViol []*errdetails.BadRequest_FieldViolation
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == failure.Domain {
				info = d
			}
		case *errdetails.RetryInfo:
			hasRetry = true
		case *errdetails.BadRequest:
			hasBad = true
		case *validate.Violations:
			for _, v := range d.GetViolations() {
				fieldViol = append(fieldViol, &errdetails.BadRequest_FieldViolation{
					Field: fieldPath(v), Description: v.GetMessage(), Reason: v.GetRuleId(),
				})
			}
		}
	}
	var out []protoadapt.MessageV1
	if !hasRetry && retryHelps(st.Code(), info) {
		out = append(out, &errdetails.RetryInfo{RetryDelay: durationpb.New(RetryDelay)})
	}
	if !hasBad && st.Code() == codes.InvalidArgument {
		if len(fieldViol) == 0 && info.GetMetadata()[failure.MetadataField] != "" {
			fieldViol = append(fieldViol, &errdetails.BadRequest_FieldViolation{
				Field:       info.GetMetadata()[failure.MetadataField],
				Description: strings.TrimPrefix(st.Message(), info.GetReason()+": "),
				Reason:      info.GetReason(),
			})
		}
		if len(fieldViol) > 0 {
			out = append(out, &errdetails.BadRequest{FieldViolations: fieldViol})
		}
	}
	return out
}

// retryHelps says whether the same request, sent again later, can succeed.
func retryHelps(c codes.Code, info *errdetails.ErrorInfo) bool {
	switch c {
	case codes.ResourceExhausted:
		// Unless its reason says waiting does not help (budget_exhausted:
		// until the budget is raised or the month ends).
		return info == nil || failure.Reason(info.GetReason()).Retry() != failure.Permanent
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return info != nil && failure.Reason(info.GetReason()).Retry() == failure.Transient
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
