package codex

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// answers returns the wire answers the stub echoed back as warnings.
func stubAnswers(t *testing.T, rec *recorder) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range rec.ofType("provider.notice.recorded") {
		if msg, _ := e.Payload["message"].(string); strings.HasPrefix(msg, "answer:") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(msg, "answer:")), &m))
			out = append(out, m)
		}
	}
	return out
}

func TestR2_ApprovalBecomesRuntimeRequestAndIsResolved(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[approval] make a dir")
	require.NoError(t, err)
	created := rec.waitFor(t, isType("runtime_request.created"))
	p := created.Payload
	assert.Equal(t, "0", p["requestId"])
	assert.Equal(t, "runtime", p["requestKind"])
	assert.Equal(t, "approval", p["requestType"])
	assert.Equal(t, "item/commandExecution/requestApproval", p["method"])
	assert.Equal(t, "thr-1", p["threadId"])
	assert.Equal(t, turnID, p["turnId"])
	assert.Equal(t, "call_1", p["itemId"])
	assert.Equal(t, "/bin/bash -lc 'touch x'", p["command"])
	assert.Equal(t, []any{"accept", "acceptForSession", "decline", "cancel"}, p["availableDecisions"])
	req := p["request"].(map[string]any)
	assert.Equal(t, RuntimeRequestSchema, req["schema"])
	assert.Equal(t, "approval", req["type"])
	assert.Equal(t, "pending", req["status"])

	// Bad resolutions change nothing.
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "maybe"}))
	assert.Equal(t, failure.RuntimeRequestResolutionInvalid, CodeOf(err))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"answers": map[string]any{}}))
	assert.Equal(t, failure.RuntimeRequestResolutionInvalid, CodeOf(err))
	_, err = s.ResolveRequest(context.Background(), "7", resolution(map[string]any{"decision": "accept"}))
	assert.Equal(t, failure.RuntimeRequestNotPending, CodeOf(err))

	out, err := s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "acceptForSession"}))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"decision": "acceptForSession"}, bodyMap(out)["resolution"])
	// A second resolution of the same request is refused.
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "accept"}))
	assert.Equal(t, failure.RuntimeRequestNotPending, CodeOf(err))

	rec.waitFor(t, isType("semantic_tool.input"))
	_, err = s.AnswerToolCall(context.Background(), "call_2", "", TextOutput(true, "a=1"))
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)

	resolved := rec.ofType("runtime_request.resolved")
	require.Len(t, resolved, 1)
	assert.Equal(t, map[string]any{"decision": "acceptForSession"}, resolved[0].Payload["resolution"])
	assert.Equal(t, "0", resolved[0].Payload["requestId"])
	ans := stubAnswers(t, rec)
	assert.Equal(t, map[string]any{"decision": "acceptForSession"}, ans[0]["result"])
	// resolved precedes anything the provider did after the answer.
	types := rec.types()
	iRes := indexOf(types, "runtime_request.resolved")
	iTool := indexOf(types, "semantic_tool.input")
	assert.Less(t, iRes, iTool)
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func TestR2_UserInputRequestAnswered(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[input] ask me")
	require.NoError(t, err)
	created := rec.waitFor(t, isType("runtime_request.created"))
	p := created.Payload
	assert.Equal(t, KindUserInput, p["kind"])
	assert.Equal(t, "input", p["requestType"])
	assert.Equal(t, "call_q", p["itemId"])
	assert.Equal(t, true, p["isBlocking"])
	require.Len(t, p["questions"], 2)
	req := p["request"].(map[string]any)
	assert.Equal(t, "input", req["type"])
	assert.Equal(t, turnID, req["turnId"])
	assert.Equal(t, "Which color?", req["prompt"])
	set := req["input"].(map[string]any)
	assert.Equal(t, QuestionSetSchema, set["schema"])
	qs := set["questions"].([]any)
	assert.Equal(t, "single_select", qs[0].(map[string]any)["answerMode"])
	assert.Equal(t, "text", qs[1].(map[string]any)["answerMode"])

	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"answers": map[string]any{"shoe": "x"}}))
	assert.Equal(t, failure.RuntimeRequestResolutionInvalid, CodeOf(err))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "accept"}))
	assert.Equal(t, failure.RuntimeRequestResolutionInvalid, CodeOf(err))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"answers": map[string]any{
		"color": []any{"red"}, "name": "Ada",
	}}))
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	ans := stubAnswers(t, rec)
	require.Len(t, ans, 1)
	assert.Equal(t, map[string]any{"answers": map[string]any{
		"color": map[string]any{"answers": []any{"red"}},
		"name":  map[string]any{"answers": []any{"Ada"}},
	}}, ans[0]["result"])
	res := rec.ofType("runtime_request.resolved")
	require.Len(t, res, 1)
	assert.Equal(t, map[string]any{"answers": map[string]any{"color": []any{"red"}, "name": []any{"Ada"}}}, res[0].Payload["resolution"])
}

