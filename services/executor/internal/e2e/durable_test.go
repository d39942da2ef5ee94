package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// settledHarness is a stack whose warm runners settle (suspend and exit)
// after one idle second, without a backup verifier.
func settledHarness(t *testing.T) *harness {
	return newHarnessWith(t, stack.Options{GatewayArgs: []string{"-idle-timeout", "1s"}}, "runnergw", "executor")
}

// runToSettlement runs runID of session to success and waits for its
// runner to settle: lifecycle suspended on disk and the process gone. It
// returns the run and the scope's durable root.
func (h *harness) runToSettlement(ctx context.Context, runID, session, prompt string) (*executorv1.Run, string) {
	t := h.t
	t.Helper()
	h.submit(runID, session, prompt)
	run := h.waitState(ctx, h.client, runID, executorv1.RunState_RUN_STATE_SUCCEEDED)
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun(runID, h.submitInput(session, prompt)))
	require.Eventually(t, func() bool {
		rs, ok := readRunnerState(t, root)
		return ok && rs.Lifecycle == "suspended" && !procid.Exists(int(run.GetRunnerProcess().GetPid()))
	}, 20*time.Second, 50*time.Millisecond, "the idle runner suspended and exited")
	return run, root
}

// controlEvents returns the payloads of runID's events of type typ.
func (h *harness) controlEvents(ctx context.Context, runID, typ string) []map[string]any {
	var out []map[string]any
	for _, m := range h.watch(ctx, runID, 0, nil) {
		if m.GetEvent().GetEventType() == typ {
			out = append(out, m.GetEvent().GetPayload().AsMap())
		}
	}
	return out
}

func TestE13_AContinuationOfASettledSessionKeepsItsRunnerAndLeaseUnderItsOwnRunID(t *testing.T) {
	t.Parallel()
	h := settledHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, root := h.runToSettlement(ctx, "cont-1", "continuation", "first")
	before := controlPlaneOf(t, root)
	require.Equal(t, "cont-1", before.RunID)

	// cont-1's row is terminal in PostgreSQL, its persisted input has the
	// same full scope and its runner is suspended: cont-2 continues it.
	h.submit("cont-2", "continuation", "second")
	second := h.waitState(ctx, h.client, "cont-2", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, second.GetResult().GetFinalMessage(), "2 earlier messages", "the provider thread continued")
	require.Equal(t, first.GetRunnerInstanceId(), second.GetRunnerInstanceId(), "the verified runner instance is kept")
	require.NotEqual(t, first.GetRunnerProcess().GetPid(), second.GetRunnerProcess().GetPid(), "in a new runner process")
	after := controlPlaneOf(t, root)
	require.Equal(t, durable.Identity{RunID: "cont-2", NormalizedSessionID: "continuation",
		RunnerInstanceID: before.RunnerInstanceID, EnvironmentLeaseID: before.EnvironmentLeaseID}, *after)

	rotated := h.controlEvents(ctx, "cont-2", "session.authority_rotated")
	require.Len(t, rotated, 1)
	require.Equal(t, "cont-1", rotated[0]["previousRunId"])
	require.Equal(t, string(durable.SourcePriorRun), rotated[0]["durableSource"])
	require.Equal(t, "warm native session authority epoch rotated", rotated[0]["reason"])
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"))
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"))
	require.NoDirExists(t, filepath.Join(h.st.RunnerStateRoot(), durable.QuarantineDir))
}

func TestE13_ATerminalPriorRunWhoseRunnerDidNotSuspendIsQuarantinedAndTheRunStartsNothing(t *testing.T) {
	t.Parallel()
	h := settledHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, root := h.runToSettlement(ctx, "q-1", "quarantine", "first")
	// The runner's state claims it was still ready, with another run's
	// turn in flight, when it went away: it proves no settled owner (a
	// runner that crashed idle, or with the terminal run's own turn not yet
	// cleared, would be resumed, SPEC R8).
	path := filepath.Join(root, durable.RunnerDir, durable.RunnerStateFile)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	doc["lifecycle"] = "ready"
	doc["activeTurn"] = map[string]any{"turnId": "provider-turn-9", "runId": "q-0", "attempt": 1}
	b, err = json.Marshal(doc)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))

	h.submit("q-2", "quarantine", "second")
	run := h.waitState(ctx, h.client, "q-2", executorv1.RunState_RUN_STATE_FAILED)
	require.Equal(t, failure.RunnerStateIdentityMismatch, run.GetFailure().GetCode(), run.GetFailure().GetMessage())
	require.Contains(t, run.GetFailure().GetMessage(), "quarantined")
	entries, err := os.ReadDir(filepath.Join(h.st.RunnerStateRoot(), durable.QuarantineDir))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.True(t, strings.HasPrefix(entries[0].Name(), filepath.Base(root)+".identity_indeterminate."), entries[0].Name())
	require.NoDirExists(t, root, "the root was moved whole")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "no provider was started")
}

func TestE10_EachWarmRunTakesTheRunAuthorityOverFromThePreviousOne(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var epochs []float64
	for i, id := range []string{"rot-1", "rot-2", "rot-3"} {
		h.submit(id, "rotation", "turn "+id)
		h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
		rotated := h.controlEvents(ctx, id, "session.authority_rotated")
		if i == 0 {
			require.Empty(t, rotated, "the first run holds a fresh root")
			continue
		}
		require.Len(t, rotated, 1)
		require.Equal(t, "warm native session authority epoch rotated", rotated[0]["reason"])
		require.Equal(t, []string{"rot-1", "rot-2"}[i-1], rotated[0]["previousRunId"])
		require.Empty(t, rotated[0]["durableSource"], "the live warm runner was reused")
		epochs = append(epochs, rotated[0]["toolAuthorityEpoch"].(float64))
	}
	require.Greater(t, epochs[1], epochs[0], "each run revokes the previous run's tool authority epoch")
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("rot-3", h.submitInput("rotation", "")))
	require.Equal(t, "rot-3", controlPlaneOf(t, root).RunID, "the persisted identity is re-bound to the current run")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "one provider served all three runs")
}

func controlPlaneOf(t *testing.T, root string) *durable.Identity {
	t.Helper()
	id, why, err := durable.ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.NotNil(t, id, why)
	return id
}
