package acp

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// reconcileAfterLoss starts a session on the recorded ACP session (as the
// runner does after losing the agent process, or after a runnerd restart),
// reconciles turnID and takes its delivered result. It returns the events
// of the new session, and for each turn.<status> event how many results
// were waiting on TurnDone when it was emitted.
func reconcileAfterLoss(t *testing.T, h *harness, recordID, turnID string) (*recorder, map[string]int, string, TurnResult) {
	t.Helper()
	rec := newRecorder()
	var mu sync.Mutex
	var s *Session
	queued := map[string]int{}
	emit := func(ev Event) {
		mu.Lock()
		if s != nil && strings.HasPrefix(ev.Type, "turn.") {
			queued[ev.Type] = len(s.TurnDone())
		}
		mu.Unlock()
		rec.emit(ev)
	}
	ctx := context.Background()
	s2, err := Start(ctx, h.config(), emit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close(context.Background(), 0) })
	mu.Lock()
	s = s2
	mu.Unlock()
	_, resumed, err := s2.OpenThread(ctx, recordID)
	require.NoError(t, err)
	require.True(t, resumed)

	outcome, status, err := s2.ReconcileTurn(ctx, turnID)
	require.NoError(t, err)
	require.Equal(t, ReconcileTerminalized, outcome)
	res := waitTurn(t, s2, turnID)
	mu.Lock()
	defer mu.Unlock()
	return rec, queued, status, res
}

// TestR7_ACPReconciledTurnEmitsItsTurnEventBeforeTheTerminal: a turn the
// durable state records as finished is reconciled like codex's and
// OpenCode's: its turn.<status> event (payload reconciled:true, the shape
// of the live event) is emitted before its result is delivered on TurnDone,
// so the runner journals it ahead of the turn's run.terminal (the provider
// package's ReconcileTerminalized contract). Before, the ACP driver only
// delivered the result: the run ended with run.terminal and no turn event.
func TestR7_ACPReconciledTurnEmitsItsTurnEventBeforeTheTerminal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, prompt, status string
		agent                string
	}{
		{"completed", "finish the report", provider.TurnCompleted, AgentCodex},
		{"failed", "this one breaks [fail]", provider.TurnFailed, AgentCodex},
		// claude-agent-acp reports the session's cost: the reconciled
		// result carries the turn's as the live one did.
		{"completed, with its cost", "finish the report", provider.TurnCompleted, AgentClaude},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tc.agent, ApproveAll)
			s1, rec1, recordID := h.start("")
			live := turnOf(t, s1, tc.prompt)
			require.Equal(t, tc.status, live.Status)
			liveEv := rec1.waitFor(t, "turn."+tc.status)
			require.NoError(t, s1.Close(context.Background(), 0))

			rec, queued, status, res := reconcileAfterLoss(t, h, recordID, "acp-turn-1")
			assert.Equal(t, tc.status, status)
			assert.Equal(t, live.Status, res.Status)
			assert.Equal(t, live.FinalMessage, res.FinalMessage)
			assert.Equal(t, live.Usage, res.Usage)
			require.NotNil(t, live.Total)
			assert.Equal(t, live.Total, res.Total, "the session's total when the turn ended")
			assert.Equal(t, live.Cost, res.Cost, "the turn's own cost")
			if tc.agent == AgentClaude {
				require.NotNil(t, live.Cost)
			}

			evs := rec.ofType("turn." + tc.status)
			require.Len(t, evs, 1, "the reconciled turn's event; got %v", rec.types())
			ev := evs[0]
			assert.Equal(t, "acp-turn-1", ev.TurnID)
			assert.Equal(t, P0, ev.Priority)
			assert.Equal(t, 0, queued[ev.Type], "the event is emitted before the result is delivered")
			want := map[string]any{}
			for k, v := range liveEv.Payload {
				want[k] = v
			}
			want["reconciled"] = true
			assert.Equal(t, want, ev.Payload, "the live event's payload, marked reconciled")
			assert.NotContains(t, liveEv.Payload, "reconciled")
			if tc.status == provider.TurnFailed {
				assert.Equal(t, failure.ProviderTurnFailed, ev.Payload["error"].(map[string]any)["code"])
			}
		})
	}
}

// TestR7_ACPTurnFinishedButNotJournaledBeforeALossGetsItsEventOnReconcile:
// the crash window between finishTurn's state save and the runner
// journaling the turn's events. finishTurn saves the finished record before
// it emits turn.<status> (saving after would let a loss in between read
// back as a turn that never finished, retried and run twice). A runnerd
// lost right after the save never journaled the event — here the first
// session's events are dropped — and the new session's reconciliation
// emits it from the record.
func TestR7_ACPTurnFinishedButNotJournaledBeforeALossGetsItsEventOnReconcile(t *testing.T) {
	t.Parallel()
	h := newHarness(t, AgentClaude, ApproveAll)
	savedFirst := make(chan bool, 1)
	ctx := context.Background()
	s1, err := Start(ctx, h.config(), func(ev Event) {
		if ev.Type != "turn.completed" {
			return // (dropped: the lost runnerd never journaled them)
		}
		st, err := ReadState(h.state)
		ok := err == nil && st != nil && st.turn(ev.TurnID) != nil && st.turn(ev.TurnID).Status == provider.TurnCompleted
		savedFirst <- ok
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s1.Close(context.Background(), 0) })
	recordID, _, err := s1.OpenThread(ctx, "")
	require.NoError(t, err)
	live := turnOf(t, s1, "the answer before the crash")
	require.True(t, <-savedFirst, "the finished record is on disk when turn.completed is emitted")
	require.NoError(t, s1.Close(ctx, 0))

	rec, queued, status, res := reconcileAfterLoss(t, h, recordID, "acp-turn-1")
	assert.Equal(t, provider.TurnCompleted, status)
	assert.Equal(t, live.FinalMessage, res.FinalMessage)
	assert.Equal(t, live.Usage, res.Usage)
	evs := rec.ofType("turn.completed")
	require.Len(t, evs, 1, "the turn's completion is not lost with the runnerd; got %v", rec.types())
	assert.Equal(t, true, evs[0].Payload["reconciled"])
	assert.Equal(t, live.FinalMessage, evs[0].Payload["finalMessage"])
	assert.Equal(t, "end_turn", evs[0].Payload["stopReason"])
	assert.Equal(t, 0, queued["turn.completed"])
}
