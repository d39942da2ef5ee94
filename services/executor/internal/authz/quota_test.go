package authz_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// TestQ4_ACallerSeesTheUsageOfItsOwnCompanyOnly: acme's reader reads
// acme's usage (its queued run counted) and limits; globex's usage and
// limits are PermissionDenied to it; setting limits needs a fleet
// operator (acme's writer is refused), and the operator's change is what
// acme's reader then reads, refusals counted in its usage.
func TestQ4_ACallerSeesTheUsageOfItsOwnCompanyOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	writer := e.as("acme-w", "acme:writer")
	_, err := executorv1.NewExecutorServiceClient(writer).SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "q4-1", Input: input("acme", "q4", "x")})
	require.NoError(t, err)
	reader := executorv1.NewCompaniesClient(e.as("acme-r", "acme:reader"))
	u, err := reader.GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "acme"})
	require.NoError(t, err)
	require.EqualValues(t, 1, u.GetUsage().GetQueuedRuns())
	require.Equal(t, "ok", u.GetUsage().GetBudgetState())
	require.True(t, u.GetUsage().GetLimits().GetIsDefault())
	_, err = reader.GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "globex"})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = reader.GetCompanyLimits(ctx, &executorv1.GetCompanyLimitsRequest{CompanyId: "globex"})
	require.Equal(t, codes.PermissionDenied, status.Code(err))

	one := int32(1)
	limits := &executorv1.CompanyLimits{CompanyId: "acme", MaxQueuedRuns: &one}
	_, err = executorv1.NewCompaniesClient(writer).SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{Limits: limits})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = executorv1.NewCompaniesClient(e.as("op", "operator")).SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{Limits: limits, Reason: "Q4"})
	require.NoError(t, err)
	_, err = executorv1.NewExecutorServiceClient(writer).SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "q4-2", Input: input("acme", "q4", "y")})
	require.EqualValues(t, failure.QuotaQueuedRuns, failure.CodeOf(err))
	u, err = reader.GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: "acme"})
	require.NoError(t, err)
	require.False(t, u.GetUsage().GetLimits().GetIsDefault())
	require.EqualValues(t, 1, u.GetUsage().GetLimits().GetMaxQueuedRuns())
	require.EqualValues(t, 1, u.GetUsage().GetRefused()[failure.QuotaQueuedRuns])
}
