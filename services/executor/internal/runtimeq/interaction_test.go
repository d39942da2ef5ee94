package runtimeq

import (
	"google.golang.org/protobuf/types/known/structpb"

	"testing"

	"github.com/stretchr/testify/require"
)

func TestE4_MergeAnswersChecksOptionsAndCompleteness(t *testing.T) {
	qs := []Question{
		{ID: "color", Required: true, SelectionMode: SelectionSingle, Options: []Option{{ID: "red"}, {ID: "blue"}}},
		{ID: "note", Required: true, SelectionMode: SelectionSingle, Options: []Option{{ID: TextOptionID, FreeText: true}}},
		{ID: "tags", SelectionMode: SelectionMulti, Options: []Option{{ID: "x"}, {ID: "y"}}},
	}
	full := []Answer{{QuestionID: "color", OptionIDs: []string{"red"}}, {QuestionID: "note", OptionIDs: []string{TextOptionID}, Text: "hi"}}
	tests := []struct {
		name     string
		kind     string
		prior    []Answer
		answers  []Answer
		wantErr  bool
		complete bool
		merged   int
	}{
		{"complete", "ask_user_questions", nil, full, false, true, 2},
		{"multi", "ask_user_questions", nil, append(full, Answer{QuestionID: "tags", OptionIDs: []string{"x", "y"}}), false, true, 3},
		{"wrong option", "ask_user_questions", nil, []Answer{{QuestionID: "color", OptionIDs: []string{"green"}}}, true, false, 0},
		{"unknown question", "ask_user_questions", nil, []Answer{{QuestionID: "size", OptionIDs: []string{"red"}}}, true, false, 0},
		{"two options for a single select", "ask_user_questions", nil, []Answer{{QuestionID: "color", OptionIDs: []string{"red", "blue"}}}, true, false, 0},
		{"free text without text", "ask_user_questions", nil, []Answer{full[0], {QuestionID: "note", OptionIDs: []string{TextOptionID}}}, true, false, 0},
		{"missing required", "ask_user_questions", nil, full[:1], true, false, 0},
		{"partial item verdicts", "request_item_verdicts", nil, full[:1], false, false, 1},
		{"item verdicts completed later", "request_item_verdicts", full[:1], full[1:], false, true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			merged, complete, err := MergeAnswers(tc.kind, qs, tc.prior, tc.answers)
			if tc.wantErr {
				var ae *AnswerError
				require.ErrorAs(t, err, &ae)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.complete, complete)
			require.Len(t, merged, tc.merged)
		})
	}
}

func TestE4_FromToolCallOpensAResponseWakeInteraction(t *testing.T) {
	ev := mapEvent{EventType: EventToolInput, RunID: "run-1", Payload: map[string]any{
		"callId": "call-1", "tool": "tether_ask_user",
		"arguments": map[string]any{"title": "T", "questions": []any{map[string]any{"id": "q", "prompt": "P"}}},
	}}
	in, lost, ok := FromEvent(ev.ev())
	require.True(t, ok)
	require.False(t, lost)
	require.Equal(t, "tether-ask-user:v1:run-1:call-1", in.IdempotencyKey)
	require.Equal(t, ContinuationResponseWake, in.ContinuationPolicy)
	require.Equal(t, TextOptionID, in.Payload.Questions[0].Options[0].ID, "a question without options takes free text")

	ev.Payload["tool"] = "other_tool"
	_, _, ok = FromEvent(ev.ev())
	require.False(t, ok)
}

// mapEvent is an event with its payload as a JSON object a test edits.
type mapEvent struct {
	EventType string
	RunID     string
	Payload   map[string]any
}

// ev is e as the rules take it.
func (e mapEvent) ev() Event {
	p, err := structpb.NewStruct(e.Payload)
	if err != nil {
		panic(err)
	}
	return Event{EventType: e.EventType, RunID: e.RunID, Payload: p}
}
