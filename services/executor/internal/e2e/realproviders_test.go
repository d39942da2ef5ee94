package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// The real providers through the whole stack (make test-providers, opt-in):
// executor → runnergw → runnerd → the pinned real provider, offline against
// the loopback mock model (bin/mock-model). Each step logs a
// "test-providers:" line the script reports.

// Environment of the opt-in suites (scripts/test-providers.sh sets them).
const (
	// envRealOpenCode is the native opencode binary
	// (node_modules/opencode-linux-x64/bin/opencode).
	envRealOpenCode = "TETHER_OPENCODE_BIN"
	// envRealACPModules is the node_modules directory holding the pinned
	// @agentclientprotocol/codex-acp and claude-agent-acp.
	envRealACPModules = "TETHER_ACP_MODULES"
	// envRealCodex is the native codex binary
	// (node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex).
	envRealCodex = "TETHER_CODEX_BIN"
)

// startMockModel runs bin/mock-model (optionally writing an offline codex
// config.toml into codexHome) and returns its base URL ("http://…/v1").
func startMockModel(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "mock-model"), args...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	return strings.TrimSpace(line)
}

// realProvider is one real provider's stack configuration.
type realProvider struct {
	name  string
	gw    []string
	codex []string // the real codex command and its arguments
	input func(h *harness, session, prompt string) *prpv1.ExecutionInput
	// steer: the provider takes a message into its active turn (codex);
	// the others' steering state is unsupported.
	steer bool
	// approvalPrompt makes the model ask to run mockmodel.ShellCommand;
	// askCaller: the request reaches the caller (runtime_request.created,
	// answered with ResolveRuntimeRequest); otherwise the run's permission
	// mode decides it in runnerd (ACP: permission.decided).
	approvalPrompt string
	askCaller      bool
}

func realOpenCode(t *testing.T) realProvider {
	t.Helper()
	bin := os.Getenv(envRealOpenCode)
	if bin == "" {
		t.Skip(envRealOpenCode + " is not set (make test-providers sets it)")
	}
	base := startMockModel(t)
	tmpl := filepath.Join(t.TempDir(), "opencode-template")
	require.NoError(t, os.MkdirAll(tmpl, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(tmpl, "opencode.json"), []byte(`{
  "$schema": "https://opencode.ai/config.json",
  "provider": { "mock": {
    "npm": "@ai-sdk/openai-compatible",
    "name": "Mock (loopback)",
    "options": { "baseURL": "`+base+`", "apiKey": "mock-key" },
    "models": { "mock-model": { "name": "Mock Model", "tool_call": true, "limit": { "context": 100000, "output": 4096 } } } } }
}`), 0o600))
	gw, err := stack.ProviderGatewayArgs("opencode", bin)
	require.NoError(t, err)
	return realProvider{name: "opencode", gw: append(gw, "-opencode-home-template", tmpl),
		approvalPrompt: "[shell] make the directory", askCaller: true,
		input: func(h *harness, session, prompt string) *prpv1.ExecutionInput {
			in := h.submitInput(session, prompt)
			in.Provider = &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"}
			// The checkpoint of a suspension records the driver kind; the
			// verifier refuses one that does not drive the provider.
			in.Session.DriverKind = provenv.DriverOpenCodeServer
			return in
		}}
}

func realCodex(t *testing.T) realProvider {
	t.Helper()
	bin := os.Getenv(envRealCodex)
	if bin == "" {
		t.Skip(envRealCodex + " is not set (make test-providers sets it)")
	}
	tmpl := filepath.Join(t.TempDir(), "codex-template")
	// A [slow] reply lasts 12 s: the steer lands in it however loaded the
	// machine (a 3 s reply could end before it).
	startMockModel(t, "-codex-home", tmpl, "-codex-env-key", "OPENAI_API_KEY", "-slow-delay", "1s")
	// The template's config.toml asks approval on request: [escalate]
	// (sandbox_permissions require_escalated) asks the caller.
	return realProvider{name: "codex", gw: []string{"-codex-home-template", tmpl}, codex: []string{bin, "app-server"},
		steer: true, approvalPrompt: "[escalate] make the directory", askCaller: true,
		input: func(h *harness, session, prompt string) *prpv1.ExecutionInput {
			in := h.submitInput(session, prompt)
			in.Provider = &prpv1.Provider{Kind: "codex", Model: "mock-model"}
			in.Environment = &prpv1.ProviderEnvironment{Configured: map[string]string{"OPENAI_API_KEY": "mock-key"}}
			return in
		}}
}

