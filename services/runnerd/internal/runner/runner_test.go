package runner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// attachAndTurn attaches run-1 and starts one turn; returns the provider.
func attachAndTurn(t *testing.T, e *testEnv, cs *cmdSeq) *fakeProvider {
	t.Helper()
	res := e.gw.command(cs.attach("c-attach"))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(cs.next("c-turn1", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	require.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue())
	return e.prov.last()
}

func TestG4_TurnEventsCarrySourceIdentityAndTerminal(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	e.gw.waitConns(1)
	h := e.gw.hellos[0]
	assert.Equal(t, tRunner, h.GetIdentity().GetRunnerInstanceId())
	assert.Equal(t, "envlease-1", h.GetIdentity().GetEnvironmentLeaseId())
	assert.Equal(t, tSess, h.GetIdentity().GetNormalizedSessionId())
	assert.Equal(t, tScope, h.GetIdentity().GetSessionScope())
	assert.Equal(t, uint64(1), h.GetResume().GetNextSourceSeq())
	assert.Equal(t, int32(os.Getpid()), h.GetRunnerProcess().GetPid())
	assert.NotZero(t, h.GetRunnerProcess().GetStartTicks())
	assert.NotEmpty(t, h.GetRunnerProcess().GetBootId())
	assert.Equal(t, prp.KindBootstrap, h.GetCredentialKind())

	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	attached := e.gw.waitEvent("run.attached", 1)
	assert.Equal(t, uint32(0), attached.GetPriority())
	assert.Equal(t, "run-1", attached.GetRunId())

	// A second turn while one is active is refused.
	res := e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	assert.Equal(t, runnerstate.StatusRejected, res.GetStatus())
	assert.Equal(t, failure.TurnAlreadyActive, res.GetCode())
	assert.Equal(t, "run-1", res.GetRunId())

	// Steering: wrong expected turn is refused, the right one reaches the driver.
	res = e.gw.command(cs.next("c-steer1", CmdTurnSteer, map[string]any{"text": "left", "expectedTurnId": "turn-9"}))
	assert.Equal(t, failure.TurnMismatch, res.GetCode())
	assert.Equal(t, "turn turn-9 is not the active turn (the active turn is turn-1)", res.GetMessage(), "the caller's turn first, then the active one")
	res = e.gw.command(cs.next("c-steer2", CmdTurnSteer, map[string]any{"text": "left", "expectedTurnId": "turn-1"}))
	assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	prov.mu.Lock()
	assert.Equal(t, []string{"turn-1:left"}, prov.steers)
	prov.mu.Unlock()

	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "done!",
		Usage: Usage{InputTokens: 10, CachedInputTokens: 4, OutputTokens: 7},
		Total: &Usage{InputTokens: 30, CachedInputTokens: 8, OutputTokens: 20}})
	term := e.gw.waitEvent("run.terminal", 1)
	assert.Equal(t, uint32(0), term.GetPriority())
	assert.Equal(t, "turn-1", term.GetTurnId())
	pl := term.GetPayload().AsMap()
	assert.Equal(t, "completed", pl["turnTerminalState"])
	assert.Equal(t, "succeeded", pl["runTerminalState"])
	assert.Equal(t, "done!", pl["finalMessage"])
	assert.Equal(t, "thread-1", pl["providerThreadId"])
	assert.Equal(t, "turn-1", pl["providerTurnId"])
	// SPEC E1: the runner reports the turn's delta and the session total.
	assert.Equal(t, map[string]any{
		"runDelta": map[string]any{"inputTokens": 10.0, "cachedInputTokens": 4.0, "outputTokens": 7.0},
		"total":    map[string]any{"inputTokens": 30.0, "cachedInputTokens": 8.0, "outputTokens": 20.0},
	}, pl["usage"])

	// Events arrive contiguous from 1 with the runner's identity, and the
	// provider's own events precede run.terminal.
	all := e.gw.distinct()
	idRe := regexp.MustCompile(`^event_runner-t1_\d{16}$`)
	var types []string
	for seq := uint64(1); seq <= uint64(len(all)); seq++ {
		ev, ok := all[seq]
		require.True(t, ok, "missing seq %d", seq)
		assert.Equal(t, tRunner, ev.ev.GetSourceInstanceId())
		assert.Equal(t, fmt.Sprintf("event_%s_%016d", tRunner, seq), ev.ev.GetSourceEventId())
		assert.Regexp(t, idRe, ev.ev.GetSourceEventId())
		assert.Equal(t, "runner", ev.ev.GetSourceKind())
		assert.Equal(t, EventSchema, ev.ev.GetSchema())
		assert.Equal(t, uint32(1), ev.ev.GetSchemaVersion())
		assert.Equal(t, tSess, ev.ev.GetNormalizedSessionId())
		assert.Equal(t, "run-1", ev.ev.GetRunId())
		assert.NotNil(t, ev.ev.GetEmittedAt())
		types = append(types, ev.ev.GetEventType())
	}
	assert.Equal(t, []string{"run.attached", "session.starting", "harness.ready", "session.started", EventCommandExecuted, "turn.started",
		"item.delta", "item.completed", "turn.completed", "run.terminal"}, types)
	assert.Equal(t, uint32(2), all[7].ev.GetPriority(), "deltas are P2")
	executed := all[5].ev.GetPayload().AsMap()
	assert.Equal(t, CmdTurnStart, executed["commandType"], "the turn's execution is reported (SPEC X1)")
	assert.NotEmpty(t, executed["commandId"])
	assert.Equal(t, "turn-1", executed["turnId"])

	// Provider config: allow-listed environment only, run input's provider fields.
	e.prov.mu.Lock()
	cfg := e.prov.configs[0]
	e.prov.mu.Unlock()
	assert.Equal(t, []string{
		"CODEX_HOME=" + filepath.Join(e.stateDir, "codex-home"), "HOME=" + e.stateDir,
		"PAPERCLIP_WORKSPACE_CWD=" + e.ws, "PATH=/usr/bin:/bin", "TETHER_WORKSPACE_CWD=" + e.ws,
	}, cfg.Env)
	assert.Equal(t, e.ws, cfg.Dir)
	assert.Equal(t, "gpt-test", cfg.Model)
	assert.Equal(t, "never", cfg.ApprovalPolicy)
	assert.Equal(t, "workspace-write", cfg.Sandbox)
	fi, err := os.Stat(filepath.Join(e.stateDir, "codex-home"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	// A second turn reuses the running provider and its thread.
	res = e.gw.command(cs.next("c-turn3", CmdTurnStart, map[string]any{"text": "more"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	assert.Equal(t, 1, e.prov.count())
	res = e.gw.command(cs.next("c-int", CmdTurnInterrupt, map[string]any{}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	term = e.gw.waitEvent("run.terminal", 2)
	assert.Equal(t, "interrupted", term.GetPayload().AsMap()["turnTerminalState"])
	assert.Equal(t, "cancelled", term.GetPayload().AsMap()["runTerminalState"])

	// session.close: provider stopped, lifecycle suspended (a clean,
	// resumable settlement), exit 0 once acked.
	res = e.gw.command(cs.next("c-close", CmdSessionClose, map[string]any{}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	e.gw.waitEvent("runner.suspended", 1)
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleSuspended, st.Lifecycle)
	assert.Equal(t, "session_closed", st.LifecycleReason)
	assert.Nil(t, st.ProviderProcess)
	assert.Equal(t, e.gw.maxSeq(), st.AckedSourceSeq)
	prov.mu.Lock()
	assert.True(t, prov.closed)
	prov.mu.Unlock()
}

func TestG4_OversizeProviderEventBecomesDiagnostic(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.emit(ProviderEvent{Type: "item.completed", TurnID: "turn-1", Priority: P1,
		Payload: map[string]any{"text": strings.Repeat("x", prp.MaxFrameBytes+10)}})
	d := e.gw.waitEvent("harness.diagnostic", 1)
	assert.Equal(t, failure.ProviderFrameTooLarge, d.GetPayload().AsMap()["code"])
	assert.Equal(t, "item.completed", d.GetPayload().AsMap()["originalEventType"])
}

func TestR4_OutboxFsyncBeforeSend(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var mu sync.Mutex
	synced := map[uint64]bool{}
	var violations []uint64
	e.gw.mu.Lock()
	e.gw.onEvent = func(ev *prpv1.Event) {
		mu.Lock()
		defer mu.Unlock()
		if !synced[ev.GetSourceSeq()] {
			violations = append(violations, ev.GetSourceSeq())
		}
	}
	e.gw.mu.Unlock()
	e.start(func(c *Config) {
		c.OutboxSynced = func(recs []statedir.Record) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range recs {
				synced[r.SourceSeq] = true
			}
		}
	})
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	for i := 0; i < 200; i++ {
		prov.emit(ProviderEvent{Type: "item.delta", TurnID: "turn-1", ItemID: "i", Priority: P2, Payload: map[string]any{"n": float64(i)}})
	}
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations, "events sent before their outbox record was fsynced")
	assert.GreaterOrEqual(t, len(synced), 200)

	// Every received event is in the outbox file with the same bytes.
	ob, _, err := statedir.OpenOutbox(filepath.Join(e.stateDir, "runner"), 0)
	require.NoError(t, err)
	defer ob.Close()
	recs := ob.After(0)
	got := e.gw.distinct()
	require.Len(t, recs, len(got))
	for _, r := range recs {
		assert.JSONEq(t, string(r.Envelope), string(got[r.SourceSeq].raw))
		assert.Equal(t, string(r.Envelope), string(got[r.SourceSeq].raw))
	}
}

func TestR4_ReplayAfterReconnectSendsIdenticalBytes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "ok"})
	e.gw.waitEvent("run.terminal", 1)
	first := e.gw.distinct()
	produced := uint64(len(first))
	e.gw.ack(3)
	require.Equal(t, uint64(3), e.gw.ping(1).GetAckedSourceSeq())

	// The gateway drops the connection; runnerd reconnects with its lease and
	// resends everything after the acknowledged cursor.
	e.gw.dropConn()
	e.gw.waitConns(2)
	e.gw.mu.Lock()
	h2 := e.gw.hellos[1]
	e.gw.mu.Unlock()
	assert.Equal(t, prp.KindLease, h2.GetCredentialKind(), "reconnects use the connection lease")
	assert.Equal(t, uint64(3), h2.GetResume().GetAckedSourceSeq())
	assert.Equal(t, produced+1, h2.GetResume().GetNextSourceSeq())
	assert.Equal(t, uint64(2), h2.GetResume().GetLastControllerSeq())
	assert.Equal(t, "gpt-test", h2.GetSessionInput().GetProvider().GetModel(), "hello carries the session input for adoption")
	assert.Equal(t, int32(prov.pid), h2.GetProviderProcess().GetPid())

	e.gw.waitFor("replayed events", func() bool {
		n := 0
		for _, ev := range e.gw.events {
			if ev.conn == 2 {
				n++
			}
		}
		return uint64(n) == produced-3
	})
	e.gw.mu.Lock()
	for _, ev := range e.gw.events {
		if ev.conn != 2 {
			continue
		}
		seq := ev.ev.GetSourceSeq()
		assert.Greater(t, seq, uint64(3))
		assert.Equal(t, string(first[seq].raw), string(ev.raw), "seq %d replayed with different bytes", seq)
	}
	before := len(e.gw.events)
	e.gw.mu.Unlock()

	// An explicit Replay resends from the requested cursor, byte for byte.
	e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Replay{Replay: &prpv1.Replay{AfterSourceSeq: 5}}})
	e.gw.waitFor("replay", func() bool { return uint64(len(e.gw.events)-before) == produced-5 })
	e.gw.mu.Lock()
	for _, ev := range e.gw.events[before:] {
		assert.Equal(t, string(first[ev.ev.GetSourceSeq()].raw), string(ev.raw))
	}
	before = len(e.gw.events)
	e.gw.mu.Unlock()

	// A Replay with a marker (SPEC G4: the gateway relays a re-attachment
	// only from it) is answered by a Pong of the marker right before the
	// replayed events.
	assert.Contains(t, h2.GetFeatures(), prp.FeatureReplayMarker)
	e.gw.send(&prpv1.Frame{Kind: &prpv1.Frame_Replay{Replay: &prpv1.Replay{AfterSourceSeq: 5, Marker: 1<<63 | 7}}})
	e.gw.waitFor("marked replay", func() bool { return uint64(len(e.gw.events)-before) == produced-5 })
	e.gw.mu.Lock()
	at := -1
	for i, p := range e.gw.pongs {
		if p.GetNonce() == 1<<63|7 {
			at = e.gw.pongsAt[i]
		}
	}
	assert.Equal(t, before, at, "the marker's pong came right before the replayed events")
	assert.Equal(t, uint64(6), e.gw.events[before].ev.GetSourceSeq())
	e.gw.mu.Unlock()
}

