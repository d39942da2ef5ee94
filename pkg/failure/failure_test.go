package failure

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorCarriesCodeAndErrorInfo(t *testing.T) {
	err := New(codes.AlreadyExists, "run_id_conflict", "run %q exists with another input", "r1")
	st := status.Convert(err)
	require.Equal(t, codes.AlreadyExists, st.Code())
	require.Equal(t, `run_id_conflict: run "r1" exists with another input`, st.Message())
	require.Len(t, st.Details(), 1)
	info := st.Details()[0].(*errdetails.ErrorInfo)
	require.Equal(t, "run_id_conflict", info.GetReason())
	require.Equal(t, Domain, info.GetDomain())
	require.Equal(t, "run_id_conflict", CodeOf(st.Err()))
	require.Equal(t, "run_id_conflict", CodeOf(fmt.Errorf("wrapped: %w", err)))
}

func TestLeadingCode(t *testing.T) {
	cases := map[string]string{
		"native_event_replay_conflict: source sequence 3 contained different bytes": "native_event_replay_conflict",
		"provider_stdout_closed": "provider_stdout_closed",
		"plain words: nothing":   "",
		"Upper_case: x":          "",
		"nounderscore: x":        "",
		"":                       "",
	}
	for in, want := range cases {
		require.Equal(t, want, LeadingCode(in), in)
	}
}

func TestToStatus(t *testing.T) {
	require.Nil(t, ToStatus(nil))
	require.Equal(t, codes.Canceled, status.Code(ToStatus(context.Canceled)))
	require.Equal(t, codes.Internal, status.Code(ToStatus(errors.New("boom"))))
	require.Equal(t, "internal", CodeOf(ToStatus(errors.New("boom"))))
	s := status.Error(codes.NotFound, "x")
	require.Equal(t, s, ToStatus(s))
}
