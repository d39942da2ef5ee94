package api

import (
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// RedactedValue replaces the value of every configured provider environment
// variable in a run read back through the API (SubmitRun, GetRun,
// ListRuns). Configured variables carry credentials (OPENAI_API_KEY, ...):
// the run keeps them for its attempts, but no caller reads them back; the
// names stay visible.
const RedactedValue = "[redacted]"

// visible is run as callers see it: configured environment values redacted.
// run itself is not changed (it may be shared); a copy is made only when
// there is something to redact.
func visible(run *executorv1.Run) *executorv1.Run {
	if len(run.GetInput().GetEnvironment().GetConfigured()) == 0 {
		return run
	}
	out := proto.CloneOf(run)
	conf := out.GetInput().GetEnvironment().GetConfigured()
	for k := range conf {
		conf[k] = RedactedValue
	}
	return out
}

func visibleRuns(runs []*executorv1.Run) []*executorv1.Run {
	out := make([]*executorv1.Run, len(runs))
	for i, r := range runs {
		out[i] = visible(r)
	}
	return out
}
