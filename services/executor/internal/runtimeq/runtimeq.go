// Package runtimeq decides what happens to a provider's runtime input
// request (a question the agent asked mid-turn) when it can no longer be
// answered live, and what the request's lifecycle metrics say (SPEC E5).
//
// When a runtime input request expires because the provider process was
// lost or the run was handed off durably, and the runner says the request
// may not be replayed, the questions must not be lost: [Fallback] turns
// them into one durable ask_user_questions interaction that wakes the
// assignee once answered. Resolved or cancelled requests, explicit
// cancellations and replayable requests get no fallback.
//
// [LifecycleMetric] reduces request events to content-free metric
// dimensions {outcome, adapter, request id}.
//
// Events arrive as decoded JSON (payload as map[string]any); everything
// here is pure.
package runtimeq

import (
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Event types.
const (
	EventCreated           = prp.EventRuntimeRequestCreated
	EventResolved          = prp.EventRuntimeRequestResolved
	EventExpired           = prp.EventRuntimeRequestExpired
	EventCancelled         = prp.EventRuntimeRequestCancelled
	EventHarnessDiagnostic = prp.EventHarnessDiagnostic
)

// Interaction values.
const (
	ContinuationWakeAssignee = "wake_assignee"
	// TextOptionID is the id of the single free-text option a text
	// question becomes. The reference system's name is kept on purpose:
	// stored interactions and clients already use it.
	TextOptionID = "__paperclip_text__"

	SelectionSingle = "single"
	SelectionMulti  = "multi"

	AnswerSingleSelect = "single_select"
	AnswerMultiSelect  = "multi_select"
	AnswerText         = "text"
)

// Bounds.
const (
	MaxTitleRunes       = 240
	MaxSummaryRunes     = 1000
	MaxSubmitLabelRunes = 120
	MaxQuestions        = 20
	MaxOptions          = 50
	maxIDLen            = 160
)

// Accepted schema names. The tether names are ours; the reference system's
// names are accepted from harnesses that still emit them.
var (
	requestSchemas     = []string{"tether.runtime_request.v2", "paperclip.runtime_request.v2"}
	questionSetSchemas = []string{"tether.question_set.v1", "paperclip.question_set.v1"}
)

// Event is a PRP event as the executor decodes it.
type Event struct {
	EventType string
	RunID     string
	Payload   map[string]any
}

// Interaction is a durable interaction to create (idempotently, by key).
type Interaction = store.InteractionSpec

// QuestionsPayload is an ask_user_questions interaction's payload.
type QuestionsPayload = store.QuestionsPayload

// Question is one question of the interaction.
type Question = store.Question

// Option is one answer option.
type Option = store.Option

// IdempotencyKey is the key of the durable interaction for a request:
// "runtime-input-durable:v1:<runId>:<requestId>".
func IdempotencyKey(runID, requestID string) string {
	return "runtime-input-durable:v1:" + runID + ":" + requestID
}

// Fallback returns the durable interaction for ev, or ok=false when ev
// calls for none. A fallback requires all of:
//
//   - event type runtime_request.expired;
//   - payload reason provider_process_lost or durable_handoff;
//   - payload replayAllowed exactly false (absent is not false);
//   - a payload request of schema runtime_request.v2, requestKind
//     "runtime", type "input", a request id (equal to the payload's
//     requestId, requestKind and requestType when those are present too),
//     and non-empty turnId and itemId;
//   - a run id; and a valid question set (schema question_set.v1, 1 to
//     MaxQuestions questions with unique ids and a prompt; select
//     questions with 1 to MaxOptions options with unique ids and labels).
//
// The interaction keeps single- and multi-select options and turns each
// text question into one free-text option with id TextOptionID.
func Fallback(ev Event) (Interaction, bool) {
	if ev.EventType != EventExpired || !validID(ev.RunID) {
		return Interaction{}, false
	}
	p := ev.Payload
	switch str(p, "reason") {
	case failure.ProviderProcessLost, failure.DurableHandoff:
	default:
		return Interaction{}, false
	}
	if replay, ok := p["replayAllowed"].(bool); !ok || replay {
		return Interaction{}, false
	}
	req := obj(p, "request")
	if req == nil || !slices.Contains(requestSchemas, str(req, "schema")) {
		return Interaction{}, false
	}
	requestID := str(req, "requestId")
	if !validID(requestID) ||
		str(req, "requestKind") != "runtime" || str(req, "type") != "input" ||
		str(req, "turnId") == "" || str(req, "itemId") == "" ||
		!absentOr(p, "requestId", requestID) ||
		!absentOr(p, "requestKind", "runtime") ||
		!absentOr(p, "requestType", "input") {
		return Interaction{}, false
	}
	set := obj(req, "input")
	questions, ok := parseQuestionSet(set)
	if !ok {
		return Interaction{}, false
	}
	prompt := str(req, "prompt")
	setTitle := bounded(str(set, "title"), MaxTitleRunes)
	title := firstNonEmpty(setTitle, bounded(prompt, MaxTitleRunes), "Input requested")
	summary := firstNonEmpty(
		bounded(str(set, "description"), MaxSummaryRunes),
		bounded(prompt, MaxSummaryRunes),
		"The agent needs these answers to continue.",
	)
	return Interaction{
		Kind:               askuser.KindAskUserQuestions,
		IdempotencyKey:     IdempotencyKey(ev.RunID, requestID),
		SourceRunID:        ev.RunID,
		Title:              title,
		Summary:            summary,
		ContinuationPolicy: ContinuationWakeAssignee,
		Payload: QuestionsPayload{
			Version:                1,
			Title:                  setTitle,
			SubmitLabel:            bounded(str(set, "submitLabel"), MaxSubmitLabelRunes),
			SupersedeOnUserComment: false,
			RuntimeRequestID:       requestID,
			QuestionSet:            deepCopy(set).(map[string]any),
			Questions:              questions,
		},
	}, true
}

func parseQuestionSet(set map[string]any) ([]Question, bool) {
	if set == nil || !slices.Contains(questionSetSchemas, str(set, "schema")) {
		return nil, false
	}
	raw, _ := set["questions"].([]any)
	if len(raw) == 0 || len(raw) > MaxQuestions {
		return nil, false
	}
	out := make([]Question, 0, len(raw))
	seen := map[string]bool{}
	for _, r := range raw {
		q, _ := r.(map[string]any)
		id, prompt := str(q, "id"), strings.TrimSpace(str(q, "prompt"))
		if q == nil || !validID(id) || seen[id] || prompt == "" {
			return nil, false
		}
		seen[id] = true
		required, _ := q["required"].(bool)
		question := Question{ID: id, Prompt: prompt, Required: required, SelectionMode: SelectionSingle}
		switch str(q, "answerMode") {
		case AnswerMultiSelect:
			question.SelectionMode = SelectionMulti
			fallthrough
		case AnswerSingleSelect:
			opts, ok := parseOptions(q["options"])
			if !ok {
				return nil, false
			}
			question.Options = opts
		case AnswerText:
			question.Options = []Option{{ID: TextOptionID, Label: textLabel(obj(q, "textValidation")), FreeText: true}}
		default:
			return nil, false
		}
		out = append(out, question)
	}
	return out, true
}

func parseOptions(v any) ([]Option, bool) {
	raw, _ := v.([]any)
	if len(raw) == 0 || len(raw) > MaxOptions {
		return nil, false
	}
	out := make([]Option, 0, len(raw))
	seen := map[string]bool{}
	for _, r := range raw {
		o, _ := r.(map[string]any)
		id, label := str(o, "id"), strings.TrimSpace(str(o, "label"))
		if o == nil || !validID(id) || id == TextOptionID || seen[id] || label == "" {
			return nil, false
		}
		seen[id] = true
		out = append(out, Option{ID: id, Label: label, Description: str(o, "description")})
	}
	return out, true
}

func textLabel(validation map[string]any) string {
	switch str(validation, "inputType") {
	case "integer":
		return "Enter an integer"
	case "number":
		return "Enter a number"
	}
	return "Enter your answer"
}

// Lifecycle outcomes.
const (
	OutcomeNormalized          = "normalized"
	OutcomeRejected            = "rejected"
	OutcomeResolved            = "resolved"
	OutcomeDurableHandoff      = failure.DurableHandoff
	OutcomeProviderLossHandoff = "provider_loss_handoff"
	OutcomeExpired             = "expired"
	OutcomeCancelled           = "cancelled"

	// Unknown stands in for an absent or unusable adapter or request id.
	Unknown = "unknown"
)

// Metric is one runtime input lifecycle observation. Its dimensions carry
// no request content: an outcome from a fixed set, and identifiers that
// pass a strict pattern (anything else becomes "unknown").
type Metric = store.RuntimeInputMetric

// LifecycleMetric maps an input request's event to its metric, or ok=false
// for events that are not input request lifecycle steps:
//
//	runtime_request.created (type input)           normalized
//	harness.diagnostic code runtime_input_rejected rejected
//	runtime_request.resolved                       resolved
//	runtime_request.expired, durable_handoff       durable_handoff
//	runtime_request.expired, provider_process_lost provider_loss_handoff
//	runtime_request.expired, other reason          expired
//	runtime_request.cancelled                      cancelled
//
// Terminal events count only when the request type (payload requestType or
// request.type) is input. The adapter is the payload's adapter or the
// request's origin.adapter; the request id the payload's or the request's.
func LifecycleMetric(ev Event) (Metric, bool) {
	p := ev.Payload
	req := obj(p, "request")
	var outcome string
	switch ev.EventType {
	case EventCreated:
		if str(req, "type") != "input" {
			return Metric{}, false
		}
		outcome = OutcomeNormalized
	case EventHarnessDiagnostic:
		if str(p, "code") != "runtime_input_rejected" {
			return Metric{}, false
		}
		outcome = OutcomeRejected
	case EventResolved, EventExpired, EventCancelled:
		if firstNonEmpty(str(p, "requestType"), str(req, "type")) != "input" {
			return Metric{}, false
		}
		switch {
		case ev.EventType == EventResolved:
			outcome = OutcomeResolved
		case ev.EventType == EventCancelled:
			outcome = OutcomeCancelled
		case str(p, "reason") == failure.DurableHandoff:
			outcome = OutcomeDurableHandoff
		case str(p, "reason") == failure.ProviderProcessLost:
			outcome = OutcomeProviderLossHandoff
		default:
			outcome = OutcomeExpired
		}
	default:
		return Metric{}, false
	}
	return Metric{
		Outcome:   outcome,
		Adapter:   dimension(firstNonEmpty(str(p, "adapter"), str(obj(p, "origin"), "adapter"), str(obj(req, "origin"), "adapter"))),
		RequestID: dimension(firstNonEmpty(str(p, "requestId"), str(req, "requestId"))),
	}, true
}

var identifier = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`)

func validID(s string) bool { return len(s) <= maxIDLen && identifier.MatchString(s) }

func dimension(s string) string {
	if !validID(s) {
		return Unknown
	}
	return s
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

func obj(m map[string]any, key string) map[string]any {
	o, _ := m[key].(map[string]any)
	return o
}

// absentOr reports whether m[key] is absent or equals want.
func absentOr(m map[string]any, key, want string) bool {
	v, ok := m[key]
	if !ok || v == nil {
		return true
	}
	s, _ := v.(string)
	return s == want
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// bounded trims s, folds it onto one line when it must be short, and cuts it
// to n runes.
func bounded(s string, n int) string {
	s = strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
	if n <= MaxTitleRunes {
		s = strings.Join(strings.Fields(s), " ")
	}
	if utf8.RuneCountInString(s) > n {
		s = strings.TrimRight(string([]rune(s)[:n-1]), " ") + "…"
	}
	return s
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}
