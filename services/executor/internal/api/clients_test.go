package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// details returns the google.rpc details of err by type.
func details(err error) (info *errdetails.ErrorInfo, retry *errdetails.RetryInfo, bad *errdetails.BadRequest) {
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.BadRequest:
			bad = d
		}
	}
	return info, retry, bad
}

func violationFields(bad *errdetails.BadRequest) []string {
	var out []string
	for _, v := range bad.GetFieldViolations() {
		out = append(out, v.GetField())
	}
	return out
}

// SPEC U1 (AIP-158): ListRuns pages with next_page_token, filters on a
// company, and a token sent with other filters than the call that issued it
// is InvalidArgument page_token_filter_mismatch naming page_token.
func TestU1_ListRunsPagesAndItsTokensAreBoundToTheirFilters(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	for i := range 5 {
		in := validInput()
		if i%2 == 1 {
			in.Binding.CompanyId = "globex"
		}
		_, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: fmt.Sprintf("r%d", i), Input: in})
		require.NoError(t, err)
	}
	// Every page of acme's runs, two at a time: r4, r2, r0.
	var got []string
	req := &executorv1.ListRunsRequest{PageSize: 2, CompanyId: "acme"}
	var firstToken string
	for {
		resp, err := e.client.ListRuns(ctx, req)
		require.NoError(t, err)
		for _, r := range resp.GetRuns() {
			got = append(got, r.GetRunId())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		if firstToken == "" {
			firstToken = resp.GetNextPageToken()
		}
		req.PageToken = resp.GetNextPageToken()
	}
	require.Equal(t, []string{"r4", "r2", "r0"}, got)

	resp, err := e.client.ListRuns(ctx, &executorv1.ListRunsRequest{CompanyId: "globex"})
	require.NoError(t, err)
	require.Len(t, resp.GetRuns(), 2)
	for _, r := range resp.GetRuns() {
		require.Equal(t, "globex", r.GetInput().GetBinding().GetCompanyId())
	}

	// The token of acme's listing, sent for globex's or with a state filter.
	for _, other := range []*executorv1.ListRunsRequest{
		{PageSize: 2, CompanyId: "globex", PageToken: firstToken},
		{PageSize: 2, CompanyId: "acme", State: executorv1.RunState_RUN_STATE_QUEUED, PageToken: firstToken},
		{PageSize: 2, PageToken: firstToken},
	} {
		_, err := e.client.ListRuns(ctx, other)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.EqualValues(t, failure.PageTokenFilterMismatch, failure.CodeOf(err))
		_, _, bad := details(err)
		require.Equal(t, []string{"page_token"}, violationFields(bad))
	}
	// Another page size is not another filter.
	resp, err = e.client.ListRuns(ctx, &executorv1.ListRunsRequest{PageSize: 5, CompanyId: "acme", PageToken: firstToken})
	require.NoError(t, err)
	require.Len(t, resp.GetRuns(), 1)
	require.Equal(t, "r0", resp.GetRuns()[0].GetRunId())

	_, err = e.client.ListRuns(ctx, &executorv1.ListRunsRequest{PageToken: "bm90LWEtdG9rZW4"})
	require.EqualValues(t, failure.PageTokenInvalid, failure.CodeOf(err))
}

// SPEC U1: ListGateways pages by gateway id.
func TestU1_ListGatewaysPages(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	for i := range 5 {
		_, err := e.store.RegisterGateway(ctx, store.GatewayAnnouncement{ID: fmt.Sprintf("gw-%d", i),
			Address: fmt.Sprintf("127.0.0.1:%d", 9000+i), Capacity: 4}, api.DefaultGatewayTTL)
		require.NoError(t, err)
	}
	reg := &api.Registry{Store: e.store}
	var got []string
	req := &executorv1.ListGatewaysRequest{PageSize: 2}
	pages := 0
	for {
		resp, err := reg.ListGateways(ctx, req)
		require.NoError(t, err)
		pages++
		for _, g := range resp.GetGateways() {
			got = append(got, g.GetGatewayId())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	require.Equal(t, 3, pages)
	require.Equal(t, []string{"gw-0", "gw-1", "gw-2", "gw-3", "gw-4"}, got)
	all, err := reg.ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetGateways(), 5)
	require.Empty(t, all.GetNextPageToken())
}

// SPEC U1 (AIP-193): invalid input carries google.rpc.BadRequest field
// violations beside the ErrorInfo, and a refusal a retry can cure carries
// google.rpc.RetryInfo — added at the server's edge for every handler.
func TestU1_ErrorsCarryBadRequestFieldViolationsAndRetryInfo(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()

	// protovalidate's violations.
	in := validInput()
	in.Task.Prompt = ""
	_, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "../x", Input: in})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	info, retry, bad := details(err)
	require.Equal(t, failure.InvalidRequest, info.GetReason())
	require.Nil(t, retry, "invalid input is not retried")
	require.ElementsMatch(t, []string{"run_id", "input.task.prompt"}, violationFields(bad))
	for _, v := range bad.GetFieldViolations() {
		require.NotEmpty(t, v.GetDescription())
	}

	// A handler's own refusal naming its field (admission).
	in = validInput()
	in.Provider.Kind = "opencode"
	_, err = e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r1", Input: in})
	info, _, bad = details(err)
	require.Equal(t, "provider_not_admitted", info.GetReason())
	require.Len(t, bad.GetFieldViolations(), 1)
	require.Equal(t, info.GetMetadata()[failure.MetadataField], bad.GetFieldViolations()[0].GetField())
	require.Equal(t, "provider_not_admitted", bad.GetFieldViolations()[0].GetReason())

	// Steering a run with no live provider session: Unavailable, retry later.
	_, err = e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r2", Input: validInput()})
	require.NoError(t, err)
	_, err = e.client.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "r2", Message: "also this"})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	info, retry, bad = details(err)
	require.Equal(t, failure.SteeringTemporarilyUnavailable, info.GetReason())
	require.NotNil(t, retry)
	require.Equal(t, grpcx.RetryDelay, retry.GetRetryDelay().AsDuration())
	require.Nil(t, bad)

	// A permanent refusal carries neither.
	_, err = e.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "nope"})
	require.Equal(t, codes.NotFound, status.Code(err))
	info, retry, bad = details(err)
	require.NotEmpty(t, info.GetReason())
	require.Nil(t, retry)
	require.Nil(t, bad)
}

// SPEC U1: ListSecrets pages by name with a token bound to the company.
func TestU1_ListSecretsPagesWithCompanyBoundTokens(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	for _, s := range []struct{ company, name string }{{"acme", "c"}, {"acme", "a"}, {"acme", "b"}, {"globex", "a"}} {
		_, err := e.client.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: s.company, Name: s.name, Value: []byte("v")})
		require.NoError(t, err)
	}
	first, err := e.client.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "acme", PageSize: 2})
	require.NoError(t, err)
	require.Len(t, first.GetSecrets(), 2)
	require.NotEmpty(t, first.GetNextPageToken())
	second, err := e.client.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "acme", PageSize: 2, PageToken: first.GetNextPageToken()})
	require.NoError(t, err)
	require.Empty(t, second.GetNextPageToken())
	var names []string
	for _, s := range append(first.GetSecrets(), second.GetSecrets()...) {
		names = append(names, s.GetName())
	}
	require.Equal(t, []string{"a", "b", "c"}, names)

	_, err = e.client.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "globex", PageToken: first.GetNextPageToken()})
	require.EqualValues(t, failure.PageTokenFilterMismatch, failure.CodeOf(err))
	_, _, bad := details(err)
	require.Equal(t, []string{"page_token"}, violationFields(bad))
}