func TestR4_AckTrimsAndRefusesOutOfRange(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	produced := e.gw.maxSeq()

	e.gw.ack(4)
	pong := e.gw.ping(1)
	assert.Equal(t, uint64(4), pong.GetAckedSourceSeq())
	assert.Equal(t, runnerstate.LifecycleReady, pong.GetLifecycle())
	assert.Equal(t, uint64(4), e.state().AckedSourceSeq, "the cursor is persisted")

	e.gw.ack(2) // behind the durable cursor
	assert.Equal(t, uint64(4), e.gw.ping(2).GetAckedSourceSeq())
	e.gw.ack(produced + 1) // beyond what was produced
	assert.Equal(t, uint64(4), e.gw.ping(3).GetAckedSourceSeq())

	ob, _, err := statedir.OpenOutbox(filepath.Join(e.stateDir, "runner"), e.state().AckedSourceSeq)
	require.NoError(t, err)
	assert.Equal(t, int(produced-4), ob.Len())
	require.NoError(t, ob.Close())

	e.gw.ack(produced)
	assert.Equal(t, produced, e.gw.ping(4).GetAckedSourceSeq())
	assert.Zero(t, e.gw.ping(5).GetOutboxBytes())
}

func TestR4_CommandDedupeFingerprintConflictSeqAndFencing(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 2}
	attach := cs.attach("c1")
	res := e.gw.command(attach)
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	e.gw.waitEvent("run.attached", 1)

	// Same id, same bytes: the stored result again, no second effect.
	again := e.gw.command(attach)
	assert.Equal(t, runnerstate.StatusCompleted, again.GetStatus())
	assert.Equal(t, res.GetResult().AsMap(), again.GetResult().AsMap())
	assert.Equal(t, uint64(1), again.GetControllerSeq())

	// Same id, other bytes.
	other := cs.next("c1", CmdRunAttach, map[string]any{"input": testInput(t), "extra": true})
	conflict := e.gw.command(other)
	assert.Equal(t, runnerstate.StatusRejected, conflict.GetStatus())
	assert.Equal(t, failure.CommandIDReused, conflict.GetCode())

	// A controller seq gap is refused and consumes nothing.
	gap := &prpv1.Command{CommandId: "c-gap", ControllerSeq: cs.seq + 5, Type: CmdTurnStart, RunId: "run-1", Attempt: 2,
		Payload: mustStruct(t, map[string]any{"text": "x"})}
	r := e.gw.command(gap)
	assert.Equal(t, failure.ControllerSeqNotContiguous, r.GetCode())
	assert.Contains(t, r.GetMessage(), fmt.Sprintf("expected %d", cs.seq+1))

	// A lower attempt of the run is fenced.
	cs.attempt = 1
	r = e.gw.command(cs.next("c-old", CmdTurnStart, map[string]any{"text": "x"}))
	assert.Equal(t, runnerstate.StatusRejected, r.GetStatus())
	assert.Equal(t, failure.RunnerAttemptFenced, r.GetCode())
	assert.Zero(t, e.prov.count(), "fenced command had no effect")

	// Unknown command types are rejected but journaled.
	cs.attempt = 2
	r = e.gw.command(cs.next("c-unknown", "session.fly", map[string]any{}))
	assert.Equal(t, failure.CommandUnsupported, r.GetCode())

	assert.Len(t, e.gw.eventsOf("run.attached"), 1)

	// A newer attempt (an executor that took the run over) resending the
	// same command id gets the stored result: no second effect.
	cs.attempt = 3
	taken := e.gw.command(cs.next("c1", CmdRunAttach, map[string]any{"input": testInput(t)}))
	assert.Equal(t, runnerstate.StatusCompleted, taken.GetStatus())
	assert.Equal(t, res.GetResult().AsMap(), taken.GetResult().AsMap())
	assert.Len(t, e.gw.eventsOf("run.attached"), 1)

	st := e.state()
	assert.Equal(t, cs.seq, st.LastControllerCommandSeq)
	assert.Equal(t, uint64(3), st.HighestAttempts["run-1"])
	assert.Equal(t, runnerstate.StatusRejected, st.ProcessedCommands["c-old"].Status)
}