func TestR2_RuntimeRequestsExpireOnProviderLoss(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "[approval-then-exit]")
	require.NoError(t, err)
	res := waitTurn(t, s)
	assert.Equal(t, TurnFailed, res.Status)
	assert.Equal(t, failure.ProviderProcessExited, res.ErrorCode)
	expired := rec.ofType("runtime_request.expired")
	require.Len(t, expired, 2)
	for i, want := range []string{"0", "1"} {
		p := expired[i].Payload
		assert.Equal(t, want, p["requestId"])
		assert.Equal(t, failure.ProviderProcessLost, p["reason"])
		assert.Equal(t, false, p["replayAllowed"])
		assert.Equal(t, "expired", p["request"].(map[string]any)["status"])
	}
	assert.Equal(t, "input", expired[1].Payload["requestType"])
	// Expiry precedes the failed turn.
	types := rec.types()
	assert.Less(t, indexOf(types, "runtime_request.expired"), indexOf(types, "turn.failed"))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "accept"}))
	assert.Equal(t, failure.RuntimeRequestNotPending, CodeOf(err))
}

func TestR2_RuntimeRequestWithdrawnOrTurnEnded(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "[withdraw]")
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	c := rec.ofType("runtime_request.cancelled")
	require.Len(t, c, 1)
	assert.Equal(t, failure.ProviderResolved, c[0].Payload["reason"])

	_, err = s.StartTurn(context.Background(), "[approval-then-complete]")
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	e := rec.ofType("runtime_request.expired")
	require.Len(t, e, 1)
	assert.Equal(t, failure.TurnEnded, e[0].Payload["reason"])
	assert.Empty(t, s.PendingRequests())
}

func TestR2_DynamicToolCallBuiltinHandler(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "echo")
	cfg.ToolHandler = StubToolHandler
	cfg.DynamicTools = []provider.DynamicTool{{Type: "function", Name: "mock_lookup", Description: "d", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	s, rec := startSession(t, cfg)
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[tool-auto]")
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	in := rec.ofType("semantic_tool.input")
	require.Len(t, in, 1)
	assert.Equal(t, "call_auto", in[0].Payload["callId"])
	assert.Equal(t, "mock_lookup", in[0].Payload["tool"])
	assert.Equal(t, turnID, in[0].TurnID)
	assert.Equal(t, "input", in[0].Payload["semantic_tool"].(map[string]any)["phase"])
	require.Len(t, rec.ofType("tool.execution.started"), 1)
	out := rec.ofType("semantic_tool.result")
	require.Len(t, out, 1)
	assert.Equal(t, true, out[0].Payload["success"])
	assert.Equal(t, "builtin", out[0].Payload["source"])
	done := rec.ofType("tool.execution.completed")
	require.Len(t, done, 1)
	assert.Equal(t, true, done[0].Payload["success"])
	ans := stubAnswers(t, rec)
	require.Len(t, ans, 1)
	assert.Equal(t, map[string]any{"success": true, "contentItems": []any{map[string]any{"type": "inputText", "text": "lookup(alpha) = 42"}}}, ans[0]["result"])
}

func TestR2_ToolCallOfAnotherTurnIsRevoked(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "echo")
	cfg.ToolHandler = StubToolHandler
	s, rec := startSession(t, cfg)
	openStubThread(t, s)
	_, err := s.StartTurn(context.Background(), "[stale-tool]")
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	out := rec.ofType("semantic_tool.result")
	require.Len(t, out, 1)
	assert.Equal(t, failure.NativeToolAuthorityEpochRevoked, out[0].Payload["code"])
	assert.Equal(t, false, out[0].Payload["success"])
	ans := stubAnswers(t, rec)
	require.Len(t, ans, 1)
	r := ans[0]["result"].(map[string]any)
	assert.Equal(t, false, r["success"])
	text := r["contentItems"].([]any)[0].(map[string]any)["text"].(string)
	assert.True(t, strings.HasPrefix(text, failure.NativeToolAuthorityEpochRevoked+":"), text)
}

