package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// D3 (operator UX): a CancelRun without a scope says what is missing, not
// "scope: must not be in list [0]".
func TestD3_CancelRunWithoutAScopeSaysWhichScopesThereAre(t *testing.T) {
	t.Parallel()
	e := start(t)
	_, err := e.client.CancelRun(context.Background(), &executorv1.CancelRunRequest{RunId: "r1"})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.EqualValues(t, failure.InvalidRequest, failure.CodeOf(err))
	require.Equal(t, "invalid_request: scope: a scope is required: CANCELLATION_SCOPE_RUN, CANCELLATION_SCOPE_TURN or CANCELLATION_SCOPE_ISSUE",
		status.Convert(err).Message())
}

// D3 (operator UX): a 5 MB prompt is refused with a stable code naming the
// field and its limit (InvalidArgument, ErrorInfo), not a bare
// ResourceExhausted from the transport.
func TestD3_AFiveMegabytePromptGetsAStableCodeNamingTheField(t *testing.T) {
	t.Parallel()
	e := start(t)
	in := validInput()
	in.Task.Prompt = strings.Repeat("x", 5<<20)
	_, err := e.client.SubmitRun(context.Background(), &executorv1.SubmitRunRequest{RunId: "big", Input: in})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.EqualValues(t, failure.InvalidRequest, failure.CodeOf(err))
	require.Contains(t, status.Convert(err).Message(), "input.task.prompt")
	require.Contains(t, status.Convert(err).Message(), "65536 bytes")
}