// cutTurnStart leaves e's state as a runnerd killed between journaling a
// turn.start (pending) and its outcome leaves it, on a thread whose last
// known turn is turn-1; it returns the command to resend.
func cutTurnStart(t *testing.T, e *testEnv) *prpv1.Command {
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs.attach("c1")).GetStatus())
	require.Equal(t, ExitOK, p.stop(t))
	turn := cs.next("c2", CmdTurnStart, map[string]any{"text": "hi"})
	fp, err := Fingerprint(turn)
	require.NoError(t, err)
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st, err := store.Load()
	require.NoError(t, err)
	st.ProcessedCommands["c2"] = &runnerstate.CommandRecord{CommandID: "c2", ControllerSeq: 2, CommandType: CmdTurnStart,
		RunID: "run-1", Attempt: 1, Status: runnerstate.StatusPending, Fingerprint: fp, Code: failure.ExecutionIndeterminate}
	st.LastControllerCommandSeq = 2
	st.ProviderThreadID, st.LastTurnID = "thread-1", "turn-1"
	require.NoError(t, store.Save(st))
	return turn
}

// resendAfterRestart starts runnerd again on e's cut state, the provider's
// thread reading back lastTurn as its newest turn (with history), and
// resends the cut command turn; it returns the answer.
func resendAfterRestart(e *testEnv, turn *prpv1.Command, lastTurn string, history map[string]string) *prpv1.CommandResult {
	e.prov.mu.Lock()
	e.prov.lastTurn, e.prov.history = lastTurn, history
	e.prov.mu.Unlock()
	e.start(nil)
	e.gw.waitConns(2)
	return e.gw.command(turn)
}

