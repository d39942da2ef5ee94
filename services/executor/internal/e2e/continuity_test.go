package e2e

// SPEC C — the remote continuity regression (`make test-continuity`, opt-in
// with TETHER_CONTINUITY=1). Every case runs a disposable process tree: a
// private PostgreSQL cluster, the backup verifier, the runner gateway with
// TLS ingress to its runners (listen_ws behind TLS, a test CA), the
// executor, runnerd and the fake codex app-server; no credentials. KEEP=1
// leaves a failed case's processes and files for inspection.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/testing/prptest"
	"github.com/tether-run/tether/pkg/testing/runnerstatetest"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// credentialCanary is put in the environment of every process of the tree;
// it must reach no provider, event, log file, runner state or backup.
const credentialCanary = "sk-continuity-canary-7f3a"

type continuity struct {
	*harness
	gw gatewayv1.RunnerGatewayClient
}

func newContinuity(t *testing.T, opts stack.Options) *continuity {
	t.Helper()
	if os.Getenv("TETHER_CONTINUITY") == "" {
		t.Skip("opt-in: make test-continuity (TETHER_CONTINUITY=1)")
	}
	t.Setenv("OPENAI_API_KEY", credentialCanary)
	ca := prptest.NewCA(t)
	leaf := ca.Issue(t, "runner")
	opts.GatewayArgs = append(opts.GatewayArgs, "-runner-ingress-companies", "acme",
		"-runner-ingress-tls-cert", leaf.CertFile, "-runner-ingress-tls-key", leaf.KeyFile, "-runner-ingress-ca", ca.CAFile(t))
	h := newHarnessKeeping(t, opts, os.Getenv("KEEP") == "1", "backup-verifier", "runnergw", "executor")
	c := &continuity{harness: h, gw: h.gatewayClient()}
	// The test's store is opened (its close registered) before the leak
	// check: cleanups run last-registered first, and the check reads the
	// events through it.
	c.store()
	t.Cleanup(func() {
		if !t.Failed() {
			c.requireNoCredentialLeaked()
		}
	})
	return c
}

// input is a warm run placed in a sandbox whose runner listens behind TLS.
func (c *continuity) input(session, prompt string) *prpv1.ExecutionInput {
	c.t.Helper()
	in, err := cli.InputSpec{Prompt: prompt, Company: "acme", Agent: "agent-1", Issue: "ISS-1", Session: session, Lifecycle: "warm"}.Input()
	require.NoError(c.t, err)
	in.Runner = &prpv1.RunnerPlacement{TransportMode: "listen_ws", IngressAuthorized: true}
	return in
}

// turn submits a run (mod may change its input) and waits for it to
// succeed through client.
func (c *continuity) turn(ctx context.Context, client executorv1.ExecutorServiceClient, runID, session, prompt string, mod func(*prpv1.ExecutionInput)) *executorv1.Run {
	c.t.Helper()
	in := c.input(session, prompt)
	if mod != nil {
		mod(in)
	}
	_, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(c.t, err)
	return c.waitState(ctx, client, runID, executorv1.RunState_RUN_STATE_SUCCEEDED)
}

func (c *continuity) root(session string) string {
	return filepath.Join(c.st.RunnerStateRoot(), scope.OfRun("any", c.input(session, "")))
}

// requireListening asserts the session's runner is connected over the
// sandbox ingress (listen_ws).
func (c *continuity) requireListening(ctx context.Context, runnerInstanceID string) {
	c.t.Helper()
	r, err := c.gw.GetRunner(ctx, &gatewayv1.GetRunnerRequest{RunnerInstanceId: runnerInstanceID})
	require.NoError(c.t, err)
	require.Equal(c.t, gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, r.GetRunner().GetMode())
}

func sameProcess(t *testing.T, a, b *prpv1.ProcessInfo, what string) {
	t.Helper()
	require.Positive(t, a.GetPid())
	require.Equal(t, a.GetPid(), b.GetPid(), what)
	require.Equal(t, a.GetStartTicks(), b.GetStartTicks(), what+" (same start, not a reused pid)")
}

