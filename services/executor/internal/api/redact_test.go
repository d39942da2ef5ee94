package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// A credential the caller configures for its provider (SPEC E2) reaches the
// run's attempts but is never read back: SubmitRun, GetRun and ListRuns show
// the configured names, each naming the company secret its value is stored
// as (SPEC T3), and no value.
func TestE2_ConfiguredEnvironmentValuesAreStoredForTheRunButRedactedInEveryRead(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	const secret = "sk-test-0123456789abcdef"
	in := validInput()
	in.Environment = &prpv1.ProviderEnvironment{Configured: map[string]string{"OPENAI_API_KEY": secret, "FOO": "bar"}}
	sub, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "redact-1", Input: in})
	require.NoError(t, err)
	got, err := e.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "redact-1"})
	require.NoError(t, err)
	list, err := e.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRuns(), 1)
	for name, run := range map[string]*executorv1.Run{"SubmitRun": sub.GetRun(), "GetRun": got.GetRun(), "ListRuns": list.GetRuns()[0]} {
		require.Empty(t, run.GetInput().GetEnvironment().GetConfigured(), name)
		refs := run.GetInput().GetEnvironment().GetSecretRefs()
		require.Len(t, refs, 2, name)
		require.True(t, strings.HasPrefix(refs["OPENAI_API_KEY"], "env.OPENAI_API_KEY."), "%s: %v", name, refs)
		require.NotContains(t, protojson.Format(run), secret, name)
	}
	// The run's attempts resolve the value from its reference.
	stored, err := e.store.GetRun(ctx, "redact-1")
	require.NoError(t, err)
	vals, err := e.vault.Resolve(ctx, "acme", stored.GetInput().GetEnvironment().GetSecretRefs())
	require.NoError(t, err)
	require.Equal(t, map[string]string{"OPENAI_API_KEY": secret, "FOO": "bar"}, vals)

	// Idempotent resubmission still matches the stored input.
	again, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "redact-1", Input: in})
	require.NoError(t, err)
	require.False(t, again.GetCreated())
}
