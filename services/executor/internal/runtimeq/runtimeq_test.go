package runtimeq

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

const (
	seedRunID     = "00000000-0000-4000-8000-000000000001"
	seedRequestID = "elicitation-1"
)

// seedQuestionSet is the seed's question set, as decoded JSON.
const seedQuestionSet = `{
	"schema": "paperclip.question_set.v1",
	"title": "Configure deployment",
	"description": "These answers are required before work can continue.",
	"submitLabel": "Continue",
	"questions": [
		{"id": "region", "prompt": "Which region?", "required": true, "answerMode": "single_select",
		 "options": [{"id": "us", "label": "US"}, {"id": "eu", "label": "Europe"}]},
		{"id": "replicas", "prompt": "How many replicas?", "required": true, "answerMode": "text",
		 "textValidation": {"inputType": "integer", "minimum": 1}}
	]
}`

func decode(t *testing.T, src string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(src), &m))
	return m
}

// expiredEvent is the seed's expired input request event for reason.
func expiredEvent(t *testing.T, reason string) mapEvent {
	t.Helper()
	return mapEvent{
		EventType: EventExpired,
		RunID:     seedRunID,
		Payload: map[string]any{
			"requestId":     seedRequestID,
			"requestKind":   "runtime",
			"requestType":   "input",
			"reason":        reason,
			"replayAllowed": false,
			"request": map[string]any{
				"schema":      "paperclip.runtime_request.v2",
				"requestKind": "runtime",
				"requestId":   seedRequestID,
				"type":        "input",
				"status":      "pending",
				"prompt":      "Configure deployment",
				"turnId":      "turn-1",
				"itemId":      "item-1",
				"input":       decode(t, seedQuestionSet),
			},
		},
	}
}

// terminalEvent is the seed's negative-case event: no top-level request
// fields, only reason and replayAllowed.
func terminalEvent(t *testing.T, eventType, reason string, replayAllowed bool) mapEvent {
	t.Helper()
	return mapEvent{
		EventType: eventType,
		RunID:     seedRunID,
		Payload: map[string]any{
			"reason":        reason,
			"replayAllowed": replayAllowed,
			"request": map[string]any{
				"schema":      "paperclip.runtime_request.v2",
				"requestKind": "runtime",
				"requestId":   seedRequestID,
				"type":        "input",
				"status":      "pending",
				"turnId":      "turn-1",
				"itemId":      "item-1",
				"input":       decode(t, seedQuestionSet),
			},
		},
	}
}

func requestOf(ev mapEvent) map[string]any { return ev.Payload["request"].(map[string]any) }

func questionSet(ev mapEvent) map[string]any { return requestOf(ev)["input"].(map[string]any) }

func seedInteraction(t *testing.T) Interaction {
	return Interaction{
		Kind:               "ask_user_questions",
		IdempotencyKey:     "runtime-input-durable:v1:00000000-0000-4000-8000-000000000001:elicitation-1",
		SourceRunID:        seedRunID,
		Title:              "Configure deployment",
		Summary:            "These answers are required before work can continue.",
		ContinuationPolicy: "wake_assignee",
		Payload: QuestionsPayload{
			Version:                1,
			Title:                  "Configure deployment",
			SubmitLabel:            "Continue",
			SupersedeOnUserComment: false,
			RuntimeRequestID:       seedRequestID,
			QuestionSet:            decode(t, seedQuestionSet),
			Questions: []Question{
				{ID: "region", Prompt: "Which region?", Required: true, SelectionMode: "single", Options: []Option{
					{ID: "us", Label: "US"}, {ID: "eu", Label: "Europe"},
				}},
				{ID: "replicas", Prompt: "How many replicas?", Required: true, SelectionMode: "single", Options: []Option{
					{ID: "__paperclip_text__", Label: "Enter an integer", FreeText: true},
				}},
			},
		},
	}
}

type fallbackCase struct {
	name   string
	mutate func(ev mapEvent)
	want   func(in *Interaction) // nil: no fallback
}

