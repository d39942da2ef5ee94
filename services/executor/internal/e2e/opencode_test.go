package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/stack"
)

// TestR10_Stack_WarmOpenCodeSessionKeepsOneServerAndOnlyItsCredentials: an
// OpenCode session through executor → runnergw (pinned opencode profile) →
// runnerd → fake-opencode keeps one provider process over three runs on
// one OpenCode session (history reused), and a configured credential of
// another provider (ANTHROPIC_AUTH_TOKEN is Claude's) never reaches the
// server while its own (OPENAI_API_KEY) does.
func TestR10_Stack_WarmOpenCodeSessionKeepsOneServerAndOnlyItsCredentials(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	callLog, envLog := filepath.Join(dir, "opencode-calls.log"), filepath.Join(dir, "opencode.env")
	gw, err := stack.ProviderGatewayArgs("opencode", filepath.Join(binDir, "fake-opencode"), "--call-log", callLog, "--env-log", envLog)
	require.NoError(t, err)
	h := newHarness(t, stack.Options{GatewayArgs: gw})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ownKey, claudeKey = "sk-opencode-own", "sk-ant-not-for-opencode"
	providers := map[int32]bool{}
	for i, prompt := range []string{"remember alpha", "remember beta", "[history] what was said?"} {
		id := fmt.Sprintf("oc-warm-%d", i+1)
		in := h.submitInput("opencode-warm", prompt)
		in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
		in.Environment = &prpv1.ProviderEnvironment{Configured: map[string]string{
			"OPENAI_API_KEY": ownKey, "ANTHROPIC_AUTH_TOKEN": claudeKey}}
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in})
		require.NoError(t, err)
		evs := h.watch(ctx, id, 0, nil)
		requireContiguous(t, evs)
		run := h.get(id)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
		if i < 2 {
			require.Equal(t, "ECHO: "+prompt, run.GetResult().GetFinalMessage())
		} else {
			require.Equal(t, "HISTORY: remember alpha | remember beta", run.GetResult().GetFinalMessage())
		}
		require.Positive(t, run.GetProviderProcess().GetPid())
		providers[run.GetProviderProcess().GetPid()] = true
	}
	require.Len(t, providers, 1, "one OpenCode server serves the warm session")
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(calls), "process-start"), "one OpenCode process")
	require.Equal(t, 1, strings.Count(string(calls), "session.create"), "one OpenCode session")
	require.Equal(t, 3, strings.Count(string(calls), "prompt "))

	raw, err := os.ReadFile(envLog)
	require.NoError(t, err)
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	require.Equal(t, ownKey, env["OPENAI_API_KEY"], "OpenCode's own credential name reaches it")
	require.NotContains(t, env, "ANTHROPIC_AUTH_TOKEN", "another provider's credential name never reaches OpenCode")
	for k, v := range env {
		require.NotEqual(t, claudeKey, v, "%s carries the other provider's credential", k)
	}
}

// TestR10_Stack_OpenCodePermissionIsResolvedThroughTheExecutor: OpenCode's
// permission.asked reaches the caller as runtime_request.created and is
// answered with ResolveRuntimeRequest (SPEC E8): the command runs and the
// run succeeds; steering is reported unsupported.
func TestR10_Stack_OpenCodePermissionIsResolvedThroughTheExecutor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	callLog := filepath.Join(dir, "opencode-calls.log")
	gw, err := stack.ProviderGatewayArgs("opencode", filepath.Join(binDir, "fake-opencode"), "--call-log", callLog)
	require.NoError(t, err)
	h := newHarness(t, stack.Options{GatewayArgs: gw})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ws := filepath.Join(h.st.WorkspaceRoot(), "acme", t.Name())
	in := h.submitInput("opencode-permission", "[shell] write the file")
	in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
	in.Workspace = &prpv1.Workspace{Cwd: ws}
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "oc-perm", Input: in})
	require.NoError(t, err)
	created := h.awaitRuntimeRequest(ctx, "oc-perm")
	require.Equal(t, "command_approval", created["kind"])
	requestID, turnID := created["requestId"].(string), created["turnId"].(string)
	st, err := h.client.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "oc-perm"})
	require.NoError(t, err)
	require.Equal(t, "unsupported", st.GetDisposition())
	accept, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
	_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "oc-perm", RequestId: requestID, TurnId: turnID, Resolution: accept})
	require.NoError(t, err)
	run := h.waitState(ctx, h.client, "oc-perm", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, "TOOL RESULT: done-bash", run.GetResult().GetFinalMessage())
	got, err := os.ReadFile(filepath.Join(ws, "perm.txt"))
	require.NoError(t, err)
	require.Equal(t, "permitted\n", string(got))
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(calls), "permission-reply:once"))
}