func TestR8_ACutTurnStartTheProviderNeverRecordedRunsWhenResent(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	turn := cutTurnStart(t, e)
	res := resendAfterRestart(e, turn, "turn-1", nil) // the thread's newest turn is the known one
	assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, 1, e.prov.count(), "one provider: started to read the thread, then used for the turn")
	assert.Equal(t, 1, e.prov.last().turns, "the turn started once, when resent")
	assert.Equal(t, runnerstate.StatusCompleted, e.state().ProcessedCommands["c2"].Status)
}

func TestR8_ACutTurnStartWhoseTurnTheProviderRecordedIsAdoptedNotStartedAgain(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	turn := cutTurnStart(t, e)
	// A turn runnerd never heard of: the cut command's.
	res := resendAfterRestart(e, turn, "turn-2", map[string]string{"turn-2": "inProgress"})
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, "turn-2", res.GetResult().AsMap()["turnId"])
	prov := e.prov.last()
	assert.Zero(t, prov.turns, "no second turn/start")
	st := e.state()
	require.NotNil(t, st.ActiveTurn, "the provider's turn is retained")
	assert.Equal(t, "turn-2", st.ActiveTurn.TurnID)
	assert.Equal(t, "c2", st.ActiveTurn.CommandID)
	prov.finish(TurnResult{TurnID: "turn-2", Status: "completed", FinalMessage: "done"})
	e.gw.waitEvent("run.terminal", 1)
}

// journalExecution appends the command.executed a runnerd killed right
// after it journaled the execution of commandID left in the outbox.
func journalExecution(t *testing.T, e *testEnv, commandID string, payload map[string]any) {
	t.Helper()
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st, err := store.Load()
	require.NoError(t, err)
	ob, _, err := statedir.OpenOutbox(store.Dir, st.AckedSourceSeq)
	require.NoError(t, err)
	defer ob.Close()
	seq := max(st.NextSourceSeq, ob.LastSeq()+1)
	payload["commandId"], payload["commandType"] = commandID, CmdTurnStart
	p, err := structpb.NewStruct(payload)
	require.NoError(t, err)
	env, err := encodeEnvelope(&prpv1.Event{Schema: EventSchema, SourceInstanceId: st.Identity.RunnerInstanceID,
		SourceEventId: SourceEventID(st.Identity.RunnerInstanceID, seq), SourceSeq: seq, SourceKind: SourceKindRunner,
		RunId: "run-1", EventType: EventCommandExecuted, SchemaVersion: EventSchemaVersion, Payload: p})
	require.NoError(t, err)
	require.NoError(t, ob.Append(statedir.Record{SourceSeq: seq, EventType: EventCommandExecuted, Envelope: env}))
}

