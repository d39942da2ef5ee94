package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"
)

// checkpointPayload is the codex profile as the gateway sends it.
func checkpointPayload() map[string]any {
	return map[string]any{
		"reason": "checkpoint", "dirs": []any{"runner", "codex-home"}, "home": "codex-home",
		"exclude": []any{"tmp", "auth.json"}, "anywhere": []any{"auth.json"}, "skip": []any{"provider.sock", CheckpointStageDir},
	}
}

// TestP6_RunnerCheckpointStagesASuspendedCopyAndKeepsTheProviderRunning:
// runner.checkpoint refuses a turn in progress; on an idle runner it
// stages a copy of the runner directory and the provider home (no
// credentials, no provider host records, no stage inside the stage) whose
// runner state is the suspended state a suspension would have left — no
// runner or provider process, the checkpoint command completed — while
// the live runner stays ready with its provider running, and serves the
// next turn on the same provider.
func TestP6_RunnerCheckpointStagesASuspendedCopyAndKeepsTheProviderRunning(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)

	res := e.gw.command(cs.next("c-cp-busy", CmdRunnerCheckpoint, checkpointPayload()))
	assert.Equal(t, runnerstate.StatusRejected, res.GetStatus())
	assert.Equal(t, failure.TurnAlreadyActive, res.GetCode())
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	e.gw.ack(e.gw.maxSeq())

	home := filepath.Join(e.stateDir, "codex-home")
	require.NoError(t, os.MkdirAll(filepath.Join(home, "sessions", "nested"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, "sessions", "rollout.jsonl"), []byte("history\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(home, "sessions", "nested", "auth.json"), []byte("secret"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(home, "auth.json"), []byte("secret"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(e.stateDir, "runner", provhost.InfoName), []byte("{}"), 0o600))

	res = e.gw.command(cs.next("c-cp", CmdRunnerCheckpoint, checkpointPayload()))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	out := res.GetResult().AsMap()
	stage := filepath.Join(e.stateDir, out["stage"].(string))
	assert.Equal(t, filepath.Join("runner", CheckpointStageDir, "c-cp"), out["stage"])
	assert.Equal(t, "thread-1", out["providerThreadId"])

	staged, err := runnerstate.Read(stage)
	require.NoError(t, err)
	assert.Equal(t, runnerstate.LifecycleSuspended, staged.Lifecycle)
	assert.Nil(t, staged.RunnerProcess)
	assert.Nil(t, staged.ProviderProcess)
	assert.Equal(t, "thread-1", staged.ProviderThreadID)
	assert.Nil(t, staged.ActiveTurn)
	assert.Equal(t, runnerstate.StatusCompleted, staged.ProcessedCommands["c-cp"].Status)
	b, err := os.ReadFile(filepath.Join(stage, "codex-home", "sessions", "rollout.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, "history\n", string(b))
	for _, gone := range []string{"codex-home/auth.json", "codex-home/sessions/nested/auth.json", "runner/" + provhost.InfoName, "runner/" + CheckpointStageDir} {
		assert.NoFileExists(t, filepath.Join(stage, gone))
		assert.NoDirExists(t, filepath.Join(stage, gone))
	}
	assert.FileExists(t, filepath.Join(stage, "runner", "outbox.log"))

	// The live runner was not suspended: ready, its provider running, and
	// the next turn runs on it.
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleReady, st.Lifecycle)
	assert.NotNil(t, st.ProviderProcess)
	prov.mu.Lock()
	assert.False(t, prov.closed)
	prov.mu.Unlock()
	res = e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, 1, e.prov.count(), "the same provider")
}
