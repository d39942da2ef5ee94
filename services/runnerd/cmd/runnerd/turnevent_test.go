package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// cutAfterTurnEvent puts runnerd's state dir back as a kill -9 right after
// it journaled the live turn.<status> event of turnID, before it took the
// turn's result, left it: the outbox ends with that event (the turn's
// run.terminal and what followed were never journaled) and the state is
// the one saved while the turn ran (the turn active, the outcome records
// of the intent log applied). It returns the
// event's source seq.
func cutAfterTurnEvent(t *testing.T, stateDir, turnID string) uint64 {
	t.Helper()
	dir := filepath.Join(stateDir, "runner")
	store := &statedir.Store{Dir: dir}
	st, err := store.Load()
	require.NoError(t, err)
	// The state as runnerd left it: the document, and the outcomes of its
	// commands it journaled in the intent log before answering them.
	ins, err := statedir.ReadIntentLog(dir)
	require.NoError(t, err)
	statedir.ReplayIntents(st, ins)
	ob, _, err := statedir.OpenOutbox(dir, 0)
	require.NoError(t, err)
	recs := ob.After(0)
	require.NoError(t, ob.Close())
	cut := -1
	for i, rec := range recs {
		var env struct {
			TurnID string `json:"turnId"`
		}
		require.NoError(t, json.Unmarshal(rec.Envelope, &env))
		if env.TurnID == turnID && (rec.EventType == "turn.completed" || rec.EventType == "turn.failed") {
			cut = i
		}
	}
	require.GreaterOrEqual(t, cut, 0, "the live turn event is journaled")
	kept := recs[:cut+1]
	// Every provider line through the turn's end was journaled (a hosted
	// provider's host replays none of them to the relaunched runnerd).
	kept[cut].ProviderCursor = max(kept[cut].ProviderCursor, ob.ProviderCursor())
	require.NoError(t, os.Remove(filepath.Join(dir, statedir.OutboxFile)))
	ob, _, err = statedir.OpenOutbox(dir, 0)
	require.NoError(t, err)
	require.NoError(t, ob.Append(kept...))
	require.NoError(t, ob.Close())

	var cmdID string
	for id, rec := range st.ProcessedCommands {
		if tid, _ := rec.Result["turnId"].(string); tid == turnID {
			cmdID = id
		}
	}
	require.NotEmpty(t, cmdID)
	seq := kept[len(kept)-1].SourceSeq
	st.ActiveTurn = &runnerstate.Turn{TurnID: turnID, RunID: "run-re", Attempt: 1, CommandID: cmdID}
	st.NextSourceSeq = seq + 1
	st.LastTurnEvent = nil // saved before the event was journaled
	require.NoError(t, store.Save(st))
	return seq
}

