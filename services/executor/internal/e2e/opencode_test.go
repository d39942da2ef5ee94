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
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
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

// TestR7_OpenCodeKilledMidTurnIsRestartedReconciledAndTheRunSucceedsAtTheNextAttempt:
// the OpenCode server SIGKILLed mid-stream (fake-opencode "[die:mid-stream]")
// does not fail the run: runnerd restarts the server, resumes the session,
// reconciles the cut-off turn from its history (lost), and the executor's
// next attempt runs the turn to success (SPEC R7). The lost attempt's
// deltas are not repeated under the successful turn and the audit is clean.
func TestR7_OpenCodeKilledMidTurnIsRestartedReconciledAndTheRunSucceedsAtTheNextAttempt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	callLog := filepath.Join(dir, "opencode-calls.log")
	gw, err := stack.ProviderGatewayArgs("opencode", filepath.Join(binDir, "fake-opencode"), "--call-log", callLog,
		"--die-once-dir", t.TempDir(), "--delta-delay-ms", "5")
	require.NoError(t, err)
	h := newHarness(t, stack.Options{GatewayArgs: gw, ExecutorArgs: []string{"-retry-delay", "200ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const prompt = "[die:mid-stream] tell a long story about the sea"
	in := h.submitInput("opencode-r7", prompt)
	in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "oc-r7", Input: in})
	require.NoError(t, err)
	evs := h.watch(ctx, "oc-r7", 0, nil)
	requireContiguous(t, evs)
	final := requireOneSucceededTerminal(t, h, "oc-r7", evs)
	require.Equal(t, "ECHO: "+prompt, final)
	require.EqualValues(t, 2, h.get("oc-r7").GetAttempt(), "the cut-off turn ran again at the next attempt")
	requireKilledBySIGKILL(t, evs)
	require.Empty(t, eventsOf(evs, "turn.failed"), "the driver did not fail the turn with the server")
	lost := eventsOf(evs, "turn.lost")
	require.Len(t, lost, 1, "the cut-off turn was reconciled lost")
	require.Equal(t, "interrupted", lost[0]["reconciliation"])
	retries := eventsOf(evs, "run.retry_scheduled")
	require.Len(t, retries, 1)
	require.Equal(t, "native_session_interrupted", retries[0]["code"])
	require.Contains(t, retries[0]["message"], "killed by signal SIGKILL", "the retry names the server's signal")

	// The successful turn's deltas are its reply, once.
	terms := eventsOf(evs, "run.terminal")
	turnID, _ := terms[0]["providerTurnId"].(string)
	var text strings.Builder
	for _, m := range evs {
		if e := m.GetEvent(); e.GetEventType() == "item.delta" && e.GetTurnId() == turnID {
			d, _ := e.GetPayload().AsMap()["delta"].(string)
			text.WriteString(d)
		}
	}
	require.Equal(t, final, text.String(), "the successful turn's deltas, each once")
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(string(calls), "process-start"), "one replacement server")
	require.Equal(t, 1, strings.Count(string(calls), "session.create"), "the session was resumed, not replaced")
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}

// TestR7_OpenCodeServerLostDuringPromptAsyncIsReconciledByItsMessageIDAndTheRunSucceedsOnce:
// the OpenCode server SIGKILLed during the prompt call of a warm session
// (fake-opencode "[die:prompt]": before it records the prompt;
// "[die:prompt-recorded]": after) does not fail the run with
// provider_turn_start_failed: runnerd records the turn under the message
// id it chose, restarts the server, looks the id up in the resumed
// session's history (absent: lost; present with no answer: cut off,
// dropped, lost), and the executor's next attempt runs the turn to success,
// once: the session's history holds the prompt once and the audit is
// clean (SPEC R7, R12).
func TestR7_OpenCodeServerLostDuringPromptAsyncIsReconciledByItsMessageIDAndTheRunSucceedsOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	callLog := filepath.Join(dir, "opencode-calls.log")
	gw, err := stack.ProviderGatewayArgs("opencode", filepath.Join(binDir, "fake-opencode"), "--call-log", callLog,
		"--die-once-dir", t.TempDir(), "--delta-delay-ms", "5")
	require.NoError(t, err)
	h := newHarness(t, stack.Options{GatewayArgs: gw, ExecutorArgs: []string{"-retry-delay", "200ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(runID, prompt string) []*executorv1.WatchRunResponse {
		t.Helper()
		in := h.submitInput("opencode-r7-prompt", prompt)
		in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
		require.NoError(t, err)
		evs := h.watch(ctx, runID, 0, nil)
		requireContiguous(t, evs)
		return evs
	}
	evs := run("oc-r7p-warm", "remember alpha")
	require.Equal(t, "ECHO: remember alpha", requireOneSucceededTerminal(t, h, "oc-r7p-warm", evs))

	for i, c := range []struct{ marker, reconciliation, history string }{
		{"[die:prompt]", "missing", "absent"},
		{"[die:prompt-recorded]", "interrupted", "dropped"},
	} {
		runID := fmt.Sprintf("oc-r7p-%d", i+1)
		prompt := c.marker + " a prompt the server may not have taken"
		evs := run(runID, prompt)
		require.Empty(t, eventsOf(evs, "turn.failed"), "%s: the turn was not failed with the server", c.marker)
		require.Equal(t, "ECHO: "+prompt, requireOneSucceededTerminal(t, h, runID, evs), c.marker)
		require.EqualValues(t, 2, h.get(runID).GetAttempt(), "%s: the lost turn ran again at the next attempt", c.marker)
		requireKilledBySIGKILL(t, evs)
		lost := eventsOf(evs, "turn.lost")
		require.Len(t, lost, 1, "%s: the turn started during the loss was reconciled lost", c.marker)
		require.Equal(t, c.reconciliation, lost[0]["reconciliation"], c.marker)
		require.Equal(t, c.history, lost[0]["providerHistory"], c.marker)
		retries := eventsOf(evs, "run.retry_scheduled")
		require.Len(t, retries, 1, c.marker)
		require.Equal(t, "native_session_interrupted", retries[0]["code"], c.marker)
	}

	// The session's history holds each prompt once.
	evs = run("oc-r7p-history", "[history] what was said?")
	require.Equal(t, "HISTORY: remember alpha | [die:prompt] a prompt the server may not have taken | "+
		"[die:prompt-recorded] a prompt the server may not have taken",
		requireOneSucceededTerminal(t, h, "oc-r7p-history", evs))
	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(string(calls), "process-start"), "one replacement server per loss")
	require.Equal(t, 1, strings.Count(string(calls), "session.create"), "the session was resumed, not replaced")
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}
