package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// TestT3_TheGatewayCompletesARunAttachWithTheOpensInput: the executor
// sends the run's input once (in the attach's Open) and its run.attach
// carries the provider environment alone, secret values included; the
// runner reads a run.attach with the Open's input and that environment.
// A run.attach with its input (the previous release's executor) is relayed
// as it is, and so is every other command.
func TestT3_TheGatewayCompletesARunAttachWithTheOpensInput(t *testing.T) {
	t.Parallel()
	open := &prpv1.ExecutionInput{
		Task:        &prpv1.Task{Prompt: "hello"},
		Environment: &prpv1.ProviderEnvironment{Configured: map[string]string{"PLAIN": "x"}},
	}
	env := &prpv1.ProviderEnvironment{Configured: map[string]string{"PLAIN": "x", "TOKEN": "secret-value"}}
	cmd := prp.NewCommand(&prpv1.RunAttach{Environment: env})
	completeAttach(cmd, open)
	body, err := prp.RunAttachOf(cmd)
	require.NoError(t, err)
	require.Equal(t, "hello", body.GetInput().GetTask().GetPrompt())
	require.True(t, proto.Equal(env, body.GetInput().GetEnvironment()))
	require.Nil(t, body.GetEnvironment(), "the runner reads the environment in the input, as before")
	require.Equal(t, map[string]string{"PLAIN": "x"}, open.GetEnvironment().GetConfigured(), "the Open's input is not changed")

	old := &prpv1.ExecutionInput{Task: &prpv1.Task{Prompt: "from the command"}}
	legacy := prp.NewCommand(&prpv1.RunAttach{Input: old})
	completeAttach(legacy, open)
	body, err = prp.RunAttachOf(legacy)
	require.NoError(t, err)
	require.Equal(t, "from the command", body.GetInput().GetTask().GetPrompt())

	turn := prp.NewCommand(&prpv1.TurnStart{Text: "go"})
	completeAttach(turn, open)
	require.Nil(t, turn.GetRunAttach())
}