// SPEC R8, X1: runnerd reports each execution of a turn.start
// (command.executed) before it saves the command's outcome. Killed in
// between, the relaunched runnerd takes the journaled report as the
// outcome of the cut command — never runs it a second time — even when the
// provider's thread does not show the turn (the provider refused it, or
// lost it).
func TestR8_ACutTurnStartWhoseExecutionIsJournaledIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	t.Run("refused by the provider", func(t *testing.T) {
		e := newTestEnv(t)
		turn := cutTurnStart(t, e)
		journalExecution(t, e, "c2", map[string]any{"failed": true})
		res := resendAfterRestart(e, turn, "turn-1", nil) // the thread shows no new turn
		assert.Equal(t, runnerstate.StatusFailed, res.GetStatus(), res.GetMessage())
		assert.Equal(t, failure.ProviderTurnStartFailed, res.GetCode())
		if e.prov.count() > 0 {
			assert.Zero(t, e.prov.last().turns, "no turn/start")
		}
		assert.Len(t, e.gw.eventsOf(EventCommandExecuted), 1, "one execution reported")
	})
	t.Run("started a turn the thread lost", func(t *testing.T) {
		e := newTestEnv(t)
		turn := cutTurnStart(t, e)
		journalExecution(t, e, "c2", map[string]any{"turnId": "turn-2"})
		res := resendAfterRestart(e, turn, "turn-1", nil)
		require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
		assert.Equal(t, "turn-2", res.GetResult().AsMap()["turnId"])
		lost := e.gw.waitEvent(EventTurnLost, 1)
		assert.Equal(t, "turn-2", lost.GetTurnId(), "the turn is reconciled (missing: lost, retried under a new command id)")
		require.Equal(t, 1, e.prov.count())
		assert.Zero(t, e.prov.last().turns, "no second turn/start")
		assert.Len(t, e.gw.eventsOf(EventCommandExecuted), 1, "one execution reported")
	})
}

// SPEC R13, R7 (make test-chaos SEED=2, chaos-5-345): a host kill took
// the provider during a turn.start — runnerd journaled the failed execution
// (command.executed failed) — and runnerd with it before it saved the
// command's outcome. The relaunched runnerd settles the resent command as
// the live one answered it: failed with the provider's loss (retryable, the
// controller retries the turn under a new command id), not as a refusal
// (provider_turn_start_failed, permanent: the run failed for good after a
// single fault). The command still executed once.
func TestR13_ATurnStartWhoseProviderWasLostWithRunnerdStaysRetryable(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs.attach("c1")).GetStatus())
	e.prov.mu.Lock()
	e.prov.startTurnErr = &ProviderError{Code: failure.ProviderStdoutClosed, Message: "harness closed its stdout while still running"}
	e.prov.mu.Unlock()
	turn := cs.next("c2", CmdTurnStart, map[string]any{"text": "hi"})
	live := e.gw.command(turn)
	require.Equal(t, runnerstate.StatusFailed, live.GetStatus())
	require.Equal(t, failure.ProviderStdoutClosed, live.GetCode(), "the live answer: the provider's loss")
	e.gw.waitEvent(EventCommandExecuted, 1)
	require.Equal(t, ExitOK, p.stop(t))

	// Killed before the outcome was saved: the command is pending again.
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st, err := store.Load()
	require.NoError(t, err)
	rec := st.ProcessedCommands["c2"]
	require.NotNil(t, rec)
	rec.Reopen(runnerstate.StatusPending, failure.ExecutionIndeterminate, "", nil)
	require.NoError(t, store.Save(st))

	e.prov.mu.Lock()
	e.prov.startTurnErr = nil
	e.prov.mu.Unlock()
	res := resendAfterRestart(e, turn, "turn-1", nil)
	assert.Equal(t, runnerstate.StatusFailed, res.GetStatus(), res.GetMessage())
	assert.Equal(t, failure.ProviderStdoutClosed, res.GetCode(), "%s", res.GetMessage())
	assert.NotEqual(t, failure.Permanent, failure.Reason(res.GetCode()).Retry(), "the controller retries the run")
	assert.Zero(t, e.prov.last().turns, "no turn/start after the restart")
	reported := map[uint64]bool{} // the outbox replays the report after the reconnect
	for _, ev := range e.gw.eventsOf(EventCommandExecuted) {
		reported[ev.GetSourceSeq()] = true
	}
	assert.Len(t, reported, 1, "one execution reported")
}

// SPEC R9, X1 (make test-chaos SEED=1: chaos-5-176's turn.started stored
// under chaos-5-177 after 176's own run.terminal): a run's turn ended and
// runnerd journaled its run.terminal, but the controller had not persisted
// it when it retried the run under a new turn generation (its attempt
// ended first: the gateway's stream broke, its host was judged lost). The
// retry's turn.start reaches the runner that ended the run: it answers with
// the run's ended turn — the replayed run.terminal ends the run — and
// starts no second turn, whose events, labelled with a run already ended,
// would be filed under the scope's next run.
func TestR9_ATurnStartOfARunWhoseTerminalIsJournaledStartsNoSecondTurn(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "done"})
	e.gw.waitEvent("run.terminal", 1) // journaled and sent, never acknowledged

	retry := &cmdSeq{t: t, seq: cs.seq, runID: "run-1", attempt: 2}
	res := e.gw.command(retry.next("c-attach-g1", CmdRunAttach, map[string]any{"input": testInput(t)}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(retry.next("c-turn-g1", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), "%s: %s", res.GetCode(), res.GetMessage())
	assert.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue(), "the run's ended turn")
	prov.mu.Lock()
	assert.Equal(t, 1, prov.turns, "no second turn/start")
	prov.mu.Unlock()
	executed := map[uint64]bool{}
	for _, ev := range e.gw.eventsOf(EventCommandExecuted) {
		executed[ev.GetSourceSeq()] = true
	}
	assert.Len(t, executed, 1, "one execution reported")
	started := map[uint64]bool{}
	for _, ev := range e.gw.eventsOf("turn.started") {
		started[ev.GetSourceSeq()] = true
	}
	assert.Len(t, started, 1, "one turn started")
}

