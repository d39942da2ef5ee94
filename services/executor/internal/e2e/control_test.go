package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/stack"
)

func TestE9_SteeringThroughAnotherReplicaReachesTheActiveTurnOnce(t *testing.T) {
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "100"}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h.submit("steer", "steer", slowTurn)
	h.waitForDelta(ctx, h.client, "steer")

	// Ask a replica that does not drive the run: it forwards to the one that does.
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err := h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	other := h.clientFor("executor-2")
	state, err := other.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "steer"})
	require.NoError(t, err)
	require.Equal(t, "available", state.GetDisposition())
	require.NotEmpty(t, state.GetActiveTurnId())

	resp, err := other.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "steer", Message: "also mention bananas", CorrelationId: "comment-1"})
	require.NoError(t, err)
	require.Equal(t, state.GetActiveTurnId(), resp.GetTurnId())

	run := h.waitState(ctx, h.client, "steer", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Contains(t, run.GetResult().GetFinalMessage(), "also mention bananas", "the turn answered both inputs")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/steer"), "the provider was steered once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"))

	// After the turn: no active turn to steer, and no pending request to resolve.
	_, err = h.client.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "steer", Message: "too late"})
	require.Equal(t, "steering_temporarily_unavailable", failure.CodeOf(err))
	res, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
	_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "steer", RequestId: "0", TurnId: resp.GetTurnId(), Resolution: res})
	require.Equal(t, "native_session_not_active", failure.CodeOf(err))
}

func TestE8_ARuntimeRequestIsResolvedOnceThroughTheExecutor(t *testing.T) {
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// "[shell]" makes the fake ask for a command approval in this turn.
	h.submit("approve", "approve", "[shell] make a directory")
	var requestID, turnID string
	wctx, stop := context.WithCancel(ctx)
	stream, err := h.client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: "approve"})
	require.NoError(t, err)
	for requestID == "" {
		m, err := stream.Recv()
		require.NoError(t, err)
		if m.GetEvent().GetEventType() == "runtime_request.created" {
			p := m.GetEvent().GetPayload().AsMap()
			requestID, _ = p["requestId"].(string)
			turnID, _ = p["turnId"].(string)
		}
	}
	stop()
	require.NotEmpty(t, turnID)

	accept, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
	decline, _ := structpb.NewStruct(map[string]any{"decision": "decline"})
	req := &executorv1.ResolveRuntimeRequestRequest{RunId: "approve", RequestId: requestID, TurnId: turnID, Resolution: accept}
	first, err := h.client.ResolveRuntimeRequest(ctx, req)
	require.NoError(t, err)
	require.NotEmpty(t, first.GetCommandId())

	run := h.waitState(ctx, h.client, "approve", executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.NotEmpty(t, run.GetResult().GetFinalMessage())
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "approval-response:accept"), "answered once")
	// The request is settled: a late answer is refused before any dispatch.
	_, err = h.client.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "approve", RequestId: requestID, TurnId: turnID, Resolution: decline})
	require.Error(t, err)
	require.Zero(t, countLines(t, h.st.CallLog(), "approval-response:decline"))
}

func TestE10_AConfigurationChangeReplacesTheWarmProviderOnceAndKeepsTheConversation(t *testing.T) {
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	submit := func(id, model, prompt string) {
		in := h.submitInput("config", prompt)
		in.Provider.Model = model
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: in})
		require.NoError(t, err)
	}
	submit("cfg-1", "model-a", "first turn")
	submit("cfg-2", "model-a", "second turn, same configuration")
	submit("cfg-3", "model-b", "third turn, another model")
	var last []*executorv1.WatchRunResponse
	for _, id := range []string{"cfg-1", "cfg-2", "cfg-3"} {
		last = h.watch(ctx, id, 0, nil)
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get(id).GetState(), "%v", h.get(id).GetFailure())
	}
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "process-start"), "exactly one replacement provider")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/resume"), "the replacement resumed the same thread")
	require.Contains(t, h.get("cfg-3").GetResult().GetFinalMessage(), "4 earlier messages", "the conversation survived")
	closed := 0
	for _, m := range last {
		if m.GetEvent().GetEventType() == "session.closed" {
			closed++
			require.Equal(t, "warm native session configuration changed", m.GetEvent().GetPayload().AsMap()["reason"])
		}
	}
	require.Equal(t, 1, closed)
	require.NotEqual(t, h.get("cfg-2").GetRunnerProcess().GetPid(), h.get("cfg-3").GetRunnerProcess().GetPid())
}
