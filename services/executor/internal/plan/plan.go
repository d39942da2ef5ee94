// Package plan renders provider plans as Markdown (SPEC E3).
//
// Two sources exist:
//
//   - A live provider plan ([ProviderPlan]): the provider's completed
//     Markdown when it has one, otherwise a bounded checklist built from the
//     explanation and the steps ([Markdown]).
//   - A semantic run result whose artifacts include one of kind
//     native_provider_plan ([SemanticMarkdown]). Its ref may hold the plan in
//     several encodings; see [RefMarkdown] and [SummaryMarkdown].
//
// Provenance (run ids, provider thread ids) is never rendered. All functions
// are pure and safe on arbitrary input.
package plan

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Bounds on what a rendered checklist may hold.
const (
	// MaxSteps is the most checklist or numbered items rendered.
	MaxSteps = 100
	// MaxStepRunes bounds one checklist item's body.
	MaxStepRunes = 500
	// MaxExplanationRunes bounds the checklist's explanation.
	MaxExplanationRunes = 2000
)

// Step statuses as providers report them. Unknown statuses render as pending.
const (
	StatusPending    = "pending"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusBlocked    = "blocked"
)

// Step is one plan step.
type Step struct {
	Body   string
	Status string
}

// ProviderPlan is a plan update from a provider.
type ProviderPlan struct {
	// Markdown is the provider's completed plan document, if any.
	Markdown    string
	Explanation string
	Steps       []Step

	// Provenance of the update. Carried so callers can pass a provider's
	// update through unchanged; never rendered.
	RunID            string
	ProviderThreadID string
}

// Markdown renders p. The provider's completed Markdown (trimmed) wins when
// it is not blank. Otherwise the result is the explanation, a blank line and
// one checklist line per step:
//
//	completed:   "- [x] body"
//	in progress: "- [ ] body _(in progress)_"
//	blocked:     "- [ ] body _(blocked)_"
//	pending:     "- [ ] body" (also any unknown status)
//
// Step bodies are folded onto one line and truncated to MaxStepRunes; steps
// with a blank body are skipped; at most MaxSteps steps are listed, followed
// by a count of those left out. ok is false when there is nothing to render.
func Markdown(p ProviderPlan) (md string, ok bool) {
	if m := strings.TrimSpace(normalizeNewlines(p.Markdown)); m != "" && utf8.ValidString(m) {
		return m, true
	}
	var lines []string
	if e := strings.TrimSpace(normalizeNewlines(p.Explanation)); e != "" {
		lines = append(lines, truncateRunes(strings.ToValidUTF8(e, "\uFFFD"), MaxExplanationRunes))
	}
	var items []string
	omitted := 0
	for _, s := range p.Steps {
		body := truncateRunes(oneLine(s.Body), MaxStepRunes)
		if body == "" {
			continue
		}
		if len(items) == MaxSteps {
			omitted++
			continue
		}
		items = append(items, checklistLine(body, s.Status))
	}
	if omitted > 0 {
		items = append(items, "_… and "+strconv.Itoa(omitted)+" more steps_")
	}
	if len(lines) == 0 && len(items) == 0 {
		return "", false
	}
	if len(lines) > 0 && len(items) > 0 {
		lines = append(lines, "")
	}
	return strings.Join(append(lines, items...), "\n"), true
}

func checklistLine(body, status string) string {
	switch canonicalStatus(status) {
	case StatusCompleted:
		return "- [x] " + body
	case StatusInProgress:
		return "- [ ] " + body + " _(in progress)_"
	case StatusBlocked:
		return "- [ ] " + body + " _(blocked)_"
	}
	return "- [ ] " + body
}

// canonicalStatus maps the spellings providers use (in_progress,
// inProgress, in-progress, done, ...) onto the four statuses.
func canonicalStatus(s string) string {
	k := strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(s))
	switch k {
	case "completed", "complete", "done":
		return StatusCompleted
	case "inprogress", "running", "active":
		return StatusInProgress
	case "blocked":
		return StatusBlocked
	}
	return StatusPending
}

func normalizeNewlines(s string) string {
	if !strings.ContainsRune(s, '\r') {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// oneLine collapses all whitespace runs (newlines included) to one space.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
}

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i, count := 0, 0
	for i < len(s) && count < n-1 {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		count++
	}
	return strings.TrimRight(s[:i], " ") + "…"
}
