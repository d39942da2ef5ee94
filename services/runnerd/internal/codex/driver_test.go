package codex

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// R2: the codex app-server JSON-RPC driver.

func TestR2_InitializeTimeout(t *testing.T) {
	t.Parallel()
	// The stub writes its pid and then never answers initialize. On a
	// loaded machine the (race-built) stub may not even get as far as its
	// pid file within a short startup bound: such an attempt still has to
	// fail with the timeout, and the next one gets a doubled bound, until
	// an attempt shows which process Start had to clean up.
	for timeout := 300 * time.Millisecond; ; timeout *= 2 {
		require.Less(t, timeout, 2*time.Minute, "the stub never started")
		pidFile := filepath.Join(t.TempDir(), "pid")
		cfg := stubConfig(t, "init_hang", stubPIDFileEnv+"="+pidFile)
		cfg.StartupTimeout = timeout
		start := time.Now()
		s, err := Start(context.Background(), cfg, nil)
		require.Nil(t, s)
		assert.Equal(t, failure.ProviderInitializeTimeout, CodeOf(err))
		assert.GreaterOrEqual(t, time.Since(start), timeout)
		b, rerr := os.ReadFile(pidFile)
		if os.IsNotExist(rerr) {
			continue
		}
		require.NoError(t, rerr)
		var pid int
		require.NoError(t, json.Unmarshal(b, &pid))
		assert.False(t, alive(pid), "nothing is left running after a failed Start")
		assert.False(t, procgroup.Alive(pid))
		return
	}
}

func TestR2_InitializeProtocolError(t *testing.T) {
	t.Parallel()
	for _, sc := range []string{"init_error", "init_bad", "init_null"} {
		t.Run(sc, func(t *testing.T) {
			_, err := Start(context.Background(), stubConfig(t, sc), nil)
			assert.Equal(t, failure.ProviderInitializeProtocolError, CodeOf(err), "%v", err)
		})
	}
}

func TestR2_HandshakeAndRequestShapes(t *testing.T) {
	t.Parallel()
	record := filepath.Join(t.TempDir(), "wire.jsonl")
	s, _ := startSession(t, stubConfig(t, "echo", stubRecordEnv+"="+record))
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "hi")
	require.NoError(t, err)
	waitTurn(t, s)
	closeSession(t, s)

	f, err := os.Open(record)
	require.NoError(t, err)
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		lines = append(lines, m)
	}
	require.GreaterOrEqual(t, len(lines), 4)
	for _, m := range lines {
		assert.Equal(t, "2.0", m["jsonrpc"])
	}
	assert.Equal(t, map[string]any{
		"jsonrpc": "2.0", "id": float64(1), "method": "initialize",
		"params": map[string]any{
			"clientInfo":   map[string]any{"name": "tether-runnerd", "title": "tether runnerd", "version": ClientVersion},
			"capabilities": map[string]any{"experimentalApi": true},
		},
	}, lines[0])
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "method": "initialized"}, lines[1])
	assert.Equal(t, "thread/start", lines[2]["method"])
	assert.Equal(t, float64(2), lines[2]["id"])
	params := lines[2]["params"].(map[string]any)
	assert.Equal(t, map[string]any{"cwd": s.cfg.Dir, "approvalPolicy": "never", "sandbox": "read-only", "model": "stub-model"}, params)
	assert.Equal(t, map[string]any{
		"jsonrpc": "2.0", "id": float64(3), "method": "turn/start",
		"params": map[string]any{"threadId": "thr-1", "input": []any{map[string]any{"type": "text", "text": "hi"}}},
	}, lines[3])
}

func TestR2_ThreadStartOmitsEmptySettings(t *testing.T) {
	t.Parallel()
	record := filepath.Join(t.TempDir(), "wire.jsonl")
	cfg := stubConfig(t, "echo", stubRecordEnv+"="+record)
	cfg.Model, cfg.ApprovalPolicy, cfg.Sandbox = "", "", ""
	s, rec := startSession(t, cfg)
	openStubThread(t, s)
	closeSession(t, s)
	b, err := os.ReadFile(record)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &m))
	assert.Equal(t, map[string]any{"cwd": cfg.Dir}, m["params"])
	// The model comes from the thread/start result when the config has none.
	assert.Equal(t, "stub-model", rec.ofType("session.started")[0].Payload["model"])
}

