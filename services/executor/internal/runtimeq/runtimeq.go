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
// Events arrive with their payload as stored (a Struct); the rules read it
// as the typed payload of its event (prpv1.RuntimeRequestEvent,
// HarnessDiagnostic, ToolCallEvent). Everything here is pure.
package runtimeq

import (
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
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
	Payload   *structpb.Struct
}

// request reads ev's payload as a runtime request event; ok is false when
// it does not have that shape.
func request(ev Event) (*prpv1.RuntimeRequestEvent, bool) {
	var p prpv1.RuntimeRequestEvent
	if prp.DecodeStruct(ev.Payload, &p) != nil {
		return nil, false
	}
	return &p, true
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
	p, ok := request(ev)
	if !ok {
		return Interaction{}, false
	}
	switch p.GetReason() {
	case failure.ProviderProcessLost, failure.DurableHandoff:
	default:
		return Interaction{}, false
	}
	if p.ReplayAllowed == nil || p.GetReplayAllowed() {
		return Interaction{}, false
	}
	req := p.GetRequest()
	if req == nil || !slices.Contains(requestSchemas, req.GetSchema()) {
		return Interaction{}, false
	}
	requestID := req.GetRequestId()
	if !validID(requestID) ||
		req.GetRequestKind() != "runtime" || req.GetType() != "input" ||
		req.GetTurnId() == "" || req.GetItemId() == "" ||
		!absentOr(p.GetRequestId(), requestID) ||
		!absentOr(p.GetRequestKind(), "runtime") ||
		!absentOr(p.GetRequestType(), "input") {
		return Interaction{}, false
	}
	set := req.GetInput()
	questions, ok := parseQuestionSet(set)
	if !ok {
		return Interaction{}, false
	}
	prompt := req.GetPrompt()
	setTitle := bounded(set.GetTitle(), MaxTitleRunes)
	title := firstNonEmpty(setTitle, bounded(prompt, MaxTitleRunes), "Input requested")
	summary := firstNonEmpty(
		bounded(set.GetDescription(), MaxSummaryRunes),
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
			SubmitLabel:            bounded(set.GetSubmitLabel(), MaxSubmitLabelRunes),
			SupersedeOnUserComment: false,
			RuntimeRequestID:       requestID,
			// The provider's question set as it sent it, a copy.
			QuestionSet: ev.Payload.GetFields()["request"].GetStructValue().GetFields()["input"].GetStructValue().AsMap(),
			Questions:   questions,
		},
	}, true
}

func parseQuestionSet(set *prpv1.QuestionSet) ([]Question, bool) {
	if set == nil || !slices.Contains(questionSetSchemas, set.GetSchema()) {
		return nil, false
	}
	raw := set.GetQuestions()
	if len(raw) == 0 || len(raw) > MaxQuestions {
		return nil, false
	}
	out := make([]Question, 0, len(raw))
	seen := map[string]bool{}
	for _, q := range raw {
		id, prompt := q.GetId(), strings.TrimSpace(q.GetPrompt())
		if !validID(id) || seen[id] || prompt == "" {
			return nil, false
		}
		seen[id] = true
		question := Question{ID: id, Prompt: prompt, Required: q.GetRequired(), SelectionMode: SelectionSingle}
		switch q.GetAnswerMode() {
		case AnswerMultiSelect:
			question.SelectionMode = SelectionMulti
			fallthrough
		case AnswerSingleSelect:
			opts, ok := parseOptions(q.GetOptions())
			if !ok {
				return nil, false
			}
			question.Options = opts
		case AnswerText:
			question.Options = []Option{{ID: TextOptionID, Label: textLabel(q.GetTextValidation()), FreeText: true}}
		default:
			return nil, false
		}
		out = append(out, question)
	}
	return out, true
}

func parseOptions(raw []*prpv1.QuestionOption) ([]Option, bool) {
	if len(raw) == 0 || len(raw) > MaxOptions {
		return nil, false
	}
	out := make([]Option, 0, len(raw))
	seen := map[string]bool{}
	for _, o := range raw {
		id, label := o.GetId(), strings.TrimSpace(o.GetLabel())
		if !validID(id) || id == TextOptionID || seen[id] || label == "" {
			return nil, false
		}
		seen[id] = true
		out = append(out, Option{ID: id, Label: label, Description: o.GetDescription()})
	}
	return out, true
}

func textLabel(validation *prpv1.TextValidation) string {
	switch validation.GetInputType() {
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
	if ev.EventType == EventHarnessDiagnostic {
		var d prpv1.HarnessDiagnostic
		if prp.DecodeStruct(ev.Payload, &d) != nil || d.GetCode() != "runtime_input_rejected" {
			return Metric{}, false
		}
		return metric(OutcomeRejected, ev), true
	}
	p, ok := request(ev)
	if !ok {
		p = &prpv1.RuntimeRequestEvent{}
	}
	req := p.GetRequest()
	var outcome string
	switch ev.EventType {
	case EventCreated:
		if req.GetType() != "input" {
			return Metric{}, false
		}
		outcome = OutcomeNormalized
	case EventResolved, EventExpired, EventCancelled:
		if firstNonEmpty(p.GetRequestType(), req.GetType()) != "input" {
			return Metric{}, false
		}
		switch {
		case ev.EventType == EventResolved:
			outcome = OutcomeResolved
		case ev.EventType == EventCancelled:
			outcome = OutcomeCancelled
		case p.GetReason() == failure.DurableHandoff:
			outcome = OutcomeDurableHandoff
		case p.GetReason() == failure.ProviderProcessLost:
			outcome = OutcomeProviderLossHandoff
		default:
			outcome = OutcomeExpired
		}
	default:
		return Metric{}, false
	}
	return metric(outcome, ev), true
}

// metric is ev's metric with outcome: the adapter (the payload's, its
// origin's or its request's origin's) and the request id (the payload's or
// its request's), each when it is a valid identifier.
func metric(outcome string, ev Event) Metric {
	p, ok := request(ev)
	if !ok {
		p = &prpv1.RuntimeRequestEvent{}
	}
	req := p.GetRequest()
	return Metric{
		Outcome:   outcome,
		Adapter:   dimension(firstNonEmpty(p.GetAdapter(), p.GetOrigin().GetAdapter(), req.GetOrigin().GetAdapter())),
		RequestID: dimension(firstNonEmpty(p.GetRequestId(), req.GetRequestId())),
	}
}

var identifier = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`)

func validID(s string) bool { return len(s) <= maxIDLen && identifier.MatchString(s) }

func dimension(s string) string {
	if !validID(s) {
		return Unknown
	}
	return s
}

// absentOr reports whether v is absent (empty) or equals want.
func absentOr(v, want string) bool { return v == "" || v == want }

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
