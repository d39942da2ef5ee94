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
	require.Equal(t, Reason("run_id_conflict"), CodeOf(st.Err()))
	require.Equal(t, Reason("run_id_conflict"), CodeOf(fmt.Errorf("wrapped: %w", err)))
}

// TestReasonRegistry walks every registered reason: it is a snake_case code,
// its status message carries the prefix once (also when the message already
// had it, as a relayed runner result does), and the status has the reason's
// gRPC code and ErrorInfo.
func TestReasonRegistry(t *testing.T) {
	t.Parallel()
	reasons := Registered()
	require.NotEmpty(t, reasons)
	for _, r := range reasons {
		info, ok := Lookup(r)
		require.True(t, ok, r)
		require.NotEqual(t, codes.OK, info.GRPC, r)
		require.Regexp(t, `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`, string(r))
		for _, msg := range []string{"what happened", string(r) + ": what happened"} {
			st := status.Convert(Newf(r, "%s", msg))
			require.Equal(t, info.GRPC, st.Code(), r)
			require.Equal(t, string(r)+": what happened", st.Message())
			require.Equal(t, r, CodeOf(st.Err()))
			wrapped := Wrap(Newf(r, "%s", msg), info.GRPC, r, "%v", Newf(r, "%s", msg))
			require.Equal(t, string(r)+": what happened", wrapped.Error())
		}
		require.Equal(t, string(r), Newf(r, "").Error())
	}
}

func TestQualifiedReason(t *testing.T) {
	t.Parallel()
	r := Qualified(RunnerRemoteTransportCapabilityMissing, "listen_ws")
	require.Equal(t, Reason("runner_remote_transport_capability_missing:listen_ws"), r)
	require.Equal(t, Reason(RunnerRemoteTransportCapabilityMissing), r.Base())
	require.Equal(t, codes.FailedPrecondition, r.GRPC())
}

func TestCodeOfNeverParsesMessages(t *testing.T) {
	t.Parallel()
	require.Equal(t, Reason(""), CodeOf(errors.New("provider_stdout_closed: gone")))
	require.Equal(t, Reason(""), CodeOf(status.Error(codes.Unavailable, "provider_stdout_closed: gone")))
	require.Equal(t, Reason(ProviderStdoutClosed), CodeOf(reasoned{}))
}

type reasoned struct{}

func (reasoned) Error() string         { return "x" }
func (reasoned) FailureReason() Reason { return ProviderStdoutClosed }

func TestToStatus(t *testing.T) {
	require.Nil(t, ToStatus(nil))
	require.Equal(t, codes.Canceled, status.Code(ToStatus(context.Canceled)))
	require.Equal(t, codes.Internal, status.Code(ToStatus(errors.New("boom"))))
	require.Equal(t, Reason("internal"), CodeOf(ToStatus(errors.New("boom"))))
	s := status.Error(codes.NotFound, "x")
	require.Equal(t, s, ToStatus(s))
}