func TestR2_NotificationBeforeResponseKeepsOrder(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	id, resumed, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	assert.Equal(t, "thr-1", id)
	assert.False(t, resumed)
	// configWarning came before the thread/start response: its event is
	// already emitted, and before session.started.
	assert.Equal(t, []string{"provider.notice.recorded", "session.started"}, rec.types())
	started := rec.ofType("session.started")[0]
	assert.Equal(t, PriorityP0, started.Priority)
	assert.Equal(t, map[string]any{"threadId": "thr-1", "providerSessionId": "sess-1", "resumed": false, "model": "stub-model"}, started.Payload)

	// turn/started arriving before the turn/start response is emitted, in
	// order, before StartTurn returns.
	turnID, err := s.StartTurn(context.Background(), "[turn-started-first] hi")
	require.NoError(t, err)
	types := rec.types()
	require.GreaterOrEqual(t, len(types), 4)
	assert.Equal(t, []string{"provider.notice.recorded", "turn.started"}, types[2:4])
	assert.Equal(t, turnID, rec.ofType("turn.started")[0].TurnID)
	res := waitTurn(t, s)
	assert.Equal(t, TurnCompleted, res.Status)
	assert.Equal(t, turnID, res.TurnID)
}

func TestR2_TurnEventsAndResult(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	n := len(rec.events())
	turnID, err := s.StartTurn(context.Background(), "hello there [cmd]")
	require.NoError(t, err)
	assert.Equal(t, "turn-1", turnID)
	res := waitTurn(t, s)
	assert.Equal(t, TurnResult{
		TurnID: turnID, Status: TurnCompleted, FinalMessage: "ECHO: hello there [cmd]",
		Usage: Usage{InputTokens: 100, CachedInputTokens: 10, OutputTokens: 5},
		// The thread's first turn: its total is its usage.
		Total: &Usage{InputTokens: 100, CachedInputTokens: 10, OutputTokens: 5},
	}, res)

	evs := rec.events()[n:]
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
		if e.Type != "provider.notice.recorded" {
			assert.Equal(t, turnID, e.TurnID, e.Type)
		}
	}
	assert.Equal(t, []string{
		"provider.notice.recorded", "turn.started",
		"item.started", "item.completed", // userMessage
		"item.started", "item.delta", "item.delta", "item.delta", "item.delta", "item.completed", // agentMessage
		"item.started", "item.delta", "item.completed", // commandExecution
		"usage.reported", "turn.completed",
	}, types)
	assert.Equal(t, map[string]any{"providerTurnId": turnID}, evs[1].Payload)
	assert.Equal(t, PriorityP0, evs[1].Priority)
	assert.Equal(t, map[string]any{"kind": "userMessage", "itemId": "user_001"}, evs[2].Payload)
	assert.Equal(t, map[string]any{"kind": "agentMessage", "itemId": "msg_002"}, evs[4].Payload)
	assert.Equal(t, "msg_002", evs[5].ItemID)
	assert.Equal(t, map[string]any{"kind": "agentMessage", "delta": "ECHO: "}, evs[5].Payload)
	assert.Equal(t, PriorityP2, evs[5].Priority)
	assert.Equal(t, map[string]any{"kind": "agentMessage", "itemId": "msg_002", "text": "ECHO: hello there [cmd]"}, evs[9].Payload)
	assert.Equal(t, map[string]any{"kind": "commandExecution", "itemId": "call_9", "status": "inProgress"}, evs[10].Payload)
	assert.Equal(t, map[string]any{"kind": "commandExecution", "delta": "hello\n"}, evs[11].Payload)
	assert.Equal(t, map[string]any{"kind": "commandExecution", "itemId": "call_9", "status": "completed", "exitCode": int64(0)}, evs[12].Payload)
	assert.Equal(t, map[string]any{
		"total": map[string]any{"inputTokens": int64(100), "cachedInputTokens": int64(10), "outputTokens": int64(5), "totalTokens": int64(105)},
		"last":  map[string]any{"inputTokens": int64(100), "cachedInputTokens": int64(10), "outputTokens": int64(5), "totalTokens": int64(105)},
	}, evs[13].Payload)
	done := evs[14]
	assert.Equal(t, PriorityP0, done.Priority)
	assert.Equal(t, TurnCompleted, done.Payload["status"])
	assert.Equal(t, "ECHO: hello there [cmd]", done.Payload["finalMessage"])
	assert.NotContains(t, done.Payload, "error")

	// A second turn on the same thread: usage is this turn's growth only.
	_, err = s.StartTurn(context.Background(), "second")
	require.NoError(t, err)
	res = waitTurn(t, s)
	assert.Equal(t, "turn-2", res.TurnID)
	assert.Equal(t, Usage{InputTokens: 100, CachedInputTokens: 10, OutputTokens: 5}, res.Usage)
	assert.Equal(t, "ECHO: second", res.FinalMessage)
}