// TestR7_RunnerdKilledBetweenTheTurnEventAndRunTerminalJournalsTheTurnEventOnce:
// the real runnerd, with the real codex, ACP and OpenCode drivers and their
// fakes, is killed after it journaled a turn's live turn.<status> event and
// before the turn's run.terminal. The relaunched runnerd restarts the
// provider (codex, ACP) or re-attaches to it (OpenCode, hosted), reconciles
// the turn from the provider's record (codex thread/read, the ACP driver's
// durable state, the OpenCode session) and ends it with the recorded result: one
// run.terminal, and the turn's event in the history once — the driver's
// reconciled copy is not journaled again (SPEC R7, X1).
func TestR7_RunnerdKilledBetweenTheTurnEventAndRunTerminalJournalsTheTurnEventOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, fake, turnID string
		args               func(fake, callLog string) []string
		provider           *prpv1.Provider
	}{
		{
			name: "codex", fake: "fake-codex-app-server",
			args: func(fake, callLog string) []string {
				return []string{"--provider-host=false", "--provider-command", fake, "--provider-arg", "app-server", "--provider-arg", "--state-file-in-codex-home",
					"--provider-arg", "--durable-turn-ids", "--provider-arg", "--call-log=" + callLog}
			},
			provider: &prpv1.Provider{Kind: "codex", Model: "gpt-fake"},
		},
		{
			// Hosted: the provider survives the kill under its host, and
			// the host replays nothing of the turn (its end is journaled).
			name: "codex hosted", fake: "fake-codex-app-server",
			args: func(fake, callLog string) []string {
				return []string{"--provider-command", fake, "--provider-arg", "app-server", "--provider-arg", "--state-file-in-codex-home",
					"--provider-arg", "--durable-turn-ids", "--provider-arg", "--call-log=" + callLog}
			},
			provider: &prpv1.Provider{Kind: "codex", Model: "gpt-fake"},
		},
		{
			name: "acpx-codex", fake: "fake-acp-agent", turnID: "acp-turn-1",
			args: func(fake, callLog string) []string {
				return []string{"--provider", "acpx-codex", "--provider-command", fake, "--provider-arg", "-flavor", "--provider-arg", "codex",
					"--provider-arg", "-call-log=" + callLog}
			},
			provider: &prpv1.Provider{Kind: "acpx", Agent: "codex", PermissionMode: "approve-all"},
		},
		{
			// Hosted: the OpenCode server survives the kill under its
			// host; the relaunched runnerd re-attaches and reconciles the
			// turn from the server's session (ReconcileOnReattach).
			name: "opencode", fake: "fake-opencode",
			args: func(fake, callLog string) []string {
				return []string{"--provider", "opencode", "--provider-command", fake, "--provider-arg", "--call-log=" + callLog}
			},
			provider: &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "allow"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runnerd, fake, g, url, stateDir, ws, callLog := newBinRunnerd(t, tc.fake)
			args := append([]string{"--state-dir", stateDir, "--workspace", ws}, tc.args(fake, callLog)...)

			first := startRunnerd(t, runnerd, g, url, args...)
			c := newFrameCollector(t, g)
			c.send("c1", "run.attach", map[string]any{"input": inputMap(t, tc.provider)})
			c.send("c2", "turn.start", map[string]any{"text": "the answer before the crash"})
			c.collect(func() bool { return c.count("run.terminal") >= 1 }, "the turn's run.terminal")
			turnID := tc.turnID
			for _, ev := range c.events {
				if ev.GetEventType() == "run.terminal" {
					turnID = ev.GetTurnId()
				}
			}
			require.NotEmpty(t, turnID)
			require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
			<-first.exited

			seq := cutAfterTurnEvent(t, stateDir, turnID)
			for s := range c.events {
				if s > seq {
					delete(c.events, s) // never journaled, so never sent
				}
			}
			require.Zero(t, c.count("run.terminal"))
			g.mu.Lock()
			g.conn = nil
			g.mu.Unlock()
			startRunnerd(t, runnerd, g, url, args...)
			c.collect(func() bool { return c.count("run.terminal") >= 1 }, "the reconciled turn's run.terminal")

			var turnEvents []*prpv1.Event
			var term *prpv1.Event
			for s := uint64(1); s <= uint64(len(c.events)); s++ {
				ev, ok := c.events[s]
				require.True(t, ok, "seq %d present (of %d)", s, len(c.events))
				switch {
				case ev.GetEventType() == "turn.completed" && ev.GetTurnId() == turnID:
					turnEvents = append(turnEvents, ev)
				case ev.GetEventType() == "run.terminal":
					term = ev
				}
			}
			require.Len(t, turnEvents, 1, "the turn's turn.completed once in the history")
			assert.Equal(t, seq, turnEvents[0].GetSourceSeq(), "the live event")
			assert.NotContains(t, turnEvents[0].GetPayload().AsMap(), "reconciled")
			require.NotNil(t, term)
			assert.Equal(t, 1, c.count("run.terminal"))
			assert.Equal(t, turnID, term.GetTurnId())
			assert.Equal(t, "completed", term.GetPayload().AsMap()["turnTerminalState"])
			assert.Contains(t, term.GetPayload().AsMap()["finalMessage"], "the answer before the crash", "the recorded result")
			assert.Equal(t, 1, c.count("runner.reconciled"))
			live := turnEvents[0].GetPayload().AsMap()["usage"]
			require.NotEmpty(t, live)
			assert.Equal(t, live, term.GetPayload().AsMap()["usage"].(map[string]any)["runDelta"],
				"the terminal reports the turn's usage as its journaled event did (SPEC E1)")
		})
	}
}