// realACP is the ACP agent agent (codex | claude) of the pinned package
// under TETHER_ACP_MODULES, run by node, on the mock model: codex-acp with
// the offline config.toml (the profile's home template), claude-agent-acp
// on the mock Messages API through its configured environment.
func realACP(t *testing.T, agent string) realProvider {
	t.Helper()
	modules := os.Getenv(envRealACPModules)
	if modules == "" {
		t.Skip(envRealACPModules + " is not set (make test-providers sets it)")
	}
	node, err := exec.LookPath("node")
	require.NoError(t, err)
	pkg, profile := "codex-acp", "acpx-codex"
	if agent == "claude" {
		pkg, profile = "claude-agent-acp", "acpx-claude"
	}
	script := filepath.Join(modules, "@agentclientprotocol", pkg, "dist", "index.js")
	tmpl := filepath.Join(t.TempDir(), profile+"-template")
	var base string
	if agent == "codex" {
		base = startMockModel(t, "-codex-home", tmpl, "-codex-env-key", "OPENAI_API_KEY")
	} else {
		require.NoError(t, os.MkdirAll(tmpl, 0o700))
		base = startMockModel(t)
	}
	gw, err := stack.ProviderGatewayArgs(profile, node, script)
	require.NoError(t, err)
	sum, err := providerlaunch.FileSHA256(script)
	require.NoError(t, err)
	gw = append(gw, "-"+profile+"-sha256", script+"="+sum, "-"+profile+"-home-template", tmpl)
	env := map[string]string{"OPENAI_API_KEY": "mock-key"}
	if agent == "claude" {
		env = map[string]string{"ANTHROPIC_API_KEY": "mock-key", "ANTHROPIC_BASE_URL": strings.TrimSuffix(base, "/v1")}
	}
	approval := "[shell] make the directory"
	if agent == "codex" {
		approval = "[escalate] make the directory" // codex-acp asks only outside its sandbox
	}
	return realProvider{name: profile, gw: gw, approvalPrompt: approval,
		input: func(h *harness, session, prompt string) *prpv1.ExecutionInput {
			in := h.submitInput(session, prompt)
			in.Provider = &prpv1.Provider{Kind: provenv.KindACPX, Agent: agent, PermissionMode: "approve-all"}
			in.Session.DriverKind = provenv.DriverACPXRuntime
			in.Environment = &prpv1.ProviderEnvironment{Configured: env}
			return in
		}}
}

// realStack is a stack for rp whose executor retries a lost attempt soon.
func realStack(t *testing.T, rp realProvider) *harness {
	t.Helper()
	opts := stack.Options{GatewayArgs: rp.gw, ExecutorArgs: []string{"-retry-delay", "200ms"}}
	if len(rp.codex) > 0 {
		opts.CodexCommand, opts.CodexArgs = rp.codex[0], rp.codex[1:]
	}
	return newHarness(t, opts)
}

// realRun submits prompt on session and returns the run's events once it
// ended.
func (h *harness) realRun(ctx context.Context, rp realProvider, runID, session, prompt string, during func()) ([]*executorv1.WatchRunResponse, *executorv1.Run) {
	h.t.Helper()
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: rp.input(h, session, prompt)})
	require.NoError(h.t, err)
	if during != nil {
		h.waitForDelta(ctx, h.client, runID)
		during()
	}
	evs := h.watch(ctx, runID, 0, nil)
	requireContiguous(h.t, evs)
	return evs, h.waitTerminal(ctx, runID)
}

