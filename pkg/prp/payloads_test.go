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
