package prp

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// TestTypedPayloadsAreThePreviousReleasesObjects: a typed payload is the
// JSON object the previous release wrote for its event (numbers as JSON
// numbers, zero counts and always-written flags present), and such an
// object, as stored, reads back into the typed message.
func TestTypedPayloadsAreThePreviousReleasesObjects(t *testing.T) {
	t.Parallel()
	term := &prpv1.RunTerminal{
		TurnTerminalState: "completed", RunTerminalState: "succeeded", FinalMessage: "done",
		Usage: &prpv1.TurnUsage{RunDelta: &prpv1.UsageCounters{
			InputTokens: proto.Float64(12), CachedInputTokens: proto.Float64(0), OutputTokens: proto.Float64(3),
		}},
		ProviderTurnId: "turn-1", ProviderThreadId: "thread-1",
		Artifacts: []*prpv1.ResultArtifact{{Kind: ArtifactKindPlan, Ref: "# plan"}},
	}
	s, err := Payload(term)
	require.NoError(t, err)
	raw, err := protojson.Marshal(s)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, map[string]any{
		"turnTerminalState": "completed", "runTerminalState": "succeeded", "finalMessage": "done",
		"usage":          map[string]any{"runDelta": map[string]any{"inputTokens": 12.0, "cachedInputTokens": 0.0, "outputTokens": 3.0}},
		"providerTurnId": "turn-1", "providerThreadId": "thread-1",
		"artifacts": []any{map[string]any{"kind": ArtifactKindPlan, "ref": "# plan"}},
	}, got)

	// The previous release's run.attached and turn.lost, as stored.
	old, err := structpb.NewStruct(map[string]any{
		"runId": "run-1", "attempt": 2.0, "runnerInstanceId": "ri", "providerRunning": false, "unknownLater": "x",
	})
	require.NoError(t, err)
	var att prpv1.RunAttached
	require.NoError(t, DecodePayload(&prpv1.Event{Payload: old}, &att))
	require.Equal(t, uint32(2), att.GetAttempt())
	require.False(t, att.GetProviderRunning())
	require.NotNil(t, att.ProviderRunning)
	var lost prpv1.TurnLost
	require.NoError(t, DecodePayload(&prpv1.Event{}, &lost), "no payload is an empty one")
}

// payloadObject is msg's payload as the JSON object stored.
func payloadObject(t *testing.T, msg proto.Message) map[string]any {
	t.Helper()
	s, err := Payload(msg)
	require.NoError(t, err)
	raw, err := protojson.Marshal(s)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	return got
}

// TestRuntimeRequestPayloadsAreThePreviousReleasesObjects: the typed
// runtime request and tool call payloads are the objects the previous
// release's drivers wrote (empty turn and item ids present, replayAllowed
// false present, the semantic_tool key as it was), and such objects read
// back into the typed messages.
func TestRuntimeRequestPayloadsAreThePreviousReleasesObjects(t *testing.T) {
	t.Parallel()
	req := &prpv1.RuntimeRequest{
		Schema: RuntimeRequestSchema, RequestKind: "runtime", RequestId: "7", Status: "expired",
		TurnId: proto.String(""), ItemId: proto.String("call_q"), Prompt: "Which color?", Type: "input",
		Input: &prpv1.QuestionSet{Schema: "tether.question_set.v1", Questions: []*prpv1.Question{{
			Id: "color", Prompt: "Which color?", Required: true, AnswerMode: "single_select",
			Options: []*prpv1.QuestionOption{{Id: "option-1", Label: "Red"}},
		}}},
	}
	expired := &prpv1.RuntimeRequestEvent{
		RequestId: "7", RequestKind: "runtime", RequestType: "input", Kind: "user_input",
		TurnId: proto.String(""), ItemId: proto.String("call_q"),
		Reason: "provider_process_lost", ReplayAllowed: proto.Bool(false), Request: req,
	}
	want := map[string]any{
		"requestId": "7", "requestKind": "runtime", "requestType": "input", "kind": "user_input", "turnId": "", "itemId": "call_q",
		"reason": "provider_process_lost", "replayAllowed": false,
		"request": map[string]any{
			"schema": RuntimeRequestSchema, "requestKind": "runtime", "requestId": "7", "status": "expired",
			"turnId": "", "itemId": "call_q", "prompt": "Which color?", "type": "input",
			"input": map[string]any{"schema": "tether.question_set.v1", "questions": []any{map[string]any{
				"id": "color", "prompt": "Which color?", "required": true, "answerMode": "single_select",
				"options": []any{map[string]any{"id": "option-1", "label": "Red"}},
			}}},
		},
	}
	require.Equal(t, want, payloadObject(t, expired))
	var back prpv1.RuntimeRequestEvent
	old, err := structpb.NewStruct(want)
	require.NoError(t, err)
	require.NoError(t, DecodePayload(&prpv1.Event{Payload: old}, &back))
	require.True(t, proto.Equal(expired, &back))

	answers, err := structpb.NewList([]any{"red"})
	require.NoError(t, err)
	resolved := &prpv1.RuntimeRequestEvent{
		RequestId: "7", RequestKind: "runtime", RequestType: "input", Kind: "user_input", TurnId: proto.String("t"), ItemId: proto.String("i"),
		Resolution: &prpv1.RuntimeResolution{Answers: map[string]*structpb.ListValue{"color": answers}},
	}
	require.Equal(t, map[string]any{
		"requestId": "7", "requestKind": "runtime", "requestType": "input", "kind": "user_input", "turnId": "t", "itemId": "i",
		"resolution": map[string]any{"answers": map[string]any{"color": []any{"red"}}},
	}, payloadObject(t, resolved))

	items := []*prpv1.ToolContentItem{{Type: "inputText", Text: proto.String("42")}}
	result := &prpv1.ToolCallEvent{
		CallId: "call_1", RequestId: "3", Tool: "mock_lookup", Success: proto.Bool(false), ContentItems: items, Source: "driver",
		Code: "semantic_tool_timeout",
		SemanticTool: &prpv1.SemanticTool{Schema: "tether.prp.semantic_tool.v1", Phase: "result", CallId: "call_1", Tool: "mock_lookup",
			Success: proto.Bool(false), ContentItems: items},
	}
	item := map[string]any{"type": "inputText", "text": "42"}
	require.Equal(t, map[string]any{
		"callId": "call_1", "requestId": "3", "tool": "mock_lookup", "success": false, "contentItems": []any{item}, "source": "driver",
		"code": "semantic_tool_timeout",
		"semantic_tool": map[string]any{"schema": "tether.prp.semantic_tool.v1", "phase": "result", "callId": "call_1", "tool": "mock_lookup",
			"success": false, "contentItems": []any{item}},
	}, payloadObject(t, result))
}