func TestR2_AnswerToolCallFromAnotherTurnIsRevoked(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[approval]")
	require.NoError(t, err)
	rec.waitFor(t, isType("runtime_request.created"))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "accept"}))
	require.NoError(t, err)
	rec.waitFor(t, isType("semantic_tool.input"))
	_, err = s.AnswerToolCall(context.Background(), "call_2", "turn-of-an-old-run", TextOutput(true, "x"))
	assert.Equal(t, failure.NativeToolAuthorityEpochRevoked, CodeOf(err))
	_, err = s.AnswerToolCall(context.Background(), "call_2", turnID, ToolOutput{Success: true, ContentItems: []*prpv1.ToolContentItem{{Type: "video"}}})
	assert.Equal(t, failure.ToolResultInvalid, CodeOf(err))
	_, err = s.AnswerToolCall(context.Background(), "nope", turnID, TextOutput(true, "x"))
	assert.Equal(t, failure.ToolCallNotPending, CodeOf(err))
	_, err = s.AnswerToolCall(context.Background(), "call_2", turnID, TextOutput(true, "x"))
	require.NoError(t, err)
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	res := rec.ofType("semantic_tool.result")
	require.Len(t, res, 1)
	assert.Equal(t, "controller", res[0].Payload["source"])
}

func TestR2_ReconcilePersistedTurn(t *testing.T) {
	t.Parallel()
	s, rec := startSession(t, stubConfig(t, "echo"))
	_, resumed, err := s.OpenThread(context.Background(), "thr-hist")
	require.NoError(t, err)
	require.True(t, resumed)
	ctx := context.Background()

	r, err := s.ReconcileTurn(ctx, "turn-old-1")
	require.NoError(t, err)
	assert.Equal(t, ReconcileTerminalized, r.Outcome)
	assert.Equal(t, "old answer", r.FinalMessage)
	tr := waitTurn(t, s)
	assert.Equal(t, TurnResult{TurnID: "turn-old-1", Status: TurnCompleted, FinalMessage: "old answer"}, tr)

	r, err = s.ReconcileTurn(ctx, "turn-old-2")
	require.NoError(t, err)
	assert.Equal(t, ReconcileTerminalized, r.Outcome)
	assert.Equal(t, TurnInterrupted, waitTurn(t, s).Status)

	r, err = s.ReconcileTurn(ctx, "turn-old-3")
	require.NoError(t, err)
	tr = waitTurn(t, s)
	assert.Equal(t, TurnFailed, tr.Status)
	assert.Equal(t, "model failed", tr.ErrorMessage)

	_, err = s.ReconcileTurn(ctx, "turn-never")
	assert.Equal(t, failure.ProviderTurnMissing, CodeOf(err))

	r, err = s.ReconcileTurn(ctx, "turn-old-4")
	require.NoError(t, err)
	assert.Equal(t, ReconcileRetained, r.Outcome)
	_, err = s.StartTurn(ctx, "x")
	assert.Equal(t, failure.ProviderTurnActive, CodeOf(err))

	var reconciled []string
	for _, e := range rec.events() {
		if e.Payload["reconciled"] == true {
			reconciled = append(reconciled, e.Type+":"+e.TurnID)
		}
	}
	assert.Equal(t, []string{"turn.completed:turn-old-1", "turn.interrupted:turn-old-2", "turn.failed:turn-old-3"}, reconciled)
}

