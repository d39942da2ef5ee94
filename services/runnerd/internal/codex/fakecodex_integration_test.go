package codex

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/testing/fakecodex"
)

// fakeCodexBinary is tools/fake-codex-app-server: make test's prebuilt one
// ($TETHER_TEST_BIN), or one built once per test process (TestMain removes
// it).
func fakeCodexBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the fake codex app-server")
	}
	bin, err := testbin.Path("github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server")
	require.NoError(t, err)
	return bin
}

// fakeDirs builds the fake and lays out a test root with a codex home and
// a workspace.
func fakeDirs(t *testing.T) (bin, root, codexHome, workspace string) {
	t.Helper()
	bin = fakeCodexBinary(t)
	root = t.TempDir()
	codexHome = filepath.Join(root, "codex-home")
	workspace = filepath.Join(root, "workspace")
	require.NoError(t, os.MkdirAll(workspace, 0o755))
	return bin, root, codexHome, workspace
}

func fakeConfig(t *testing.T, bin, codexHome, workspace, callLog string, extraArgs ...string) Config {
	args := append([]string{"app-server", "--state-file-in-codex-home", "--durable-turn-ids",
		"--call-log", callLog, "--delta-delay-ms", "0"}, extraArgs...)
	return Config{
		Command:        bin,
		Args:           args,
		Env:            []string{"CODEX_HOME=" + codexHome, "HOME=" + filepath.Dir(codexHome)},
		Dir:            workspace,
		CodexHome:      codexHome,
		Model:          "mock-model",
		ApprovalPolicy: "never",
		Sandbox:        "read-only",
		Logger:         quietLogger(),
	}
}

func TestR2_FakeCodexThreeTurnsOneThreadThenResume(t *testing.T) {
	t.Parallel()
	bin, root, codexHome, workspace := fakeDirs(t)
	require.NoError(t, WriteConfig(codexHome, ConfigTOML{Model: "mock-model", ProviderID: "mock", BaseURL: "http://127.0.0.1:1/v1"}))
	callLog := filepath.Join(root, "calls.log")
	ctx := context.Background()

	// Process 1: one thread, three turns; each reply shows the history the
	// fake saw (user+assistant messages of earlier turns).
	s, rec := startSession(t, fakeConfig(t, bin, codexHome, workspace, callLog))
	threadID, resumed, err := s.OpenThread(ctx, "")
	require.NoError(t, err)
	require.False(t, resumed)
	require.NotEmpty(t, threadID)
	started := rec.ofType("session.started")
	require.Len(t, started, 1)
	assert.Equal(t, threadID, started[0].Payload["threadId"])
	assert.Equal(t, threadID, started[0].Payload["providerSessionId"])

	var turnIDs []string
	var usages []Usage
	for i, prompt := range []string{"first prompt", "second prompt", "third prompt"} {
		turnID, err := s.StartTurn(ctx, prompt)
		require.NoError(t, err)
		res := waitTurn(t, s)
		require.Equal(t, turnID, res.TurnID)
		require.Equal(t, TurnCompleted, res.Status, "%+v", res)
		assert.Equal(t, fakecodex.ReplyText(prompt, i+1, 2*i), res.FinalMessage)
		assert.Positive(t, res.Usage.InputTokens)
		assert.Positive(t, res.Usage.OutputTokens)
		turnIDs = append(turnIDs, turnID)
		usages = append(usages, res.Usage)
	}
	assert.Equal(t, []string{"provider-turn-1", "provider-turn-2", "provider-turn-3"}, turnIDs)
	assert.Greater(t, usages[2].InputTokens, usages[0].InputTokens, "later turns carry the history")
	for _, id := range turnIDs {
		assert.Equal(t, 1, countEvents(rec, "turn.started", id))
		assert.Equal(t, 1, countEvents(rec, "turn.completed", id))
		assert.Positive(t, countEvents(rec, "item.delta", id))
	}
	// Each turn's usage is the growth of the thread total: the sum of the
	// per-turn usages equals the last reported total.
	reports := rec.ofType("usage.reported")
	require.NotEmpty(t, reports)
	total := reports[len(reports)-1].Payload["total"].(map[string]any)
	assert.Equal(t, total["inputTokens"], usages[0].InputTokens+usages[1].InputTokens+usages[2].InputTokens)
	closeSession(t, s)
	assert.Equal(t, failure.ProviderClosed, CodeOf(s.ExitErr()))

	// Process 2: resume the same thread from the same codex home; the fourth
	// turn sees all six earlier messages and is charged only its own usage.
	s2, rec2 := startSession(t, fakeConfig(t, bin, codexHome, workspace, callLog))
	id, resumed, err := s2.OpenThread(ctx, threadID)
	require.NoError(t, err)
	assert.True(t, resumed)
	assert.Equal(t, threadID, id)
	turnID, err := s2.StartTurn(ctx, "fourth prompt")
	require.NoError(t, err)
	res := waitTurn(t, s2)
	assert.Equal(t, "provider-turn-4", turnID)
	assert.Equal(t, fakecodex.ReplyText("fourth prompt", 4, 6), res.FinalMessage)
	reports = rec2.ofType("usage.reported")
	require.Len(t, reports, 1, "the replayed total of the old turn is a baseline, not this turn's usage")
	last := reports[0].Payload["last"].(map[string]any)
	assert.Equal(t, last["inputTokens"], res.Usage.InputTokens)
	assert.Equal(t, last["outputTokens"], res.Usage.OutputTokens)
	closeSession(t, s2)

	calls, err := os.ReadFile(callLog)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"initialize", "initialized", "thread/start", "turn/start", "turn/start", "turn/start",
		"initialize", "initialized", "thread/resume", "turn/start",
	}, strings.Fields(string(calls)))
}