func TestR4_RestartFromSameStateDirReconcilesAndContinuesSeqs(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("run.terminal", 1)
	e.gw.ack(2)
	require.Equal(t, uint64(2), e.gw.ping(1).GetAckedSourceSeq())
	require.Equal(t, ExitOK, p.stop(t))
	last := e.gw.maxSeq()
	first := e.gw.distinct()

	// Simulate a crash during a turn: the state still records a provider
	// (long gone) and an active turn.
	store := &statedir.Store{Dir: filepath.Join(e.stateDir, "runner")}
	st0, err := store.Load()
	require.NoError(t, err)
	st0.ProviderProcess = &runnerstate.Process{PID: 1 << 22, PGID: 1 << 22, StartTicks: 1}
	st0.ActiveTurn = &runnerstate.Turn{TurnID: "turn-7", RunID: "run-1", Attempt: 1}
	st0.Lifecycle = runnerstate.LifecycleReady
	require.NoError(t, store.Save(st0))

	var f *os.File
	// Make the outbox tail torn, as after a crash mid-append.
	f, err = os.OpenFile(filepath.Join(e.stateDir, "runner", statedir.OutboxFile), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`0badc0de {"sourceSeq":999,"envel`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	e.gw.mu.Lock()
	nBefore := len(e.gw.events)
	e.gw.mu.Unlock()
	e.start(nil)
	e.gw.waitConns(2)
	rec := e.gw.waitEvent("runner.reconciled", 1)
	assert.Equal(t, last+1, rec.GetSourceSeq(), "seqs continue after a restart")
	assert.Equal(t, uint32(0), rec.GetPriority())
	assert.Equal(t, "same_durable_session_resumed", rec.GetPayload().AsMap()["outcome"])
	assert.Equal(t, "run-1", rec.GetRunId())
	// The provider of the previous process is reported gone; its turn,
	// which the restarted provider does not know, is lost (SPEC R7).
	ex := e.gw.waitEvent("harness.exited", 1)
	assert.Equal(t, failure.ProviderProcessLost, ex.GetPayload().AsMap()["code"])
	lost := e.gw.waitEvent(EventTurnLost, 1)
	assert.Equal(t, "turn-7", lost.GetTurnId())
	assert.Equal(t, "run-1", lost.GetRunId())
	assert.Equal(t, failure.ProviderProcessLost, lost.GetPayload().AsMap()["code"])

	// Unacknowledged events of the previous process are resent identically.
	e.gw.waitFor("resend", func() bool {
		for _, ev := range e.gw.events[nBefore:] {
			if ev.ev.GetSourceSeq() == last {
				return true
			}
		}
		return false
	})
	e.gw.mu.Lock()
	for _, ev := range e.gw.events[nBefore:] {
		if seq := ev.ev.GetSourceSeq(); seq <= last {
			assert.Greater(t, seq, uint64(2))
			assert.Equal(t, string(first[seq].raw), string(ev.raw))
		}
	}
	e.gw.mu.Unlock()
	st := e.state()
	assert.Equal(t, uint64(1), st.ReconnectCount)
	assert.Equal(t, "thread-1", st.ProviderThreadID)

	// The next turn resumes the persisted provider thread.
	res := e.gw.command(cs.next("c-turn2", CmdTurnStart, map[string]any{"text": "again"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	prov2 := e.prov.last()
	prov2.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, prov2.threadOpen)
	prov2.mu.Unlock()
}

// SPEC R7: a provider that exits under a live runnerd during a turn is
// restarted on the same thread and the turn reconciled from what the
// provider recorded.
func TestR7_ATurnWhoseProviderExitedIsReconciledOnARestartedProvider(t *testing.T) {
	t.Parallel()
	cases := []struct {
		recorded string // the provider's record of turn-1 ("": none)
		terminal string // the run.terminal's runTerminalState ("": none)
		lost     string // the turn.lost reconciliation ("": not lost)
		active   bool   // the turn is still active afterwards
	}{
		{recorded: "", lost: ReconcileMissing},
		{recorded: "completed", terminal: "succeeded"},
		{recorded: "failed", terminal: "failed"},
		{recorded: "interrupted", lost: "interrupted"},
		{recorded: "inProgress", active: true},
	}
	for _, tc := range cases {
		t.Run("recorded "+tc.recorded, func(t *testing.T) {
			e := newTestEnv(t)
			e.start(nil)
			if tc.recorded != "" {
				e.prov.history = map[string]string{"turn-1": tc.recorded}
			}
			cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
			prov := attachAndTurn(t, e, cs)
			prov.crash(failure.ProviderStdoutClosed)
			ex := e.gw.waitEvent("harness.exited", 1)
			assert.Equal(t, uint32(0), ex.GetPriority())
			assert.Equal(t, failure.ProviderStdoutClosed, ex.GetPayload().AsMap()["code"])
			e.gw.waitEvent("provider.restarting", 1)
			switch {
			case tc.terminal != "":
				term := e.gw.waitEvent("run.terminal", 1)
				assert.Equal(t, tc.terminal, term.GetPayload().AsMap()["runTerminalState"])
				assert.Equal(t, "recorded "+tc.recorded, term.GetPayload().AsMap()["finalMessage"])
			case tc.lost != "":
				lost := e.gw.waitEvent(EventTurnLost, 1)
				assert.Equal(t, tc.lost, lost.GetPayload().AsMap()["reconciliation"])
				assert.Equal(t, failure.ProviderStdoutClosed, lost.GetPayload().AsMap()["code"])
				assert.Equal(t, "run-1", lost.GetRunId())
			}
			e.gw.ping(1) // the loop has finished handling the exit
			terminals := 0
			if tc.terminal != "" {
				terminals = 1
			}
			assert.Len(t, e.gw.eventsOf("run.terminal"), terminals)
			require.Eventually(t, func() bool { st := e.state(); return (st.ActiveTurn != nil) == tc.active && st.ProviderProcess != nil },
				5*time.Second, 10*time.Millisecond, "the turn's state is saved; the restarted provider runs")
			assert.Equal(t, 2, e.prov.count())
			next := e.prov.last()
			next.mu.Lock()
			assert.Equal(t, []string{"thread-1"}, next.threadOpen, "the thread was resumed")
			assert.Equal(t, 0, next.turns, "no turn/start on the restarted provider")
			next.mu.Unlock()
			prov.mu.Lock()
			assert.Equal(t, 1, prov.turns, "turn/start was sent once")
			prov.mu.Unlock()
		})
	}
}

// SPEC R7: a provider that exited just before a turn.start reached it
// (it refuses the turn with its exit error: nothing was sent) does not fail
// the turn: runnerd handles the exit and starts the turn once on a
// replacement that resumes the thread.
func TestR7_ATurnStartRefusedByAProviderThatHadJustExitedRunsOnAReplacement(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	var once sync.Once
	e.prov.mu.Lock()
	e.prov.beforeStartTurn = func() {
		once.Do(func() { e.prov.last().crash(failure.ProviderProcessExited) })
	}
	e.prov.mu.Unlock()
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	res := e.gw.command(cs.attach("c-attach"))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(cs.next("c-turn1", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), "%s: %s", res.GetCode(), res.GetMessage())
	require.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue())
	ex := e.gw.waitEvent("harness.exited", 1)
	assert.Equal(t, failure.ProviderProcessExited, ex.GetPayload().AsMap()["code"])
	require.Equal(t, 2, e.prov.count(), "a replacement provider")
	next := e.prov.last()
	next.mu.Lock()
	assert.Equal(t, []string{"thread-1"}, next.threadOpen, "the replacement resumed the thread")
	assert.Equal(t, 1, next.turns, "the turn started once, on the replacement")
	next.mu.Unlock()
	assert.Empty(t, e.gw.eventsOf(EventTurnLost))
}

// SPEC R7: a controller that took the run over resends the turn.start of a
// lost turn (same command id, higher attempt): it gets the stored answer and
// the loss is announced again, so it ends the attempt too; nothing restarts.
func TestR7_AResentTurnStartOfALostTurnAnnouncesTheLossAgain(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.crash(failure.ProviderProcessExited)
	first := e.gw.waitEvent(EventTurnLost, 1)

	takeover := &cmdSeq{t: t, seq: cs.seq, runID: "run-1", attempt: 2}
	res := e.gw.command(takeover.next("c-attach", CmdRunAttach, map[string]any{"input": testInput(t)}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(takeover.next("c-turn1", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), "the stored answer")
	again := e.gw.waitEvent(EventTurnLost, 2)
	assert.Equal(t, "turn-1", again.GetTurnId())
	assert.Equal(t, first.GetPayload().AsMap(), again.GetPayload().AsMap())
	assert.Greater(t, again.GetSourceSeq(), first.GetSourceSeq())
	next := e.prov.last()
	next.mu.Lock()
	assert.Equal(t, 0, next.turns, "no second turn/start")
	next.mu.Unlock()
	assert.Empty(t, e.gw.eventsOf("run.terminal"))
}

func TestR1_ProviderStartFailureFailsTheCommand(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	e.prov.mu.Lock()
	e.prov.failNext = &ProviderError{Code: "provider_spawn_failed", Message: "no such file"}
	e.prov.mu.Unlock()
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs.attach("c1")).GetStatus())
	res := e.gw.command(cs.next("c2", CmdTurnStart, map[string]any{"text": "x"}))
	assert.Equal(t, runnerstate.StatusFailed, res.GetStatus())
	assert.Equal(t, "provider_spawn_failed", res.GetCode())
	// Without an attached run a turn is refused.
	e2 := &cmdSeq{t: t, seq: cs.seq, runID: "run-2", attempt: 1}
	res = e.gw.command(e2.next("c3", CmdTurnStart, map[string]any{"text": "x"}))
	assert.Equal(t, failure.RunNotAttached, res.GetCode())
}

func TestR4_IdleTimeoutSuspendsAndExits(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	// 1 s: at 300 ms a loaded box (load 50) let the runner go idle
	// between the run.attach and the turn.start.
	p := e.start(func(c *Config) { c.IdleTimeout = time.Second })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	time.Sleep(1200 * time.Millisecond) // an active turn is not idle
	select {
	case <-p.done:
		t.Fatal("runner exited during an active turn")
	default:
	}
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed"})
	e.gw.waitEvent("runner.suspended", 1)
	e.gw.ack(e.gw.maxSeq())
	assert.Equal(t, ExitOK, p.wait(t, 5*time.Second))
	assert.Equal(t, runnerstate.LifecycleSuspended, e.state().Lifecycle)
	assert.Equal(t, "idle_timeout", e.state().LifecycleReason)
	assert.Empty(t, e.gw.eventsOf("runner.stopped"), "an idle exit is a suspension, not a stop")
}

func TestR4_ReconnectGraceExpiryExits3(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(func(c *Config) { c.ReconnectGrace = 500 * time.Millisecond })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	e.gw.setRefuse(true)
	e.gw.dropConn()
	assert.Equal(t, ExitRecoverable, p.wait(t, 10*time.Second))
	st := e.state()
	assert.Equal(t, runnerstate.LifecycleRecoverableFailure, st.Lifecycle)
	assert.Equal(t, "transport_reconnect_deadline_exceeded", st.LifecycleReason)
	prov.mu.Lock()
	assert.True(t, prov.closed, "provider stopped")
	prov.mu.Unlock()
}

func TestR4_ReplayedTicketIsRefused(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	cfg := e.config(nil)
	// Use the ticket once.
	p := e.start(func(c *Config) { c.Ticket = cfg.Ticket })
	e.gw.waitConns(1)
	require.Equal(t, ExitOK, p.stop(t))
	// A second runner with the same (spent) ticket is refused and exits 4.
	p2 := e.start(func(c *Config) { c.Ticket = cfg.Ticket })
	assert.Equal(t, ExitCredentialRefused, p2.wait(t, 10*time.Second))
	assert.Equal(t, failure.RunnerTicketReplayed, e.state().LifecycleReason)
}

func TestR4_StateFilesArePrivateAndStateIsWellFormed(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	p := e.start(nil)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs.attach("c1")).GetStatus())
	require.Equal(t, ExitOK, p.stop(t))
	for _, path := range []string{e.stateDir, filepath.Join(e.stateDir, "runner")} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), path)
	}
	for _, name := range []string{runnerstate.StateFile, statedir.OutboxFile} {
		fi, err := os.Stat(filepath.Join(e.stateDir, "runner", name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	b, err := os.ReadFile(filepath.Join(e.stateDir, "runner", runnerstate.StateFile))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, "tether.runner.durable.state.v1", m["schema"])
	assert.Equal(t, map[string]any{"runnerInstanceId": tRunner, "environmentLeaseId": "envlease-1",
		"normalizedSessionId": tSess, "sessionScope": tScope}, m["identity"])
	for _, k := range []string{"lifecycle", "nextSourceSeq", "ackedSourceSeq", "lastControllerCommandSeq",
		"reconnectCount", "runnerProcess", "currentRun", "highestAttempts", "processedCommands", "sessionInput"} {
		assert.Contains(t, m, k)
	}
	assert.NotContains(t, string(b), "secret")
	assert.NotContains(t, string(b), string(e.config(nil).Ticket.Claims))

	// A different runner identity on the same state dir fails closed.
	p2 := e.start(func(c *Config) { c.RunnerID = "someone-else" })
	assert.Equal(t, ExitError, p2.wait(t, 5*time.Second))
	assert.Contains(t, p2.err.Error(), "runner_state_identity_mismatch")
}

// A runner launched for one provider profile refuses a run that names
// another (the gateway chose the driver by the profile, runnerd checks
// the run agrees), before any provider starts; its own profile reaches
// the driver with the scope root.
func TestR10_RunnerRefusesARunOfAnotherProviderProfile(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(func(c *Config) { c.Provider = "opencode" })
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e.gw.command(cs.attach("c1")).GetStatus())
	res := e.gw.command(cs.next("c2", CmdTurnStart, map[string]any{"text": "x"}))
	assert.Equal(t, runnerstate.StatusFailed, res.GetStatus())
	assert.Equal(t, failure.ProviderConfigInvalid, res.GetCode())
	assert.Equal(t, 0, e.prov.count(), "no provider was started")

	e2 := newTestEnv(t)
	e2.start(nil)
	cs = &cmdSeq{t: t, runID: "run-1", attempt: 1}
	require.Equal(t, runnerstate.StatusCompleted, e2.gw.command(cs.attach("c1")).GetStatus())
	require.Equal(t, runnerstate.StatusCompleted, e2.gw.command(cs.next("c2", CmdTurnStart, map[string]any{"text": "x"})).GetStatus())
	e2.prov.mu.Lock()
	cfg := e2.prov.configs[0]
	e2.prov.mu.Unlock()
	assert.Equal(t, "codex", cfg.Kind)
	assert.Equal(t, e2.stateDir, cfg.StateDir)
}

