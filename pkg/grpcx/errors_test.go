package grpcx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
)

func TestCodedErrorGivesValidationFailuresAStableCode(t *testing.T) {
	v := &validate.Violations{Violations: []*validate.Violation{{
		Message: proto.String("value is required"),
		Field: &validate.FieldPath{Elements: []*validate.FieldPathElement{
			{FieldName: proto.String("input")}, {FieldName: proto.String("task")}, {FieldName: proto.String("prompt")},
		}},
	}}}
	st, err := status.New(codes.InvalidArgument, "validation errors: x").WithDetails(v)
	require.NoError(t, err)
	out := status.Convert(codedError(st.Err()))
	require.Equal(t, codes.InvalidArgument, out.Code())
	require.Equal(t, "invalid_request: input.task.prompt: value is required", out.Message())
	require.EqualValues(t, failure.InvalidRequest, failure.CodeOf(out.Err()))
	require.Len(t, out.Details(), 3, "ErrorInfo, the original violations and their BadRequest")

	own := failure.New(codes.InvalidArgument, "provider_not_admitted", "x")
	require.Equal(t, own.Error(), status.Convert(codedError(status.Convert(own).Err())).Message())
	require.Nil(t, codedError(nil))
}

// Handlers return their domain errors as they get them: the mapping is the
// interceptor's, so a wrapped tether error keeps its code, a context's end
// keeps its meaning, and nothing leaves as codes.Unknown.
func TestCodedErrorMapsTheErrorsHandlersReturnAsTheyAre(t *testing.T) {
	for _, c := range []struct {
		in   error
		code codes.Code
		want failure.Reason
	}{
		{fmt.Errorf("steering: %w", failure.New(codes.FailedPrecondition, failure.NativeRunAlreadyTerminal, "run r ended")),
			codes.FailedPrecondition, failure.NativeRunAlreadyTerminal},
		{fmt.Errorf("reading the run: %w", context.DeadlineExceeded), codes.DeadlineExceeded, failure.DeadlineExceeded},
		{context.Canceled, codes.Canceled, failure.Canceled},
		{errors.New("disk on fire"), codes.Internal, failure.Internal},
	} {
		out := codedError(c.in)
		st := status.Convert(out)
		require.Equal(t, c.code, st.Code(), "%v", c.in)
		require.Equal(t, c.want, failure.CodeOf(out), "%v", c.in)
		require.True(t, strings.HasPrefix(st.Message(), string(c.want)+": "), "%q", st.Message())
		require.False(t, strings.HasPrefix(st.Message(), string(c.want)+": "+string(c.want)), "no doubled prefix: %q", st.Message())
	}
}
