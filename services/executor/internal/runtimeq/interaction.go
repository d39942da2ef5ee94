package runtimeq

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Interaction sources and policies besides the runtime question fallback.
const (
	// ContinuationResponseWake: the run that asked yields until the
	// interaction is answered (SPEC E4).
	ContinuationResponseWake = "response_wake"
	// EventToolInput is the event of a dynamic tool call.
	EventToolInput = prp.EventToolInput
)

// ToolCallKey is the idempotency key of the interaction a tether_ask_user
// call opens: "tether-ask-user:v1:<runId>:<callId>".
func ToolCallKey(runID, callID string) string {
	return "tether-ask-user:v1:" + runID + ":" + callID
}

// FromEvent returns the durable interaction an event opens, if any: a
// tether_ask_user tool call (a governed wait of the run, policy
// response_wake) or a runtime question fallback ([Fallback]). lost is true
// for a fallback whose provider process was lost: the run does not yield on
// it.
func FromEvent(ev Event) (in Interaction, lost bool, ok bool) {
	switch ev.EventType {
	case EventToolInput:
		in, ok = FromToolCall(ev)
		return in, false, ok
	case EventExpired:
		in, ok = Fallback(ev)
		return in, ok && ev.Payload.GetFields()["reason"].GetStringValue() == failure.ProviderProcessLost, ok
	}
	return Interaction{}, false, false
}

// FromToolCall turns a semantic_tool.input event of the built-in
// tether_ask_user tool with valid arguments (askuser.Parse) into its
// interaction; questions without options get the free-text option.
func FromToolCall(ev Event) (Interaction, bool) {
	var p prpv1.ToolCallEvent
	if ev.EventType != EventToolInput || prp.DecodeStruct(ev.Payload, &p) != nil {
		return Interaction{}, false
	}
	callID := p.GetCallId()
	if p.GetTool() != askuser.ToolName || !validID(ev.RunID) || !validID(callID) {
		return Interaction{}, false
	}
	args, err := protojson.Marshal(p.GetArguments())
	if err != nil {
		return Interaction{}, false
	}
	req, err := askuser.Parse(args)
	if err != nil {
		return Interaction{}, false
	}
	questions := make([]Question, 0, len(req.Questions))
	for _, q := range req.Questions {
		nq := Question{ID: q.ID, Prompt: q.Prompt, Required: q.Required, SelectionMode: SelectionSingle}
		if q.Multi {
			nq.SelectionMode = SelectionMulti
		}
		if q.FreeText {
			nq.Options = []Option{{ID: TextOptionID, Label: askuser.FreeTextLabel(), FreeText: true}}
		}
		for _, o := range q.Options {
			nq.Options = append(nq.Options, Option{ID: o.ID, Label: o.Label})
		}
		questions = append(questions, nq)
	}
	return Interaction{
		Kind:               req.Kind,
		IdempotencyKey:     ToolCallKey(ev.RunID, callID),
		SourceRunID:        ev.RunID,
		Title:              req.Title,
		Summary:            req.Summary,
		ContinuationPolicy: ContinuationResponseWake,
		Payload:            QuestionsPayload{Version: 1, Title: req.Title, Questions: questions},
	}, true
}

// Answer answers one question: option ids, and the text of a free-text
// option.
type Answer = store.Answer

// AnswerError is an answer that does not fit the interaction's questions.
type AnswerError = store.AnswerError

// MergeAnswers checks answers against the questions and merges them over
// the answers recorded so far (a later answer to a question replaces the
// earlier one), in question order. complete is true when every required
// question is answered. Only request_item_verdicts may be answered in
// parts; any other kind must be answered completely at once.
func MergeAnswers(kind string, questions []Question, prior, answers []Answer) (merged []Answer, complete bool, err error) {
	byID := map[string]Question{}
	for _, q := range questions {
		byID[q.ID] = q
	}
	got := map[string]Answer{}
	for _, a := range prior {
		got[a.QuestionID] = a
	}
	seen := map[string]bool{}
	for _, a := range answers {
		q, ok := byID[a.QuestionID]
		if !ok {
			return nil, false, &AnswerError{Reason: fmt.Sprintf("question %q is not one of the interaction's", a.QuestionID)}
		}
		if seen[a.QuestionID] {
			return nil, false, &AnswerError{Reason: fmt.Sprintf("question %q is answered twice", a.QuestionID)}
		}
		seen[a.QuestionID] = true
		if err := checkAnswer(q, a); err != nil {
			return nil, false, err
		}
		if !hasFreeText(q) {
			a.Text = ""
		}
		got[a.QuestionID] = a
	}
	complete = true
	for _, q := range questions {
		if a, ok := got[q.ID]; ok {
			merged = append(merged, a)
		} else if q.Required {
			complete = false
		}
	}
	if !complete && kind != askuser.KindRequestItemVerdicts {
		return nil, false, &AnswerError{Reason: "every required question needs an answer"}
	}
	return merged, complete, nil
}

func hasFreeText(q Question) bool {
	for _, o := range q.Options {
		if o.FreeText {
			return true
		}
	}
	return false
}

func checkAnswer(q Question, a Answer) error {
	if len(a.OptionIDs) == 0 {
		return &AnswerError{Reason: fmt.Sprintf("question %q needs an option id", q.ID)}
	}
	if q.SelectionMode != SelectionMulti && len(a.OptionIDs) > 1 {
		return &AnswerError{Reason: fmt.Sprintf("question %q takes one option", q.ID)}
	}
	picked := map[string]bool{}
	for _, id := range a.OptionIDs {
		var opt *Option
		for i := range q.Options {
			if q.Options[i].ID == id {
				opt = &q.Options[i]
			}
		}
		if opt == nil {
			return &AnswerError{Reason: fmt.Sprintf("option %q is not an option of question %q", id, q.ID)}
		}
		if picked[id] {
			return &AnswerError{Reason: fmt.Sprintf("option %q is picked twice", id)}
		}
		picked[id] = true
		if opt.FreeText && strings.TrimSpace(a.Text) == "" {
			return &AnswerError{Reason: fmt.Sprintf("the free-text option of question %q needs text", q.ID)}
		}
	}
	return nil
}

// AnswerPrompt is the continuation run's prompt: the answers in words, so
// the provider continues its conversation with them.
func AnswerPrompt(title string, questions []Question, answers []Answer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "The user answered %q:", title)
	for _, a := range answers {
		for _, q := range questions {
			if q.ID != a.QuestionID {
				continue
			}
			var picked []string
			for _, id := range a.OptionIDs {
				for _, o := range q.Options {
					if o.ID != id {
						continue
					}
					if o.FreeText {
						picked = append(picked, a.Text)
					} else {
						picked = append(picked, o.Label)
					}
				}
			}
			fmt.Fprintf(&b, "\n- %s %s", q.Prompt, strings.Join(picked, ", "))
		}
	}
	return b.String()
}