// SPEC R8, X1: an event names the run it belongs to. A turn's events are
// its turn.start's run's: after a runnerd restart that cut a new run's
// run.attach and turn.start short, the attached run is still the previous
// one while the provider host replays the new run's turn (a chaos run
// filed that turn's items under the previous run and its run.terminal
// under the new one: the run never ended).
func TestR8_EventsOfATurnAreLabelledWithTheRunThatStartedIt(t *testing.T) {
	prev := &runnerstate.RunRef{RunID: "run-57"}
	turn := &runnerstate.Turn{TurnID: "turn-60", RunID: "run-58"}
	for _, tc := range []struct {
		name          string
		runID, turnID string
		active        *runnerstate.Turn
		current       *runnerstate.RunRef
		want          string
	}{
		{"named", "run-9", "turn-60", turn, prev, "run-9"},
		{"the active turn's event", "", "turn-60", turn, prev, "run-58"},
		{"another turn's event", "", "turn-59", turn, prev, "run-57"},
		{"not a turn's event", "", "", turn, prev, "run-57"},
		{"no active turn", "", "turn-60", nil, prev, "run-57"},
		{"nothing attached", "", "turn-60", nil, nil, ""},
	} {
		require.Equal(t, tc.want, eventRun(tc.runID, tc.turnID, tc.active, tc.current), tc.name)
	}
}