func TestR2_UncompletedItemsAreNotTheFinalMessage(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "[orphan] x")
	require.NoError(t, err)
	res := waitTurn(t, s)
	assert.Equal(t, "ECHO: [orphan] x", res.FinalMessage)
}

func TestR2_StartTurnRequiresThreadAndIdleTurn(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "echo"))
	_, err := s.StartTurn(context.Background(), "x")
	assert.Equal(t, failure.ProviderThreadNotOpen, CodeOf(err))
	assert.Equal(t, failure.ProviderThreadNotOpen, CodeOf(s.Steer(context.Background(), "t", "x")))
	openStubThread(t, s)
	_, _, err = s.OpenThread(context.Background(), "")
	assert.Equal(t, failure.ProviderThreadAlreadyOpen, CodeOf(err))
	turnID, err := s.StartTurn(context.Background(), "[slow] long")
	require.NoError(t, err)
	_, err = s.StartTurn(context.Background(), "y")
	assert.Equal(t, failure.ProviderTurnActive, CodeOf(err))
	require.NoError(t, s.Interrupt(context.Background(), turnID))
	assert.Equal(t, TurnInterrupted, waitTurn(t, s).Status)
}

func TestR2_ServerRequestIDZeroIsAnswered(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[approval] make a dir")
	require.NoError(t, err)

	// id 0 is a real id: the approval becomes runtime request "0" and waits.
	created := rec.waitFor(t, isType("runtime_request.created"))
	assert.Equal(t, "0", created.Payload["requestId"])
	assert.Equal(t, KindCommandApproval, created.Payload["kind"])
	assert.Equal(t, turnID, created.TurnID)
	assert.Equal(t, "call_1", created.ItemID)
	assert.Equal(t, []string{"0"}, s.PendingRequests())
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "decline"}))
	require.NoError(t, err)

	// The dynamic tool call waits too (no handler): answer it.
	rec.waitFor(t, isType("semantic_tool.input"))
	assert.Equal(t, []string{"call_2"}, s.PendingToolCalls())
	_, err = s.AnswerToolCall(context.Background(), "call_2", turnID, TextOutput(false, "no lookup here"))
	require.NoError(t, err)

	res := waitTurn(t, s)
	assert.Equal(t, TurnCompleted, res.Status)

	var answers []map[string]any
	for _, e := range rec.ofType("provider.notice.recorded") {
		if msg, _ := e.Payload["message"].(string); strings.HasPrefix(msg, "answer:") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(msg, "answer:")), &m))
			answers = append(answers, m)
		}
	}
	require.Len(t, answers, 3)
	assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": float64(0), "result": map[string]any{"decision": "decline"}}, answers[0])
	assert.Equal(t, float64(1), answers[1]["id"])
	assert.Equal(t, false, answers[1]["result"].(map[string]any)["success"])
	assert.Equal(t, float64(2), answers[2]["id"])
	assert.Equal(t, float64(-32601), answers[2]["error"].(map[string]any)["code"])

	var diags []Event
	for _, e := range rec.ofType("harness.diagnostic") {
		if e.Payload["code"] == failure.ProviderServerRequestUnsupported {
			diags = append(diags, e)
		}
	}
	require.Len(t, diags, 1)
	assert.Equal(t, "currentTime/read", diags[0].Payload["method"])
	assert.Equal(t, "2", diags[0].Payload["requestId"])
	assert.Equal(t, "rpc_error", diags[0].Payload["answer"])
	declined := rec.index(func(e Event) bool { return e.Type == "item.completed" && e.ItemID == "call_1" })
	require.GreaterOrEqual(t, declined, 0)
	assert.Equal(t, "declined", rec.events()[declined].Payload["status"])
}

func TestR2_OversizeFrameFailsSession(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "oversize")
	// The subject is the frame bound: thread/start must not time out first
	// while a loaded machine moves the 5 MiB line.
	cfg.RequestTimeout = 5 * time.Minute
	s, _ := startSession(t, cfg)
	_, _, err := s.OpenThread(context.Background(), "")
	require.Error(t, err)
	assert.Equal(t, "provider_frame_too_large: harness stdout frame exceeded 4194304 bytes", err.Error())
	waitExited(t, s)
	assert.Equal(t, "provider_frame_too_large: harness stdout frame exceeded 4194304 bytes", s.ExitErr().Error())
}

