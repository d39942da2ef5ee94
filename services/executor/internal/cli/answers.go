package cli

import (
	"fmt"
	"strings"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
)

// Repeated is a repeatable string flag.
type Repeated []string

func (r *Repeated) String() string { return strings.Join(*r, " ") }

// Set adds one value.
func (r *Repeated) Set(v string) error {
	*r = append(*r, v)
	return nil
}

// Answers builds interaction answers from QUESTION=OPTION[,OPTION] picks and
// QUESTION=TEXT free-text answers.
func Answers(picks, texts []string) ([]*executorv1.InteractionAnswer, error) {
	var out []*executorv1.InteractionAnswer
	for _, p := range picks {
		q, opts, ok := strings.Cut(p, "=")
		if !ok || q == "" || opts == "" {
			return nil, fmt.Errorf("-answer %q: want QUESTION=OPTION[,OPTION]", p)
		}
		out = append(out, &executorv1.InteractionAnswer{QuestionId: q, OptionIds: strings.Split(opts, ",")})
	}
	for _, t := range texts {
		q, text, ok := strings.Cut(t, "=")
		if !ok || q == "" {
			return nil, fmt.Errorf("-text %q: want QUESTION=TEXT", t)
		}
		out = append(out, &executorv1.InteractionAnswer{QuestionId: q, OptionIds: []string{runtimeq.TextOptionID}, Text: text})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("at least one -answer or -text is required")
	}
	return out, nil
}
