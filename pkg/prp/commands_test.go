package prp

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func legacyCommand(t *testing.T, typ string, payload map[string]any) *prpv1.Command {
	t.Helper()
	p, err := structpb.NewStruct(payload)
	require.NoError(t, err)
	return &prpv1.Command{Type: typ, Payload: p}
}

// TestCommandBodiesReadFromBothForms: a typed body and the previous
// release's Struct payload of the same fields read alike, and Downgrade
// turns the one into the other.
func TestCommandBodiesReadFromBothForms(t *testing.T) {
	t.Parallel()
	steer := &prpv1.TurnSteer{Text: "more", ExpectedTurnId: "t-1", CorrelationId: "c"}
	typed := NewCommand(steer)
	require.Equal(t, CommandTurnSteer, typed.GetType())
	legacy := legacyCommand(t, CommandTurnSteer, map[string]any{"text": "more", "expectedTurnId": "t-1", "correlationId": "c", "unknown": 1})
	for _, c := range []*prpv1.Command{typed, legacy} {
		b, err := TurnSteerOf(c)
		require.NoError(t, err)
		require.True(t, proto.Equal(steer, b), "%v", b)
	}
	down, err := Downgrade(typed)
	require.NoError(t, err)
	require.Nil(t, down.GetBody())
	require.Equal(t, "t-1", down.GetPayload().GetFields()["expectedTurnId"].GetStringValue())
	require.NotNil(t, typed.GetTurnSteer(), "Downgrade leaves its argument alone")

	// An older peer's numeric request id reads as its decimal form.
	rr, err := RequestResolveOf(legacyCommand(t, CommandRequestResolve, map[string]any{"requestId": 7, "resolution": map[string]any{"decision": "accept"}}))
	require.NoError(t, err)
	require.Equal(t, "7", rr.GetRequestId())
	require.Equal(t, "accept", rr.GetResolution().GetFields()["decision"].GetStringValue())

	// tool.result: an absent success is true; an empty text is an item.
	tr, err := ToolResultOf(legacyCommand(t, CommandToolResult, map[string]any{"callId": "k", "text": ""}))
	require.NoError(t, err)
	require.Nil(t, tr.Success)
	require.NotNil(t, tr.Text)

	// A payload of the wrong shape is an error; no body and no payload is
	// an empty body.
	_, err = TurnStartOf(legacyCommand(t, CommandTurnStart, map[string]any{"text": 5}))
	require.Error(t, err)
	ts, err := TurnStartOf(&prpv1.Command{Type: CommandTurnStart})
	require.NoError(t, err)
	require.Empty(t, ts.GetText())
}