func TestR2_MalformedFrameFailsSession(t *testing.T) {
	t.Parallel()
	s, _ := startSession(t, stubConfig(t, "malformed"))
	_, _, err := s.OpenThread(context.Background(), "")
	assert.Equal(t, failure.ProviderTransportFailed, CodeOf(err))
	waitExited(t, s)
	assert.Equal(t, failure.ProviderTransportFailed, CodeOf(s.ExitErr()))
}

func TestR2_SteerAndInterrupt(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "warm up")
	require.NoError(t, err)
	first := waitTurn(t, s)

	turnID, err := s.StartTurn(context.Background(), "[slow] answer slowly")
	require.NoError(t, err)
	rec.waitFor(t, func(e Event) bool { return e.Type == "item.delta" && e.TurnID == turnID })
	err = s.Steer(context.Background(), "not-the-active-turn", "x")
	assert.Equal(t, failure.ProviderSteerFailed, CodeOf(err))
	assert.Contains(t, err.Error(), "expected active turn id")
	require.NoError(t, s.Steer(context.Background(), turnID, "steer: bananas"))
	res := waitTurn(t, s)
	assert.Equal(t, TurnCompleted, res.Status)
	assert.Equal(t, turnID, res.TurnID)
	assert.Equal(t, "ECHO: steer: bananas", res.FinalMessage, "the abandoned streaming message is dropped")
	// The unchanged re-emitted usage after the aborted stream adds nothing.
	assert.Equal(t, Usage{InputTokens: 200, OutputTokens: 7}, res.Usage)
	assert.NotEqual(t, first.TurnID, res.TurnID)

	turnID, err = s.StartTurn(context.Background(), "[slow] to be interrupted")
	require.NoError(t, err)
	rec.waitFor(t, func(e Event) bool { return e.Type == "item.delta" && e.TurnID == turnID })
	require.NoError(t, s.Interrupt(context.Background(), turnID))
	res = waitTurn(t, s)
	res.Total = nil // the thread total is TestR2_TurnEventsAndResult's
	assert.Equal(t, TurnResult{TurnID: turnID, Status: TurnInterrupted}, res)
	ev := rec.ofType("turn.interrupted")
	require.Len(t, ev, 1)
	assert.Equal(t, TurnInterrupted, ev[0].Payload["status"])
	assert.Equal(t, PriorityP0, ev[0].Priority)
}

func TestR2_RequestTimeout(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "echo")
	cfg.RequestTimeout = 150 * time.Millisecond
	s, rec := startSession(t, cfg)
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[slow] [deaf]")
	require.NoError(t, err)
	rec.waitFor(t, func(e Event) bool { return e.Type == "item.delta" && e.TurnID == turnID })
	err = s.Interrupt(context.Background(), turnID)
	assert.Equal(t, failure.ProviderRequestTimeout, CodeOf(err))
	// A timed-out request does not break the session.
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	assert.Nil(t, s.ExitErr())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.StartTurn(ctx, "cancelled")
	assert.ErrorIs(t, err, context.Canceled)
}

func TestR2_FailedTurn(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[fail] please")
	require.NoError(t, err)
	res := waitTurn(t, s)
	res.Total = nil // the thread total is TestR2_TurnEventsAndResult's
	assert.Equal(t, TurnResult{
		TurnID: turnID, Status: TurnFailed, ErrorCode: failure.ProviderTurnFailed,
		ErrorMessage: "stream disconnected before completion: mock failure",
	}, res)
	var provErr *Event
	for _, e := range rec.ofType("harness.diagnostic") {
		if e.Payload["source"] == "provider" {
			provErr = &e
		}
	}
	require.NotNil(t, provErr)
	assert.Equal(t, turnID, provErr.TurnID)
	assert.Equal(t, map[string]any{
		"source": "provider", "code": failure.ProviderError, "message": "stream disconnected before completion: mock failure",
		"willRetry": false, "providerErrorCode": "other",
	}, provErr.Payload)
	failed := rec.ofType("turn.failed")
	require.Len(t, failed, 1)
	assert.Equal(t, map[string]any{
		"code": failure.ProviderTurnFailed, "message": "stream disconnected before completion: mock failure", "providerErrorCode": "other",
	}, failed[0].Payload["error"])
}