// suspend closes the session with a verified suspension and checks the
// stamped backup.
func (c *continuity) suspend(ctx context.Context, session string) *executorv1.SessionCheckpoint {
	c.t.Helper()
	resp, err := c.client.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: session, Suspend: true, Reason: "continuity idle close"})
	require.NoError(c.t, err)
	require.Len(c.t, resp.GetCheckpoints(), 1)
	cp := resp.GetCheckpoints()[0]
	bc := c.backupClient()
	vr, err := bc.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: cp.GetStamp(), LeaseId: cp.GetLeaseId()})
	require.NoError(c.t, err)
	require.True(c.t, vr.GetValid(), vr.GetReason())
	deep, err := bc.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cp.GetCheckpointId()}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	require.NoError(c.t, err)
	require.True(c.t, deep.GetValid(), deep.GetReason())
	rs, ok := readRunnerState(c.t, c.root(session))
	require.True(c.t, ok)
	require.Equal(c.t, "suspended", rs.Lifecycle)
	return cp
}

// requireNoCredentialLeaked greps everything the tree wrote: the database's
// events, every file under the stack directory (logs, runner state, provider
// homes, backup blobs) and the live providers' environments.
func (c *continuity) requireNoCredentialLeaked() {
	t := c.t
	ctx := context.Background()
	var n int
	require.NoError(t, c.store().Pool().QueryRow(ctx,
		`SELECT count(*) FROM executor.events WHERE position(convert_to($1, 'UTF8') in event) > 0`, credentialCanary).Scan(&n))
	require.Zero(t, n, "no event carries the credential")
	root := filepath.Dir(c.st.RunnerStateRoot())
	require.NoError(t, filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || info.Mode()&os.ModeType != 0 {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(credentialCanary)) {
			t.Errorf("%s contains the credential", p)
		}
		return nil
	}))
}

