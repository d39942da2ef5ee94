package grpcx

import (
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
	require.Len(t, out.Details(), 2, "ErrorInfo plus the original violations")

	own := failure.New(codes.InvalidArgument, "provider_not_admitted", "x")
	require.Equal(t, own.Error(), status.Convert(codedError(status.Convert(own).Err())).Message())
	require.Nil(t, codedError(nil))
}
