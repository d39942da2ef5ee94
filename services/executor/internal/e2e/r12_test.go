package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// allProvidersStack is one stack whose gateway launches the fake of every
// driver: fake codex (the default profile), fake-opencode (opencode) and
// the fake ACP agent (acpx-codex).
func allProvidersStack(t *testing.T, fakeArgs []string, opencodeArgs ...string) *harness {
	t.Helper()
	gw, err := stack.ProviderGatewayArgs("opencode", filepath.Join(binDir, "fake-opencode"), opencodeArgs...)
	require.NoError(t, err)
	acp := filepath.Join(binDir, "fake-acp-agent")
	sum, err := providerlaunch.FileSHA256(acp)
	require.NoError(t, err)
	gw = append(gw, "-acpx-codex-command", acp, "-acpx-codex-arg", "-flavor", "-acpx-codex-arg", "codex",
		"-acpx-codex-version", providerlaunch.Versions[providerlaunch.ACPXCodex], "-acpx-codex-sha256", sum)
	return newHarness(t, stack.Options{GatewayArgs: gw, FakeArgs: fakeArgs, ExecutorArgs: []string{"-retry-delay", "200ms"}})
}

// providerInput is a run of session for the named driver: codex, opencode
// or acpx (the codex agent).
func (h *harness) providerInput(kind, session, prompt string) *prpv1.ExecutionInput {
	in := h.submitInput(session, prompt)
	switch kind {
	case "opencode":
		in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
	case "acpx":
		in.Provider = &prpv1.Provider{Kind: provenv.KindACPX, Agent: "codex", PermissionMode: "approve-all"}
		in.Session.DriverKind = provenv.DriverACPXRuntime
	}
	return in
}

// TestR12_ACancelledTurnReportsItsStreamedPartialOutputTheSameWayForEveryProvider:
// a run cancelled mid-stream ends cancelled with, as its final message,
// exactly the agent text its turn streamed (the deltas the caller saw) and
// partial: true on its run.terminal — for codex (whose interrupted turn
// carries no message), OpenCode and an ACP agent alike.
func TestR12_ACancelledTurnReportsItsStreamedPartialOutputTheSameWayForEveryProvider(t *testing.T) {
	t.Parallel()
	// Each turn holds after its first delta until it is cancelled (fake
	// codex "[stall:mid-stream]", the others "[hold]").
	h := allProvidersStack(t, []string{"--die-once-dir", t.TempDir()})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for kind, prompt := range map[string]string{"codex": "[stall:mid-stream] " + slowTurn, "opencode": "[hold] " + slowTurn, "acpx": "[hold] " + slowTurn} {
		runID := "r12-cancel-" + kind
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: h.providerInput(kind, runID, prompt)})
		require.NoError(t, err)
		h.waitForDelta(ctx, h.client, runID)
		_, err = h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: runID, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "R12"})
		require.NoError(t, err)
		run := h.waitState(ctx, h.client, runID, executorv1.RunState_RUN_STATE_CANCELLED)
		evs := h.watch(ctx, runID, 0, nil)
		terms := eventsOf(evs, "run.terminal")
		require.Len(t, terms, 1, kind)
		turnID, _ := terms[0]["providerTurnId"].(string)
		var streamed strings.Builder
		for _, m := range evs {
			if e := m.GetEvent(); e.GetEventType() == "item.delta" && e.GetTurnId() == turnID && e.GetPayload().AsMap()["kind"] == "agentMessage" {
				d, _ := e.GetPayload().AsMap()["delta"].(string)
				streamed.WriteString(d)
			}
		}
		require.NotEmpty(t, streamed.String(), "%s streamed before the cancel", kind)
		require.Equal(t, streamed.String(), terms[0]["finalMessage"], "%s: the partial output is what was streamed", kind)
		require.Equal(t, true, terms[0]["partial"], kind)
		require.Equal(t, streamed.String(), run.GetResult().GetFinalMessage(), "%s: GetRun reports it", kind)
	}
}

// TestR12_ARetriedTurnLeavesTheUserMessageOnceInTheProviderHistory: a turn
// cut off by a provider kill and retried at the next attempt is in the
// provider's history once: runnerd drops the cut-off turn before the retry
// (codex thread/revert, OpenCode's message delete) and records it on the
// run (turn.lost providerHistory: dropped). The next turn's model request
// carries the prompt once (the fakes answer [history] with the earlier user
// texts the provider sent).
func TestR12_ARetriedTurnLeavesTheUserMessageOnceInTheProviderHistory(t *testing.T) {
	t.Parallel()
	h := allProvidersStack(t, []string{"--die-once-dir", t.TempDir(), "--delta-delay-ms", "20"}, "--die-once-dir", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// codex: the fake's durable thread holds the prompt in one turn.
	prompt := "[die:mid-stream] " + slowTurn
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r12-codex", Input: h.providerInput("codex", "r12-codex", prompt)})
	require.NoError(t, err)
	evs := h.watch(ctx, "r12-codex", 0, nil)
	requireOneSucceededTerminal(t, h, "r12-codex", evs)
	require.EqualValues(t, 2, h.get("r12-codex").GetAttempt())
	lost := eventsOf(evs, "turn.lost")
	require.Len(t, lost, 1)
	require.Equal(t, "dropped", lost[0]["providerHistory"], "codex: recorded on the run")
	require.Len(t, providerTurnsWith(t, h, prompt), 1, "codex: the prompt is in the thread once")

	// OpenCode: the next turn's history names the prompt once.
	prompt = "[die:mid-stream] a story cut off by a kill"
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r12-oc-1", Input: h.providerInput("opencode", "r12-oc", prompt)})
	require.NoError(t, err)
	evs = h.watch(ctx, "r12-oc-1", 0, nil)
	requireOneSucceededTerminal(t, h, "r12-oc-1", evs)
	require.EqualValues(t, 2, h.get("r12-oc-1").GetAttempt())
	lost = eventsOf(evs, "turn.lost")
	require.Len(t, lost, 1)
	require.Equal(t, "dropped", lost[0]["providerHistory"], "opencode: recorded on the run")
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r12-oc-2", Input: h.providerInput("opencode", "r12-oc", "[history] what was asked?")})
	require.NoError(t, err)
	run := h.waitState(ctx, h.client, "r12-oc-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Equal(t, "HISTORY: "+prompt, run.GetResult().GetFinalMessage(), "opencode: the retried prompt is in the history once")
}