// killProvider SIGKILLs the run's provider process (its process group
// when it leads one) and waits until it is gone.
func killProvider(t *testing.T, h *harness, runID string) {
	t.Helper()
	pid := int(h.get(runID).GetProviderProcess().GetPid())
	require.Positive(t, pid, "the run reports its provider process")
	if err := syscall.Kill(-pid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	}
	require.Eventually(t, func() bool { return !procid.Exists(pid) }, 30*time.Second, 10*time.Millisecond)
}

// requireOneLostTurn checks the run lost one turn: turn.lost may be
// announced again for it (runnerd re-announces the loss when a controller
// resends the turn's turn.start, under load), never for another turn.
func requireOneLostTurn(t *testing.T, evs []*executorv1.WatchRunResponse) {
	t.Helper()
	lost := eventsOf(evs, "turn.lost")
	require.NotEmpty(t, lost)
	for _, l := range lost {
		require.Equal(t, lost[0]["providerTurnId"], l["providerTurnId"], "one turn was lost")
	}
}

func requireSucceeded(t *testing.T, run *executorv1.Run, what string) {
	t.Helper()
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%s: %v", what, run.GetFailure())
}

// TestR7_OpenCodeRealServerKilledMidTurnIsRestartedAndTheRunSucceedsThroughTheStack:
// the real OpenCode server SIGKILLed mid-stream under a run of the whole
// stack is restarted by runnerd, the session resumed and the cut-off turn
// reconciled lost; the executor's next attempt runs it to success.
func TestR7_OpenCodeRealServerKilledMidTurnIsRestartedAndTheRunSucceedsThroughTheStack(t *testing.T) {
	rp := realOpenCode(t)
	h := realStack(t, rp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, first := h.realRun(ctx, rp, "oc-real-r7-1", "oc-real-r7", "remember alpha", nil)
	requireSucceeded(t, first, "first turn")
	const prompt = "[slow] a story cut off by a kill"
	evs, run := h.realRun(ctx, rp, "oc-real-r7-2", "oc-real-r7", prompt, func() { killProvider(t, h, "oc-real-r7-2") })
	requireSucceeded(t, run, "the killed turn's run")
	require.EqualValues(t, 2, run.GetAttempt(), "retried at the next attempt")
	require.Equal(t, "ECHO: "+prompt, run.GetResult().GetFinalMessage())
	requireOneLostTurn(t, evs)
	require.Empty(t, eventsOf(evs, "turn.failed"))
	require.Len(t, eventsOf(evs, "run.terminal"), 1)
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	t.Logf("test-providers: opencode stack: killed mid-turn, run succeeded at attempt %d; audit clean", run.GetAttempt())
}

// TestR10_Stack_RealProviderScenarios runs each real provider's scenarios
// through the whole stack: three warm turns on one provider process with
// the history resent; a steer into the active turn (codex; the others'
// steering state is unsupported); a command approval (asked of the caller
// and accepted: codex, OpenCode; decided by the permission mode: the ACP
// agents); a cancel (partial output) and the next turn; a kill -9 mid-turn
// (retried at the next attempt, no turn.failed, one run.terminal) and one
// between turns; a suspension (CloseSession with a verified checkpoint),
// the scope's local state lost, and a restore that continues the same
// provider thread; the session's usage total growing by each run's usage
// across the kills and the restore; a clean audit.
func TestR10_Stack_RealProviderScenarios(t *testing.T) {
	for _, name := range []string{"opencode", "codex", "acpx-codex", "acpx-claude"} {
		t.Run(name, func(t *testing.T) {
			var rp realProvider
			switch name {
			case "opencode":
				rp = realOpenCode(t)
			case "codex":
				rp = realCodex(t)
			case "acpx-codex":
				rp = realACP(t, "codex")
			case "acpx-claude":
				rp = realACP(t, "claude")
			}
			realScenarios(t, rp)
		})
	}
}

func realScenarios(t *testing.T, rp realProvider) {
	h := realStack(t, rp)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	step := func(format string, args ...any) {
		t.Logf("test-providers: %s stack: "+format, append([]any{rp.name}, args...)...)
	}
	session := rp.name + "-real"
	var total *executorv1.Usage
	usage := func(run *executorv1.Run) {
		t.Helper()
		u, st := run.GetResult().GetUsage(), run.GetResult().GetSessionUsage()
		require.NotNil(t, st, "%s reports the session total", run.GetRunId())
		if total != nil {
			require.GreaterOrEqual(t, st.GetInputTokens(), total.GetInputTokens()+u.GetInputTokens(),
				"%s: the session total grows by the run's usage (before %v, run %v, after %v)", run.GetRunId(), total, u, st)
			require.GreaterOrEqual(t, st.GetOutputTokens(), total.GetOutputTokens()+u.GetOutputTokens())
		}
		total = st
	}
	n := 0
	runOne := func(prompt string, during func(runID string)) ([]*executorv1.WatchRunResponse, *executorv1.Run) {
		t.Helper()
		n++
		runID := session + "-" + string(rune('a'+n-1))
		var d func()
		if during != nil {
			d = func() { during(runID) }
		}
		return h.realRun(ctx, rp, runID, session, prompt, d)
	}

	pids := map[int32]bool{}
	for _, p := range []string{"remember alpha", "remember beta"} {
		_, run := runOne(p, nil)
		requireSucceeded(t, run, p)
		require.Equal(t, "ECHO: "+p, run.GetResult().GetFinalMessage())
		require.Positive(t, run.GetResult().GetUsage().GetOutputTokens())
		usage(run)
		pids[run.GetProviderProcess().GetPid()] = true
	}
	_, run := runOne("[history] what was said?", nil)
	requireSucceeded(t, run, "history")
	require.Equal(t, "HISTORY: remember alpha | remember beta", run.GetResult().GetFinalMessage(), "the provider resent its history")
	usage(run)
	pids[run.GetProviderProcess().GetPid()] = true
	require.Len(t, pids, 1, "one provider process serves the warm turns")
	step("3 warm turns on one provider process, history resent")

	if rp.steer {
		var turnID string
		_, run := runOne("[slow] tell me slowly", func(runID string) {
			resp, err := h.client.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: runID, Message: "steer: also mention bananas", CorrelationId: "test-providers"})
			require.NoError(t, err)
			turnID = resp.GetTurnId()
		})
		requireSucceeded(t, run, "steered")
		require.Equal(t, turnID, run.GetResult().GetProviderTurnId(), "the active turn was steered")
		require.Contains(t, run.GetResult().GetFinalMessage(), "bananas", "the turn answered the steering message")
		usage(run)
		step("steer into the active turn: %q", run.GetResult().GetFinalMessage())
	}

	// A command approval: asked of the caller and accepted with
	// ResolveRuntimeRequest, or decided by the run's permission mode in
	// runnerd (ACP approve-all: permission.decided); the command runs.
	n++
	approveID := session + "-" + string(rune('a'+n-1))
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: approveID, Input: rp.input(h, session, rp.approvalPrompt)})
	require.NoError(t, err)
	decision := ""
	if rp.askCaller {
		created := h.awaitRuntimeRequest(ctx, approveID)
		require.Equal(t, "command_approval", created["kind"])
		accept, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
		_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: approveID,
			RequestId: created["requestId"].(string), TurnId: created["turnId"].(string), Resolution: accept})
		require.NoError(t, err)
		decision = "asked of the caller, accepted"
	}
	evs := h.watch(ctx, approveID, 0, nil)
	requireContiguous(t, evs)
	run = h.waitTerminal(ctx, approveID)
	requireSucceeded(t, run, "approval")
	if rp.askCaller {
		require.Len(t, eventsOf(evs, "runtime_request.resolved"), 1, "answered once")
	} else {
		decided := eventsOf(evs, "permission.decided")
		require.NotEmpty(t, decided, "the permission mode decided the request")
		require.Equal(t, "allow", decided[0]["decision"])
		decision = fmt.Sprintf("decided by the permission mode (%v)", decided[0]["optionId"])
	}
	require.Contains(t, run.GetResult().GetFinalMessage(), "hello-from-mock-shell", "the approved command ran")
	usage(run)
	step("command approval %s; the command ran: %q", decision, run.GetResult().GetFinalMessage())

	evs, run = runOne("[slow] a long answer to cancel", func(runID string) {
		if !rp.steer {
			st, err := h.client.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: runID})
			require.NoError(t, err)
			require.Equal(t, "unsupported", st.GetDisposition(), "steering is not offered")
		}
		_, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: runID, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "test-providers"})
		require.NoError(t, err)
	})
	require.Equal(t, executorv1.RunState_RUN_STATE_CANCELLED, run.GetState())
	terms := eventsOf(evs, "run.terminal")
	require.Len(t, terms, 1)
	require.Equal(t, true, terms[0]["partial"])
	_, run = runOne("after the cancel", nil)
	requireSucceeded(t, run, "after the cancel")
	require.Equal(t, "ECHO: after the cancel", run.GetResult().GetFinalMessage())
	usage(run)
	step("cancel (partial output %q), then the next turn", terms[0]["finalMessage"])

	const cut = "[slow] a story cut off by a kill"
	evs, run = runOne(cut, func(runID string) { killProvider(t, h, runID) })
	requireSucceeded(t, run, "killed mid-turn")
	require.EqualValues(t, 2, run.GetAttempt())
	require.Equal(t, "ECHO: "+cut, run.GetResult().GetFinalMessage())
	requireOneLostTurn(t, evs)
	require.Empty(t, eventsOf(evs, "turn.failed"), "the turn was not failed with the provider")
	require.Len(t, eventsOf(evs, "run.terminal"), 1)
	usage(run)
	lost := eventsOf(evs, "turn.lost")[0]
	step("kill -9 mid-turn: succeeded at attempt 2 (provider history: %v)", lost["providerHistory"])

	before := run.GetProviderProcess().GetPid()
	killProvider(t, h, run.GetRunId())
	_, run = runOne("[history] after the kills", nil)
	requireSucceeded(t, run, "after a kill between turns")
	require.NotEqual(t, before, run.GetProviderProcess().GetPid(), "a replacement provider")
	final := run.GetResult().GetFinalMessage()
	require.Contains(t, final, "remember alpha", "the replacement provider resumed the history")
	usage(run)
	step("kill -9 between turns: the next turn resumed the history; the cut-off prompt is in it %d time(s): %q", strings.Count(final, cut), final)
	if lost["providerHistory"] == "dropped" {
		require.Equal(t, 1, strings.Count(final, cut), "the retried prompt is in the provider's history once (SPEC R12)")
	}

	// Suspension and restore: the session is closed with a verified
	// checkpoint (its runner and provider stop), the scope's local state
	// is lost, and the next run restores the backup into a new runner and
	// provider that continue the same provider thread with its history.
	closed, err := h.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: session, Suspend: true, Reason: "test-providers"})
	require.NoError(t, err)
	require.Len(t, closed.GetCheckpoints(), 1, "one verified checkpoint")
	cp := closed.GetCheckpoints()[0]
	require.Eventually(t, func() bool {
		r, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: session})
		return err == nil && !r.GetSessions()[0].GetRunnerConnected()
	}, time.Minute, 50*time.Millisecond, "the runner went away")
	require.NoError(t, os.RemoveAll(filepath.Join(h.st.RunnerStateRoot(), cp.GetStamp().GetSessionScope())))
	thread := run.GetResult().GetProviderThreadId()
	_, restored := runOne("[history] after the restore", nil)
	requireSucceeded(t, restored, "after the restore")
	require.Contains(t, restored.GetResult().GetFinalMessage(), "remember alpha", "the restored provider resumed the history")
	require.Contains(t, restored.GetResult().GetFinalMessage(), "[history] after the kills")
	if thread != "" {
		require.Equal(t, thread, restored.GetResult().GetProviderThreadId(), "the same provider thread")
	}
	require.NotEqual(t, run.GetRunnerProcess().GetPid(), restored.GetRunnerProcess().GetPid(), "a new runner process")
	usage(restored)
	step("suspended (checkpoint %s), local state removed, restored: the next turn continued thread %s with its history",
		cp.GetCheckpointId(), restored.GetResult().GetProviderThreadId())

	step("session usage total %v, monotonic across the kills and the restore", total)

	// SPEC P6: with the verifier on and -checkpoint-after, a turn after
	// an idle period of twice it (checkpointed online meanwhile) costs
	// what a warm turn costs: the same runner and provider serve it.
	const checkpointAfter = time.Second
	h.st.Proc("executor").Stop(10 * time.Second)
	h.st.SetExtraArgs("executor", "-checkpoint-after", checkpointAfter.String(), "-idle-sweep-interval", "100ms")
	_, err = h.st.Start(ctx, "executor")
	require.NoError(t, err)
	timed := func(prompt string) (time.Duration, *executorv1.Run) {
		t.Helper()
		t0 := time.Now()
		_, run := runOne(prompt, nil)
		took := time.Since(t0)
		requireSucceeded(t, run, prompt)
		require.Equal(t, "ECHO: "+prompt, run.GetResult().GetFinalMessage())
		usage(run)
		return took, run
	}
	var warmTook, idleTook []time.Duration
	var warmRun *executorv1.Run
	for _, p := range []string{"warm one", "warm two", "warm three", "warm four", "warm five"} {
		d, r := timed(p)
		warmTook, warmRun = append(warmTook, d), r
	}
	warmTook = warmTook[1:] // the first follows the executor's restart
	lastCP := cp.GetCheckpointId()
	for _, p := range []string{"after idle one", "after idle two", "after idle three", "after idle four"} {
		idleSince := time.Now()
		require.Eventually(t, func() bool {
			r, err := h.client.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: session})
			if err != nil || r.GetSessions()[0].GetCheckpoint().GetCheckpointId() == lastCP {
				return false
			}
			lastCP = r.GetSessions()[0].GetCheckpoint().GetCheckpointId()
			return true
		}, time.Minute, 20*time.Millisecond, "the idle period was checkpointed")
		time.Sleep(time.Until(idleSince.Add(2 * checkpointAfter)))
		d, r := timed(p)
		idleTook = append(idleTook, d)
		require.Equal(t, warmRun.GetRunnerProcess().GetPid(), r.GetRunnerProcess().GetPid(), "the same runner after idle")
		require.Equal(t, warmRun.GetProviderProcess().GetPid(), r.GetProviderProcess().GetPid(), "the same provider after idle")
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
	}
	warmMean, idleMean := median(warmTook), median(idleTook)
	ratio := float64(idleMean) / float64(warmMean)
	step("warm_turn_after_idle_with_backups: a turn after %s idle (checkpointed online, backups on) took %s (median; %v), a warm turn %s (%v): %.2fx (target ≤ 1.2x), same runner and provider",
		2*checkpointAfter, idleMean.Round(time.Millisecond), idleTook, warmMean.Round(time.Millisecond), warmTook, ratio)
	t.Logf("test-providers: BENCH %s warm_turn_after_idle_with_backups after_idle_ms=%.1f warm_ms=%.1f ratio=%.3f idle_ms=%d target=1.20 met=%t",
		rp.name, float64(idleMean)/float64(time.Millisecond), float64(warmMean)/float64(time.Millisecond), ratio, (2 * checkpointAfter).Milliseconds(), ratio <= 1.2)

	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	step("tetherctl audit clean")
}