func TestR2_ThreadStartSendsDynamicTools(t *testing.T) {
	t.Parallel()
	record := t.TempDir() + "/rec.jsonl"
	cfg := stubConfig(t, "echo", stubRecordEnv+"="+record)
	cfg.DynamicTools = []provider.DynamicTool{{Type: "function", Name: "mock_lookup", Description: "d", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	s, _ := startSession(t, cfg)
	openStubThread(t, s)
	lines := readRecord(t, record)
	var start map[string]any
	for _, l := range lines {
		if l["method"] == "thread/start" {
			start = l
		}
	}
	require.NotNil(t, start)
	assert.Equal(t, []any{map[string]any{"type": "function", "name": "mock_lookup", "description": "d", "inputSchema": map[string]any{"type": "object"}}}, start["params"].(map[string]any)["dynamicTools"])
}

func TestR2_StartTurnWithCollaborationMode(t *testing.T) {
	t.Parallel()
	record := t.TempDir() + "/rec.jsonl"
	s, _ := startSession(t, stubConfig(t, "echo", stubRecordEnv+"="+record))
	openStubThread(t, s)
	_, err := s.StartTurnWith(context.Background(), "hi", TurnOptions{CollaborationMode: "plan"})
	require.NoError(t, err)
	waitTurn(t, s)
	var start map[string]any
	for _, l := range readRecord(t, record) {
		if l["method"] == "turn/start" {
			start = l
		}
	}
	require.NotNil(t, start)
	assert.Equal(t, map[string]any{"mode": "plan", "settings": map[string]any{"model": "stub-model", "developer_instructions": nil}},
		start["params"].(map[string]any)["collaborationMode"])
}

// SPEC R8: a dynamic tool call waits for its answer at most ToolTimeout;
// then the driver answers it failed with semantic_tool_timeout and the turn
// goes on.
func TestR8_AnUnansweredToolCallIsAnsweredFailedAfterTheToolTimeout(t *testing.T) {
	t.Parallel()
	cfg := stubConfig(t, "echo")
	cfg.ToolTimeout = 50 * time.Millisecond
	s, rec := startSession(t, cfg)
	openStubThread(t, s)
	turnID, err := s.StartTurn(context.Background(), "[approval]")
	require.NoError(t, err)
	rec.waitFor(t, isType("runtime_request.created"))
	_, err = s.ResolveRequest(context.Background(), "0", resolution(map[string]any{"decision": "accept"}))
	require.NoError(t, err)
	rec.waitFor(t, isType("semantic_tool.input"))
	rec.waitFor(t, isType("semantic_tool.result"))
	res := rec.ofType("semantic_tool.result")
	require.Len(t, res, 1)
	assert.Equal(t, "driver", res[0].Payload["source"])
	assert.Equal(t, failure.SemanticToolTimeout, res[0].Payload["code"])
	assert.Equal(t, false, res[0].Payload["success"])
	// tool.execution.completed is emitted after the result, not with it.
	rec.waitFor(t, isType("tool.execution.completed"))
	done := rec.ofType("tool.execution.completed")
	require.Len(t, done, 1)
	assert.Equal(t, failure.SemanticToolTimeout, done[0].Payload["code"])
	assert.Equal(t, TurnCompleted, waitTurn(t, s).Status)
	_, err = s.AnswerToolCall(context.Background(), "call_2", turnID, TextOutput(true, "late"))
	assert.Equal(t, failure.ToolCallNotPending, CodeOf(err), "a late answer has no effect")
	var answer map[string]any
	for _, a := range stubAnswers(t, rec) {
		if r, ok := a["result"].(map[string]any); ok && r["contentItems"] != nil {
			answer = r
		}
	}
	require.NotNil(t, answer)
	assert.Equal(t, false, answer["success"])
	text := answer["contentItems"].([]any)[0].(map[string]any)["text"].(string)
	assert.True(t, strings.HasPrefix(text, failure.SemanticToolTimeout+":"), text)
}