// TestC1_ThreeWarmTurnsKeepOneRunnerAndOneProviderAndIdleCloseIsAVerifiedSuspension:
// C1, and C6 after the resumption.
func TestC1_ThreeWarmTurnsKeepOneRunnerAndOneProviderAndIdleCloseIsAVerifiedSuspension(t *testing.T) {
	c := newContinuity(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var runs []*executorv1.Run
	for i, id := range []string{"c1-1", "c1-2", "c1-3"} {
		run := c.turn(ctx, c.client, id, "c1", "turn "+id, nil)
		require.Contains(t, run.GetResult().GetFinalMessage(), []string{"0", "2", "4"}[i]+" earlier messages", "the provider history is reused")
		runs = append(runs, run)
	}
	c.requireListening(ctx, runs[0].GetRunnerInstanceId())
	for _, r := range runs[1:] {
		sameProcess(t, runs[0].GetRunnerProcess(), r.GetRunnerProcess(), "the same runner process")
		sameProcess(t, runs[0].GetProviderProcess(), r.GetProviderProcess(), "the same provider process")
	}
	require.Equal(t, 1, countLines(t, c.st.CallLog(), "process-start"), "one provider process")
	requireEnvironmentWithoutCredentials(t, runs[2].GetProviderProcess().GetPid())

	cp := c.suspend(ctx, "c1")
	require.Equal(t, runs[2].GetRunnerInstanceId(), cp.GetRunnerInstanceId())

	// The session resumes after the suspension; then a healthy follow-up
	// starts no new runner or provider process (C6).
	resumed := c.turn(ctx, c.client, "c1-4", "c1", "after the suspension", nil)
	require.Contains(t, resumed.GetResult().GetFinalMessage(), "6 earlier messages")
	require.Equal(t, runs[0].GetRunnerInstanceId(), resumed.GetRunnerInstanceId(), "the verified runner identity continues")
	require.Equal(t, 1, countLines(t, c.st.CallLog(), "thread/resume"))
	healthy := c.turn(ctx, c.client, "c1-5", "c1", "a healthy follow-up", nil)
	sameProcess(t, resumed.GetRunnerProcess(), healthy.GetRunnerProcess(), "no new runner process")
	sameProcess(t, resumed.GetProviderProcess(), healthy.GetProviderProcess(), "no new provider process")
	require.Equal(t, 2, countLines(t, c.st.CallLog(), "process-start"))
	require.Equal(t, 5, countLines(t, c.st.CallLog(), "turn/start"), "each turn started exactly once")
}

// TestC2_AKilledControllerIsRecoveredByANewExecutorProcess: C2 and C3's
// fencing of the former controller, then C6.
func TestC2_AKilledControllerIsRecoveredByANewExecutorProcess(t *testing.T) {
	c := newContinuity(t, stack.Options{LeaseTTL: 10 * time.Minute, FakeArgs: []string{"--delta-delay-ms", "40"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first := c.turn(ctx, c.client, "c2-1", "c2", "a first turn", nil)

	_, err := c.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "c2-2", Input: c.input("c2", slowTurn)})
	require.NoError(t, err)
	c.waitForDelta(ctx, c.client, "c2-2")
	c.st.Proc("executor").Kill() // the controller dies mid-turn

	require.NoError(t, c.st.AddExecutor("executor-2"))
	_, err = c.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	successor := c.clientFor("executor-2")
	recovered := c.waitState(ctx, successor, "c2-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.EqualValues(t, 2, recovered.GetAttempt(), "recovered once, by the new controller")
	require.Equal(t, "executor-2", recovered.GetLeaseOwner())
	sameProcess(t, first.GetRunnerProcess(), recovered.GetRunnerProcess(), "the live remote runner was re-attached")
	require.Equal(t, 2, countLines(t, c.st.CallLog(), "turn/start"), "the interrupted turn started exactly once")
	require.Contains(t, recovered.GetResult().GetFinalMessage(), "2 earlier messages")

	// C3: the former controller's lease attempt is fenced at the gateway
	// before it reaches the runner.
	stream, err := c.gw.Attach(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
		RunId: "c2-2", Fence: &gatewayv1.FencingToken{Owner: "executor", Attempt: 1}, Input: c.input("c2", slowTurn)}}}))
	_, err = stream.Recv()
	require.EqualValues(t, "runner_attempt_fenced", failure.CodeOf(err), "%v", err)

	// C6: a healthy follow-up through the new controller reuses both
	// processes.
	healthy := c.turn(ctx, successor, "c2-3", "c2", "a healthy follow-up", nil)
	sameProcess(t, first.GetRunnerProcess(), healthy.GetRunnerProcess(), "no new runner process")
	sameProcess(t, first.GetProviderProcess(), healthy.GetProviderProcess(), "no new provider process")
	require.Equal(t, 1, countLines(t, c.st.CallLog(), "process-start"))
	require.Equal(t, 3, countLines(t, c.st.CallLog(), "turn/start"))
}

// TestC3_AReplacementSandboxWithAnotherRunnerIdentityIsRefusedBeforeAnyReconnect:
// the suspended session's state now claims another runner (a replacement
// sandbox): nothing is launched or reconnected, the root is quarantined.
func TestC3_AReplacementSandboxWithAnotherRunnerIdentityIsRefusedBeforeAnyReconnect(t *testing.T) {
	c := newContinuity(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first := c.turn(ctx, c.client, "c3-1", "c3", "a first turn", nil)
	c.suspend(ctx, "c3")
	root := c.root("c3")
	runnerstatetest.SetRunnerInstance(t, root, "runner-replacement-sandbox")

	_, err := c.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "c3-2", Input: c.input("c3", "again")})
	require.NoError(t, err)
	run := c.waitState(ctx, c.client, "c3-2", executorv1.RunState_RUN_STATE_FAILED)
	require.Equal(t, failure.RunnerStateIdentityMismatch, run.GetFailure().GetCode(), run.GetFailure().GetMessage())
	require.NoDirExists(t, root, "the unproven root was quarantined")
	runners, err := c.gw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	for _, r := range runners.GetRunners() {
		require.False(t, r.GetConnected(), "no runner reconnected")
	}
	require.Equal(t, 1, countLines(t, c.st.CallLog(), "process-start"), "no provider started")
	require.NotEqual(t, "runner-replacement-sandbox", first.GetRunnerInstanceId())
}