func TestR2_FakeCodexSteerAndInterrupt(t *testing.T) {
	t.Parallel()
	bin, root, codexHome, workspace := fakeDirs(t)
	ctx := context.Background()

	// --hold-turn: a turn stays open after its last delta until steered or
	// interrupted.
	s, rec := startSession(t, fakeConfig(t, bin, codexHome, workspace, filepath.Join(root, "calls.log"), "--hold-turn"))
	_, _, err := s.OpenThread(ctx, "")
	require.NoError(t, err)

	turnID, err := s.StartTurn(ctx, "held prompt")
	require.NoError(t, err)
	rec.waitFor(t, func(e Event) bool { return e.Type == "item.delta" && e.TurnID == turnID })
	err = s.Steer(ctx, "provider-turn-999", "wrong turn")
	assert.Equal(t, failure.ProviderSteerFailed, CodeOf(err))
	require.NoError(t, s.Steer(ctx, turnID, "steered"))
	res := waitTurn(t, s)
	assert.Equal(t, TurnCompleted, res.Status)
	assert.Equal(t, fakecodex.ReplyText("held prompt | steered", 1, 0), res.FinalMessage,
		"the abandoned partial reply is not the final message")

	turnID, err = s.StartTurn(ctx, "to interrupt")
	require.NoError(t, err)
	rec.waitFor(t, func(e Event) bool { return e.Type == "item.delta" && e.TurnID == turnID })
	require.NoError(t, s.Interrupt(ctx, turnID))
	res = waitTurn(t, s)
	res.Total = nil // the thread total is TestR2_TurnEventsAndResult's
	assert.Equal(t, TurnResult{TurnID: turnID, Status: TurnInterrupted}, res)
	assert.Equal(t, 1, countEvents(rec, "turn.interrupted", turnID))
}

func countEvents(rec *recorder, typ, turnID string) int {
	n := 0
	for _, e := range rec.ofType(typ) {
		if e.TurnID == turnID {
			n++
		}
	}
	return n
}
