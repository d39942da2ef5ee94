package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestE2_Stack_ProviderEnvironmentComesFromTheRunsPolicy: the fake codex,
// started by runnerd for a run through executor and runnergw, records the
// environment it received. Host secrets of every service (a TETHER_* one
// and PAPERCLIP_INTERNAL_SECRET) never reach it; the configured codex
// credential does and another provider's credential name does not; the
// workspace variables are the assigned workspace whatever the
// configuration says; and the configured credential is written nowhere in
// the runner's durable state (what a suspension archives).
func TestE2_Stack_ProviderEnvironmentComesFromTheRunsPolicy(t *testing.T) {
	t.Parallel()
	const (
		hostSecret      = "host-secret-must-not-leak"
		paperclipSecret = "paperclip-secret-must-not-leak"
		codexKey        = "sk-e2-configured-codex-key"
		claudeKey       = "sk-ant-e2-wrong-provider"
	)
	envLog := filepath.Join(t.TempDir(), "provider.env")
	h := newHarness(t, stack.Options{
		Env:      []string{"TETHER_E2_HOST_SECRET=" + hostSecret, "PAPERCLIP_INTERNAL_SECRET=" + paperclipSecret},
		FakeArgs: []string{"--env-log", envLog},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ws := filepath.Join(h.st.WorkspaceRoot(), "acme", t.Name())
	in := h.submitInput("provenv", "show me your environment")
	in.Workspace = &prpv1.Workspace{Cwd: ws}
	in.Environment = &prpv1.ProviderEnvironment{
		Configured: map[string]string{
			"OPENAI_API_KEY":          codexKey,
			"ANTHROPIC_AUTH_TOKEN":    claudeKey,
			"GIT_AUTHOR_NAME":         "Agent E2",
			"TETHER_WORKSPACE_CWD":    "/untrusted/configured",
			"PAPERCLIP_WORKSPACE_CWD": "/untrusted/configured",
		},
		Inherit: []string{"TETHER_E2_HOST_SECRET", "PAPERCLIP_INTERNAL_SECRET"}, // a caller's list is replaced
	}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "provenv-1", Input: in})
	require.NoError(t, err)
	h.watch(ctx, "provenv-1", 0, nil)
	run := h.get("provenv-1")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())

	env := readEnvLog(t, envLog)
	require.Equal(t, codexKey, env["OPENAI_API_KEY"], "the configured codex credential reaches codex")
	require.Equal(t, "Agent E2", env["GIT_AUTHOR_NAME"])
	require.NotContains(t, env, "ANTHROPIC_AUTH_TOKEN", "another provider's credential name never reaches codex")
	require.Equal(t, ws, env["TETHER_WORKSPACE_CWD"], "the assigned workspace is pinned")
	require.Equal(t, ws, env["PAPERCLIP_WORKSPACE_CWD"], "the assigned workspace is pinned")
	require.NotEmpty(t, env["PATH"])
	require.NotEmpty(t, env["HOME"])
	require.NotEmpty(t, env["CODEX_HOME"])
	for k, v := range env {
		require.NotContains(t, []string{hostSecret, paperclipSecret, claudeKey}, v, "%s carries a secret", k)
		if strings.HasPrefix(k, "TETHER_") || strings.HasPrefix(k, "PAPERCLIP_") {
			require.Contains(t, []string{"TETHER_WORKSPACE_CWD", "PAPERCLIP_WORKSPACE_CWD"}, k, "no tether internal reaches the provider")
		}
	}

	// The credential lives in runnerd's memory only: nothing under the
	// runner state root (state document, journal, codex home) holds it.
	err = filepath.Walk(h.st.RunnerStateRoot(), func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		require.NotContains(t, string(b), codexKey, "%s holds the configured credential", p)
		return nil
	})
	require.NoError(t, err)
}

// readEnvLog reads the environment a fake provider recorded (-env-log:
// sorted KEY=VALUE lines).
func readEnvLog(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err, "the fake recorded its environment")
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}