// TestC4_ALegacyCheckpointOrAChangedProviderConfigurationNeedsAVerifiedSuspensionAndAReplacementProvider:
// C4, each with C6.
func TestC4_ALegacyCheckpointOrAChangedProviderConfigurationNeedsAVerifiedSuspensionAndAReplacementProvider(t *testing.T) {
	t.Run("changed provider configuration", func(t *testing.T) {
		c := newContinuity(t, stack.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		model := func(m string) func(*prpv1.ExecutionInput) {
			return func(in *prpv1.ExecutionInput) { in.Provider.Model = m }
		}
		c.turn(ctx, c.client, "c4-1", "c4", "first", model("model-a"))
		before := c.turn(ctx, c.client, "c4-2", "c4", "second", model("model-a"))
		replaced := c.turn(ctx, c.client, "c4-3", "c4", "third, another model", model("model-b"))
		require.Contains(t, replaced.GetResult().GetFinalMessage(), "4 earlier messages", "the conversation survived")
		require.NotEqual(t, before.GetProviderProcess().GetPid(), replaced.GetProviderProcess().GetPid(), "a replacement provider")
		closed := 0
		for _, m := range c.watch(ctx, "c4-3", 0, nil) {
			if m.GetEvent().GetEventType() == "session.closed" {
				closed++
				p := m.GetEvent().GetPayload().AsMap()
				require.Equal(t, "warm native session configuration changed", p["reason"])
				require.NotEmpty(t, p["checkpointId"], "through a verified suspension and its stamped backup")
			}
		}
		require.Equal(t, 1, closed)
		healthy := c.turn(ctx, c.client, "c4-4", "c4", "a healthy follow-up", model("model-b"))
		sameProcess(t, replaced.GetRunnerProcess(), healthy.GetRunnerProcess(), "no new runner process")
		sameProcess(t, replaced.GetProviderProcess(), healthy.GetProviderProcess(), "no new provider process")
		require.Equal(t, 2, countLines(t, c.st.CallLog(), "process-start"))
		require.Equal(t, 4, countLines(t, c.st.CallLog(), "turn/start"), "each turn started exactly once")
	})
	t.Run("legacy checkpoint", func(t *testing.T) {
		c := newContinuity(t, stack.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		first := c.turn(ctx, c.client, "c4l-1", "c4-legacy", "first", nil)
		c.suspend(ctx, "c4-legacy")
		// The suspended state as an older build left it: a root named by
		// the session id alone, and no current stamped checkpoint to
		// restore instead.
		_, err := c.store().Pool().Exec(ctx, `UPDATE executor.session_checkpoints SET superseded_at = now()`)
		require.NoError(t, err)
		legacy := filepath.Join(c.st.RunnerStateRoot(), scope.LegacySessionRootName("c4-legacy"))
		require.NoError(t, os.Rename(c.root("c4-legacy"), legacy))

		migrated := c.turn(ctx, c.client, "c4l-2", "c4-legacy", "second", nil)
		require.Contains(t, migrated.GetResult().GetFinalMessage(), "2 earlier messages", "the conversation survived")
		require.Equal(t, first.GetRunnerInstanceId(), migrated.GetRunnerInstanceId(), "the verified runner identity continues")
		require.NoDirExists(t, legacy, "migrated into the full scope")
		require.DirExists(t, c.root("c4-legacy"))
		require.Equal(t, 1, countLines(t, c.st.CallLog(), "thread/resume"))
		healthy := c.turn(ctx, c.client, "c4l-3", "c4-legacy", "a healthy follow-up", nil)
		sameProcess(t, migrated.GetRunnerProcess(), healthy.GetRunnerProcess(), "no new runner process")
		sameProcess(t, migrated.GetProviderProcess(), healthy.GetProviderProcess(), "no new provider process")
		require.Equal(t, 2, countLines(t, c.st.CallLog(), "process-start"))
		require.Equal(t, 3, countLines(t, c.st.CallLog(), "turn/start"), "each turn started exactly once")
	})
}

// requireEnvironmentWithoutCredentials checks a live process's environment
// (the provider's allow-listed environment).
func requireEnvironmentWithoutCredentials(t *testing.T, pid int32) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		t.Logf("provider environment not readable: %v", err)
		return
	}
	require.NotContains(t, string(b), credentialCanary, "the provider's environment carries no credential")
	require.NotContains(t, string(b), "OPENAI_API_KEY")
}