func runFallback(t *testing.T, reason string, tests []fallbackCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := expiredEvent(t, reason)
			if tc.mutate != nil {
				tc.mutate(ev)
			}
			got, ok := Fallback(ev.ev())
			if tc.want == nil {
				require.False(t, ok)
				require.Zero(t, got)
				return
			}
			require.True(t, ok)
			want := seedInteraction(t)
			tc.want(&want)
			require.Equal(t, want, got)
		})
	}
}

func same(*Interaction) {}

func TestE5_MaterializesOneIdempotentDurableInteractionAfterProviderProcessLost(t *testing.T) {
	runFallback(t, failure.ProviderProcessLost, []fallbackCase{
		{name: "seed", want: same},
		{name: "tether schema names", mutate: func(ev mapEvent) {
			requestOf(ev)["schema"] = "tether.runtime_request.v2"
			questionSet(ev)["schema"] = "tether.question_set.v1"
		}, want: func(in *Interaction) { in.Payload.QuestionSet["schema"] = "tether.question_set.v1" }},
		{name: "top-level request fields are optional", mutate: func(ev mapEvent) {
			delete(ev.Payload, "requestId")
			delete(ev.Payload, "requestKind")
			delete(ev.Payload, "requestType")
		}, want: same},
	})

	t.Run("idempotent: the same event gives the same interaction, the question set is copied", func(t *testing.T) {
		ev := expiredEvent(t, failure.ProviderProcessLost)
		a, ok := Fallback(ev.ev())
		require.True(t, ok)
		b, ok := Fallback(ev.ev())
		require.True(t, ok)
		require.Equal(t, a, b)
		require.Equal(t, IdempotencyKey(seedRunID, seedRequestID), a.IdempotencyKey)
		questionSet(ev)["title"] = "mutated"
		require.Equal(t, "Configure deployment", a.Payload.QuestionSet["title"])
	})
}