func TestR2_UnknownTurnAndForeignThreadIgnored(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[unknown-turn] [foreign] hi")
	require.NoError(t, err)
	res := waitTurn(t, s)
	assert.Equal(t, turnID, res.TurnID)
	assert.Equal(t, TurnCompleted, res.Status)
	select {
	case extra := <-s.TurnDone():
		t.Fatalf("unexpected extra turn result %+v", extra)
	default:
	}
	codes := map[string]Event{}
	for _, e := range rec.ofType("harness.diagnostic") {
		codes[e.Payload["code"].(string)] = e
	}
	require.Contains(t, codes, failure.ProviderUnknownTurn)
	assert.Equal(t, "turn-bogus", codes[failure.ProviderUnknownTurn].TurnID)
	require.Contains(t, codes, failure.ProviderThreadMismatch)
	assert.Equal(t, -1, rec.index(func(e Event) bool { return e.ItemID == "msg_foreign" }))
	assert.Len(t, rec.ofType("turn.completed"), 1)
}

func TestR2_ResumeThread(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	id, resumed, err := s.OpenThread(context.Background(), "thr-7")
	require.NoError(t, err)
	assert.Equal(t, "thr-7", id)
	assert.True(t, resumed)
	assert.Equal(t, []string{"provider.notice.recorded", "session.started"}, rec.types())
	assert.Equal(t, map[string]any{"threadId": "thr-7", "providerSessionId": "thr-7", "resumed": true, "model": "stub-model"},
		rec.ofType("session.started")[0].Payload)
	// The first usage update after a resume replays the persisted total for
	// an earlier turn; the new turn is charged only its own growth.
	_, err = s.StartTurn(context.Background(), "after resume")
	require.NoError(t, err)
	res := waitTurn(t, s)
	assert.Equal(t, Usage{InputTokens: 100, CachedInputTokens: 10, OutputTokens: 5}, res.Usage)
	assert.Len(t, rec.ofType("usage.reported"), 1)
}

func TestR2_ResumeErrors(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	_, _, err := s.OpenThread(context.Background(), "thr-mismatch")
	assert.Equal(t, failure.ProviderThreadResumeMismatch, CodeOf(err))
	_, _, err = s.OpenThread(context.Background(), "thr-missing")
	assert.Equal(t, failure.ProviderThreadResumeFailed, CodeOf(err))
	assert.Contains(t, err.Error(), "no rollout found")
	assert.Empty(t, rec.ofType("session.started"))
	_, err = s.StartTurn(context.Background(), "x")
	assert.Equal(t, failure.ProviderThreadNotOpen, CodeOf(err))
	// The session is still usable.
	id, resumed, err := s.OpenThread(context.Background(), "thr-ok")
	require.NoError(t, err)
	assert.Equal(t, "thr-ok", id)
	assert.True(t, resumed)
}

func TestR2_UsageGrowthAccounting(t *testing.T) {
	t.Parallel()
	s := &Session{reported: map[string]bool{}, emitFn: func(Event) {}, log: quietLogger()}
	s.threadID = "T"
	upd := func(turn string, total, last [3]int64) {
		mk := func(v [3]int64) *codexwire.TokenCounts {
			return &codexwire.TokenCounts{InputTokens: v[0], CachedInputTokens: v[1], OutputTokens: v[2]}
		}
		s.onTokenUsage(turn, mk(total), mk(last))
	}
	// Fresh thread: no baseline, `last` is the growth.
	s.turn = &turnState{id: "u1"}
	upd("u1", [3]int64{6568, 0, 5}, [3]int64{6568, 0, 5})
	assert.Equal(t, Usage{InputTokens: 6568, OutputTokens: 5}, s.turn.usage)
	// Steered turn (transcript-steer): unchanged re-emit, then a new request.
	s.turn = &turnState{id: "u2"}
	upd("u2", [3]int64{6568, 0, 5}, [3]int64{6568, 0, 5})
	upd("u2", [3]int64{13318, 0, 10}, [3]int64{6750, 0, 5})
	assert.Equal(t, Usage{InputTokens: 6750, OutputTokens: 5}, s.turn.usage)
	// Tool turn: two requests, both count.
	s.turn = &turnState{id: "u3"}
	upd("u3", [3]int64{20046, 0, 33}, [3]int64{6728, 0, 23})
	upd("u3", [3]int64{26904, 0, 41}, [3]int64{6858, 0, 8})
	assert.Equal(t, Usage{InputTokens: 6728 + 6858, OutputTokens: 31}, s.turn.usage)
}
