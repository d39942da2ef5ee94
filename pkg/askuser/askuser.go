// Package askuser is the built-in dynamic tool through which a provider
// opens a governed wait (SPEC E4): runnerd offers it to every provider
// session next to the run's own tools and answers each call at once; the
// executor turns the call's arguments into a durable interaction, and the
// run that made the call yields until a human answers it.
//
// Both sides read the arguments with [Parse], so what runnerd accepts is
// exactly what the executor records.
package askuser

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// ToolName is the built-in tool's name.
const ToolName = "tether_ask_user"

// Interaction kinds the tool creates.
const (
	KindAskUserQuestions     = "ask_user_questions"
	KindRequestConfirmation  = "request_confirmation"
	KindRequestItemVerdicts  = "request_item_verdicts"
	confirmationQuestionID   = "confirmation"
	maxTitleRunes            = 240
	maxSummaryRunes          = 1000
	maxPromptRunes           = 2000
	maxQuestions             = 20
	maxOptions               = 50
	maxIDLen                 = 160
	freeTextLabel            = "Enter your answer"
	toolDescription          = "Ask the user (or request a confirmation, or verdicts on items) and wait for the answer durably. After calling it, end your turn: the answer arrives as the next turn's input."
	answerRecordedText       = "The request was recorded as a durable interaction. End your turn now; the answer arrives as the input of the next turn."
	optionAccept, optionDecl = "accept", "decline"
)

// Verdict options of an item-verdict request.
var verdictOptions = []Option{{ID: "accept", Label: "Accept"}, {ID: "reject", Label: "Reject"}}

// Request is a validated tool call: one interaction to create.
type Request struct {
	Kind      string
	Title     string
	Summary   string
	Questions []Question
}

// Question is one question; a question without options takes free text.
type Question struct {
	ID       string
	Prompt   string
	Required bool
	Multi    bool
	FreeText bool
	Options  []Option
}

// Option is one answer option.
type Option struct {
	ID    string
	Label string
}

// Schema is the part of JSON Schema the tool's input schema uses.
type Schema struct {
	Enum       []string           `json:"enum,omitempty"`
	Items      *Schema            `json:"items,omitempty"`
	Properties map[string]*Schema `json:"properties,omitempty"`
	Required   []string           `json:"required,omitempty"`
	Type       string             `json:"type"`
}

// Description is the tool's description.
func Description() string { return toolDescription }

// InputSchema is the JSON Schema of the tool's arguments.
func InputSchema() *Schema {
	str := &Schema{Type: "string"}
	option := &Schema{Type: "object", Properties: map[string]*Schema{"id": str, "label": str}, Required: []string{"id", "label"}}
	question := &Schema{Type: "object", Properties: map[string]*Schema{
		"id": str, "prompt": str, "multi": {Type: "boolean"}, "options": {Type: "array", Items: option},
	}, Required: []string{"id", "prompt"}}
	return &Schema{
		Type: "object",
		Properties: map[string]*Schema{
			"kind":      {Type: "string", Enum: []string{KindAskUserQuestions, KindRequestConfirmation, KindRequestItemVerdicts}},
			"title":     str,
			"summary":   str,
			"questions": {Type: "array", Items: question},
			"items":     {Type: "array", Items: option},
		},
		Required: []string{"title"},
	}
}

// RecordedText is the tool's answer to a valid call.
func RecordedText() string { return answerRecordedText }

type rawArgs struct {
	Kind      string `json:"kind"`
	Title     string `json:"title"`
	Summary   string `json:"summary"`
	Questions []struct {
		ID      string   `json:"id"`
		Prompt  string   `json:"prompt"`
		Multi   bool     `json:"multi"`
		Options []Option `json:"options"`
	} `json:"questions"`
	Items []Option `json:"items"`
}

var identifier = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`)

func validID(s string) bool { return len(s) <= maxIDLen && identifier.MatchString(s) }

// ErrInvalid prefixes every argument error.
var ErrInvalid = errors.New("tether_ask_user_invalid")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Parse validates the tool's arguments: a title; for ask_user_questions 1..20
// questions with unique ids and a prompt, options (when given) with unique
// ids and labels; for request_item_verdicts 1..50 items, each becoming a
// required accept/reject question; request_confirmation one accept/decline
// question.
func Parse(args []byte) (Request, error) {
	var a rawArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return Request{}, invalid("arguments are not an object: %v", err)
	}
	r := Request{Kind: a.Kind, Title: bounded(a.Title, maxTitleRunes), Summary: bounded(a.Summary, maxSummaryRunes)}
	if r.Kind == "" {
		r.Kind = KindAskUserQuestions
	}
	if r.Title == "" {
		return Request{}, invalid("title is required")
	}
	switch r.Kind {
	case KindAskUserQuestions:
		if len(a.Questions) == 0 || len(a.Questions) > maxQuestions {
			return Request{}, invalid("ask_user_questions needs 1..%d questions", maxQuestions)
		}
		seen := map[string]bool{}
		for _, q := range a.Questions {
			prompt := bounded(q.Prompt, maxPromptRunes)
			if !validID(q.ID) || seen[q.ID] || prompt == "" {
				return Request{}, invalid("question %q: ids must be unique identifiers and prompts non-empty", q.ID)
			}
			seen[q.ID] = true
			nq := Question{ID: q.ID, Prompt: prompt, Required: true, Multi: q.Multi}
			if len(q.Options) == 0 {
				nq.FreeText, nq.Multi = true, false
			} else {
				opts, err := options(q.Options)
				if err != nil {
					return Request{}, invalid("question %q: %v", q.ID, err)
				}
				nq.Options = opts
			}
			r.Questions = append(r.Questions, nq)
		}
	case KindRequestConfirmation:
		prompt := r.Summary
		if prompt == "" {
			prompt = r.Title
		}
		r.Questions = []Question{{ID: confirmationQuestionID, Prompt: prompt, Required: true,
			Options: []Option{{ID: optionAccept, Label: "Confirm"}, {ID: optionDecl, Label: "Decline"}}}}
	case KindRequestItemVerdicts:
		items, err := options(a.Items)
		if err != nil {
			return Request{}, invalid("items: %v", err)
		}
		for _, it := range items {
			r.Questions = append(r.Questions, Question{ID: it.ID, Prompt: it.Label, Required: true, Options: verdictOptions})
		}
	default:
		return Request{}, invalid("kind %q is not ask_user_questions, request_confirmation or request_item_verdicts", a.Kind)
	}
	return r, nil
}

func options(in []Option) ([]Option, error) {
	if len(in) == 0 || len(in) > maxOptions {
		return nil, fmt.Errorf("1..%d options are needed", maxOptions)
	}
	seen := map[string]bool{}
	out := make([]Option, 0, len(in))
	for _, o := range in {
		label := bounded(o.Label, maxTitleRunes)
		if !validID(o.ID) || seen[o.ID] || label == "" {
			return nil, fmt.Errorf("option %q: ids must be unique identifiers and labels non-empty", o.ID)
		}
		seen[o.ID] = true
		out = append(out, Option{ID: o.ID, Label: label})
	}
	return out, nil
}

// FreeTextLabel labels the free-text option of a question without options.
func FreeTextLabel() string { return freeTextLabel }

// bounded folds s onto one line and cuts it to n runes.
func bounded(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}