func TestE5_MaterializesOneIdempotentDurableInteractionAfterDurableHandoff(t *testing.T) {
	q := func(ev mapEvent, i int) map[string]any {
		return questionSet(ev)["questions"].([]any)[i].(map[string]any)
	}
	runFallback(t, failure.DurableHandoff, []fallbackCase{
		{name: "seed", want: same},
		{name: "multi-select keeps options and descriptions", mutate: func(ev mapEvent) {
			q(ev, 0)["answerMode"] = "multi_select"
			q(ev, 0)["options"].([]any)[0].(map[string]any)["description"] = "United States"
		}, want: func(in *Interaction) {
			in.Payload.QuestionSet["questions"].([]any)[0].(map[string]any)["answerMode"] = "multi_select"
			in.Payload.QuestionSet["questions"].([]any)[0].(map[string]any)["options"].([]any)[0].(map[string]any)["description"] = "United States"
			in.Payload.Questions[0].SelectionMode = "multi"
			in.Payload.Questions[0].Options[0].Description = "United States"
		}},
		{name: "number and plain text labels", mutate: func(ev mapEvent) {
			q(ev, 1)["textValidation"] = map[string]any{"inputType": "number"}
			q(ev, 0)["answerMode"] = "text"
		}, want: func(in *Interaction) {
			in.Payload.QuestionSet["questions"].([]any)[1].(map[string]any)["textValidation"] = map[string]any{"inputType": "number"}
			in.Payload.QuestionSet["questions"].([]any)[0].(map[string]any)["answerMode"] = "text"
			in.Payload.Questions[0].Options = []Option{{ID: TextOptionID, Label: "Enter your answer", FreeText: true}}
			in.Payload.Questions[1].Options[0].Label = "Enter a number"
		}},
		{name: "title and summary fall back to the prompt, bounded", mutate: func(ev mapEvent) {
			delete(questionSet(ev), "title")
			delete(questionSet(ev), "description")
			delete(questionSet(ev), "submitLabel")
			requestOf(ev)["prompt"] = strings.Repeat("p", 300)
		}, want: func(in *Interaction) {
			delete(in.Payload.QuestionSet, "title")
			delete(in.Payload.QuestionSet, "description")
			delete(in.Payload.QuestionSet, "submitLabel")
			in.Title = strings.Repeat("p", MaxTitleRunes-1) + "…"
			in.Summary = strings.Repeat("p", 300)
			in.Payload.Title = ""
			in.Payload.SubmitLabel = ""
		}},
		// Malformed requests never materialise anything.
		{name: "unknown request schema", mutate: func(ev mapEvent) { requestOf(ev)["schema"] = "other.runtime_request.v1" }},
		{name: "not a runtime request", mutate: func(ev mapEvent) { requestOf(ev)["requestKind"] = "approval" }},
		{name: "not an input request", mutate: func(ev mapEvent) { requestOf(ev)["type"] = "approval" }},
		{name: "top-level request id differs", mutate: func(ev mapEvent) { ev.Payload["requestId"] = "elicitation-2" }},
		{name: "top-level request type differs", mutate: func(ev mapEvent) { ev.Payload["requestType"] = "approval" }},
		{name: "missing turn id", mutate: func(ev mapEvent) { delete(requestOf(ev), "turnId") }},
		{name: "item id not a string", mutate: func(ev mapEvent) { requestOf(ev)["itemId"] = 7.0 }},
		{name: "request id with content", mutate: func(ev mapEvent) {
			requestOf(ev)["requestId"] = "what is your password?"
			delete(ev.Payload, "requestId")
		}},
		{name: "unknown question set schema", mutate: func(ev mapEvent) { questionSet(ev)["schema"] = "x" }},
		{name: "no questions", mutate: func(ev mapEvent) { questionSet(ev)["questions"] = []any{} }},
		{name: "duplicate question ids", mutate: func(ev mapEvent) { q(ev, 1)["id"] = "region" }},
		{name: "unknown answer mode", mutate: func(ev mapEvent) { q(ev, 1)["answerMode"] = "slider" }},
		{name: "select without options", mutate: func(ev mapEvent) { delete(q(ev, 0), "options") }},
		{name: "option using the free-text id", mutate: func(ev mapEvent) {
			q(ev, 0)["options"].([]any)[0].(map[string]any)["id"] = TextOptionID
		}},
		{name: "question without a prompt", mutate: func(ev mapEvent) { q(ev, 0)["prompt"] = " " }},
		{name: "too many questions", mutate: func(ev mapEvent) {
			var qs []any
			for i := range MaxQuestions + 1 {
				qs = append(qs, map[string]any{"id": "q" + string(rune('a'+i)), "prompt": "?", "answerMode": "text"})
			}
			questionSet(ev)["questions"] = qs
		}},
	})

	t.Run("no run id", func(t *testing.T) {
		ev := expiredEvent(t, failure.DurableHandoff)
		ev.RunID = ""
		_, ok := Fallback(ev.ev())
		require.False(t, ok)
	})
}

func requireNoFallback(t *testing.T, ev mapEvent) {
	t.Helper()
	got, ok := Fallback(ev.ev())
	require.False(t, ok)
	require.Zero(t, got)
}

func TestE5_NoFallbackForResolvedRequest(t *testing.T) {
	requireNoFallback(t, terminalEvent(t, EventResolved, failure.ProviderProcessLost, false))
	ev := expiredEvent(t, failure.ProviderProcessLost)
	ev.EventType = EventResolved
	requireNoFallback(t, ev)
}

func TestE5_NoFallbackForCancelledRequest(t *testing.T) {
	requireNoFallback(t, terminalEvent(t, EventCancelled, failure.ProviderProcessLost, false))
	ev := expiredEvent(t, failure.DurableHandoff)
	ev.EventType = EventCancelled
	requireNoFallback(t, ev)
}

func TestE5_NoFallbackForExplicitCancellation(t *testing.T) {
	for _, reason := range []string{"explicit_cancellation", "timeout", ""} {
		t.Run(reason, func(t *testing.T) {
			requireNoFallback(t, terminalEvent(t, EventExpired, reason, false))
			requireNoFallback(t, expiredEvent(t, reason))
		})
	}
}

