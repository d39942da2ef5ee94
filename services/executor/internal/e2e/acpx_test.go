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

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// acpxStack is a stack whose gateway launches the fake ACP agent, pinned,
// for the acpx-codex profile; its call log says which processes started
// and what they were asked.
func acpxStack(t *testing.T, fakeArgs ...string) (*harness, string) {
	t.Helper()
	fake := filepath.Join(binDir, "fake-acp-agent")
	sum, err := providerlaunch.FileSHA256(fake)
	require.NoError(t, err)
	calls := filepath.Join(t.TempDir(), "fake-acp-calls.log")
	args := []string{
		"-acpx-codex-command", fake, "-acpx-codex-arg", "-flavor", "-acpx-codex-arg", "codex",
		"-acpx-codex-arg", "-call-log", "-acpx-codex-arg", calls,
		"-acpx-codex-version", providerlaunch.Versions[providerlaunch.ACPXCodex], "-acpx-codex-sha256", sum,
	}
	for _, a := range fakeArgs {
		args = append(args, "-acpx-codex-arg", a)
	}
	h := newHarness(t, stack.Options{GatewayArgs: args})
	return h, calls
}

func acpxInput(h *harness, session, prompt, agent string) *prpv1.ExecutionInput {
	in := h.submitInput(session, prompt)
	in.Provider = &prpv1.Provider{Kind: provenv.KindACPX, Agent: agent, PermissionMode: "approve-all"}
	in.Session.DriverKind = provenv.DriverACPXRuntime
	return in
}

// TestR11_Stack_WarmACPXCodexSessionKeepsOneAgentProcess: three runs of a
// warm ACPX codex session, through executor, runnergw and runnerd, are
// served by one agent process and one ACP session whose history grows.
func TestR11_Stack_WarmACPXCodexSessionKeepsOneAgentProcess(t *testing.T) {
	t.Parallel()
	h, calls := acpxStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prompts := []string{"first turn", "second turn", "what was said [history]"}
	for i, p := range prompts {
		id := fmt.Sprintf("acpx-warm-%d", i+1)
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: acpxInput(h, "acpx-warm", p, "codex")})
		require.NoError(t, err)
	}
	providers := map[int32]bool{}
	for i := range prompts {
		id := fmt.Sprintf("acpx-warm-%d", i+1)
		evs := h.watch(ctx, id, 0, nil)
		requireContiguous(t, evs)
		run := h.get(id)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
		require.Positive(t, run.GetProviderProcess().GetPid())
		providers[run.GetProviderProcess().GetPid()] = true
		if i < 2 {
			require.Equal(t, "ECHO: "+prompts[i], run.GetResult().GetFinalMessage())
		}
		// E1: the turn's own ACP usage, and the session's growing total.
		require.Positive(t, run.GetResult().GetUsage().GetInputTokens())
		require.EqualValues(t, 2, run.GetResult().GetUsage().GetCachedInputTokens())
		require.EqualValues(t, 2*(i+1), run.GetResult().GetSessionUsage().GetCachedInputTokens())
	}
	require.Equal(t, "HISTORY: first turn | second turn", h.get("acpx-warm-3").GetResult().GetFinalMessage())
	require.Len(t, providers, 1, "one agent process serves the warm session")
	require.Equal(t, 1, countLines(t, calls, "process-start"))
	require.Equal(t, 1, countLines(t, calls, "session/new"))
	require.Equal(t, 3, countLines(t, calls, "session/prompt"))
	require.Equal(t, 0, countLines(t, calls, "session/load"))
}

// TestR11_Stack_ACPXPiIsRefusedBeforeAnyProcessStarts: SubmitRun refuses
// ACPX pi (E12), and nothing reaches a gateway or a runner.
func TestR11_Stack_ACPXPiIsRefusedBeforeAnyProcessStarts(t *testing.T) {
	t.Parallel()
	h, calls := acpxStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "acpx-pi", Input: acpxInput(h, "acpx-pi", "hello", "pi")})
	require.Error(t, err)
	require.ErrorContains(t, err, "descriptor-confined verified launch")
	require.EqualValues(t, failure.ProviderNotAdmitted, failure.CodeOf(err), "%v", err)
	_, statErr := os.Stat(calls)
	require.True(t, os.IsNotExist(statErr), "no agent process started")
	entries, _ := os.ReadDir(h.st.RunnerStateRoot())
	for _, e := range entries {
		// The gateway's own lock file lives there; a runner has a directory.
		require.False(t, e.IsDir(), "no runner was launched: %s", e.Name())
	}
}

// TestR11_Stack_ACPXAgentGetsOnlyItsOwnCredentialNames (E2): the agent of an
// ACPX codex run receives the configured codex credential, never a Claude
// one configured beside it, nor a host secret; its homes are under the
// scope's acpx/ directory.
func TestR11_Stack_ACPXAgentGetsOnlyItsOwnCredentialNames(t *testing.T) {
	t.Parallel()
	const (
		hostSecret = "acpx-host-secret-must-not-leak"
		codexKey   = "sk-acpx-configured-codex-key"
		claudeKey  = "sk-ant-acpx-wrong-agent"
	)
	envLog := filepath.Join(t.TempDir(), "agent.env")
	h, _ := acpxStack(t, "-env-log", envLog)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := acpxInput(h, "acpx-env", "show me your environment", "codex")
	in.Environment = &prpv1.ProviderEnvironment{Configured: map[string]string{
		"OPENAI_API_KEY": codexKey, "ANTHROPIC_API_KEY": claudeKey, "TETHER_ACPX_SECRET": hostSecret,
	}}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "acpx-env-1", Input: in})
	require.NoError(t, err)
	h.watch(ctx, "acpx-env-1", 0, nil)
	run := h.get("acpx-env-1")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	env := readEnvLog(t, envLog)
	require.Equal(t, codexKey, env["OPENAI_API_KEY"], "the codex agent's own credential reaches it")
	require.NotContains(t, env, "ANTHROPIC_API_KEY", "another agent's credential name never reaches it")
	require.NotContains(t, env, "TETHER_ACPX_SECRET")
	require.True(t, strings.HasSuffix(env["CODEX_HOME"], "/acpx/codex-home"), env["CODEX_HOME"])
	require.True(t, strings.HasSuffix(env["HOME"], "/acpx/home"), env["HOME"])
	require.NotContains(t, env, "CLAUDE_CONFIG_DIR")
	for k, v := range env {
		require.NotContains(t, []string{hostSecret, claudeKey}, v, "%s carries a secret", k)
	}
}