// TestC5_ARecoveryMayRestartTheProviderToRefreshItsToolContract: C5 with C6.
func TestC5_ARecoveryMayRestartTheProviderToRefreshItsToolContract(t *testing.T) {
	c := newContinuity(t, stack.Options{})
	toolContractRefresh(t, c.harness, c.input)
}

// toolContractRefresh runs a warm session whose third run declares another
// tool contract: the provider is restarted once, the same thread resumes
// with the new tools (the fake calls the first declared tool), and the
// follow-up with the same contract reuses the process.
func toolContractRefresh(t *testing.T, h *harness, input func(session, prompt string) *prpv1.ExecutionInput) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}})
	lookup := &prpv1.DynamicTool{Name: "mock_lookup", Description: "Look up a value by key.", InputSchema: schema}
	weather := &prpv1.DynamicTool{Name: "mock_weather", Description: "The weather for a place.", InputSchema: schema}
	run := func(id, prompt string, tools ...*prpv1.DynamicTool) *executorv1.Run {
		t.Helper()
		in := input("tools-refresh", prompt)
		in.DynamicTools = tools
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in})
		require.NoError(t, err)
		return h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
	}
	first := run("tc-1", "first", lookup)
	second := run("tc-2", "second, same tools", lookup)
	sameProcess(t, first.GetProviderProcess(), second.GetProviderProcess(), "equal tool contracts share the provider")

	// tc-3 declares another contract and calls its first tool.
	in := input("tools-refresh", "[dyn] the weather in Lisbon")
	in.DynamicTools = []*prpv1.DynamicTool{weather, lookup}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "tc-3", Input: in})
	require.NoError(t, err)
	var callID string
	wctx, stop := context.WithCancel(ctx)
	stream, err := h.client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: "tc-3"})
	require.NoError(t, err)
	restarting := 0
	for callID == "" {
		m, err := stream.Recv()
		require.NoError(t, err)
		switch m.GetEvent().GetEventType() {
		case "provider.restarting":
			restarting++
			require.Equal(t, "tool_contract_changed", m.GetEvent().GetPayload().AsMap()["reason"])
		case "semantic_tool.input":
			p := m.GetEvent().GetPayload().AsMap()
			require.Equal(t, "mock_weather", p["tool"], "the restarted provider serves the new contract")
			callID, _ = p["callId"].(string)
		}
	}
	stop()
	require.Equal(t, 1, restarting)
	_, err = h.client.CompleteToolCall(ctx, &executorv1.CompleteToolCallRequest{RunId: "tc-3", CallId: callID, Success: true, Text: "sunny, 21 C"})
	require.NoError(t, err)
	third := h.waitState(ctx, h.client, "tc-3", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, third.GetResult().GetFinalMessage(), "sunny, 21 C")
	require.NotEqual(t, second.GetProviderProcess().GetPid(), third.GetProviderProcess().GetPid(), "a restarted provider")
	require.Equal(t, second.GetRunnerInstanceId(), third.GetRunnerInstanceId())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"), "the same thread, resumed with the new tools")

	// C6: a healthy follow-up with the same contract reuses the process.
	fourth := run("tc-4", "a healthy follow-up", weather, lookup)
	sameProcess(t, third.GetRunnerProcess(), fourth.GetRunnerProcess(), "no new runner process")
	sameProcess(t, third.GetProviderProcess(), fourth.GetProviderProcess(), "no new provider process")
	require.Contains(t, fourth.GetResult().GetFinalMessage(), "earlier messages")
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))
	require.Equal(t, 4, countLines(t, h.st.CallLog(), "turn/start"), "each turn started exactly once")
}

func TestR2_AToolContractChangeRestartsTheProviderOnTheSameThreadAndFollowUpsReuseIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	toolContractRefresh(t, h, h.submitInput)
}