func TestE5_NoFallbackWhenReplayAllowed(t *testing.T) {
	t.Run("seed", func(t *testing.T) {
		requireNoFallback(t, terminalEvent(t, EventExpired, failure.ProviderProcessLost, true))
	})
	for name, v := range map[string]any{"true": true, "absent": nil, "not a bool": "false"} {
		t.Run(name, func(t *testing.T) {
			ev := expiredEvent(t, failure.ProviderProcessLost)
			if v == nil {
				delete(ev.Payload, "replayAllowed")
			} else {
				ev.Payload["replayAllowed"] = v
			}
			requireNoFallback(t, ev)
		})
	}
}

func TestE5_EmitsContentFreeLifecycleMetricDimensions(t *testing.T) {
	tests := []struct {
		name string
		ev   mapEvent
		want *Metric
	}{
		{"seed: created", mapEvent{EventType: EventCreated, Payload: map[string]any{
			"request": map[string]any{
				"type": "input", "requestId": "input-1",
				"origin": map[string]any{"adapter": "codex-app-server"},
				"input":  decode(t, seedQuestionSet),
			},
		}}, &Metric{Outcome: "normalized", Adapter: "codex-app-server", RequestID: "input-1"}},
		{"seed: durable handoff", mapEvent{EventType: EventExpired, Payload: map[string]any{
			"requestId": "input-1", "requestType": "input", "reason": "durable_handoff", "adapter": "codex-app-server",
		}}, &Metric{Outcome: "durable_handoff", Adapter: "codex-app-server", RequestID: "input-1"}},
		{"seed: provider loss", mapEvent{EventType: EventExpired, Payload: map[string]any{
			"requestId": "input-1", "requestType": "input", "reason": "provider_process_lost", "adapter": "codex-app-server",
		}}, &Metric{Outcome: "provider_loss_handoff", Adapter: "codex-app-server", RequestID: "input-1"}},
		{"other expiry", mapEvent{EventType: EventExpired, Payload: map[string]any{
			"requestId": "input-1", "requestType": "input", "reason": "timeout", "adapter": "acpx",
		}}, &Metric{Outcome: "expired", Adapter: "acpx", RequestID: "input-1"}},
		{"resolved, type from the request", mapEvent{EventType: EventResolved, Payload: map[string]any{
			"request": map[string]any{"type": "input", "requestId": "input-2", "origin": map[string]any{"adapter": "opencode"}},
		}}, &Metric{Outcome: "resolved", Adapter: "opencode", RequestID: "input-2"}},
		{"cancelled", mapEvent{EventType: EventCancelled, Payload: map[string]any{
			"requestId": "input-1", "requestType": "input",
		}}, &Metric{Outcome: "cancelled", Adapter: Unknown, RequestID: "input-1"}},
		{"rejected input", mapEvent{EventType: EventHarnessDiagnostic, Payload: map[string]any{
			"code": "runtime_input_rejected", "requestId": "input-3", "adapter": "codex-app-server",
		}}, &Metric{Outcome: "rejected", Adapter: "codex-app-server", RequestID: "input-3"}},
		{"content never becomes a dimension", mapEvent{EventType: EventExpired, Payload: map[string]any{
			"requestId": "Which region? us or eu", "requestType": "input", "reason": "durable_handoff",
			"adapter": strings.Repeat("a", 200),
		}}, &Metric{Outcome: "durable_handoff", Adapter: Unknown, RequestID: Unknown}},
		{"created approval request", mapEvent{EventType: EventCreated, Payload: map[string]any{
			"request": map[string]any{"type": "approval", "requestId": "a-1"},
		}}, nil},
		{"expired approval request", mapEvent{EventType: EventExpired, Payload: map[string]any{
			"requestId": "a-1", "requestType": "approval", "reason": "durable_handoff",
		}}, nil},
		{"other diagnostic", mapEvent{EventType: EventHarnessDiagnostic, Payload: map[string]any{"code": "slow"}}, nil},
		{"other event", mapEvent{EventType: "item.completed"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := LifecycleMetric(tc.ev.ev())
			if tc.want == nil {
				require.False(t, ok)
				return
			}
			require.True(t, ok)
			require.Equal(t, *tc.want, got)
		})
	}
}
