package plan

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/prp"
)

// FuzzPlanMarkdown feeds arbitrary refs and summaries to the plan-reference
// parser. It must never panic, and whatever it returns must be a non-empty,
// valid UTF-8 document that is the same on every call. The committed corpus
// lives in testdata/fuzz/FuzzPlanMarkdown.
func FuzzPlanMarkdown(f *testing.F) {
	f.Add("native-provider-plan:health-check-endpoint-v1#1-register-GET-health-return-200-json-status-ok;2-add-API-tests", "")
	f.Add("DOT-16 plan: (1) add GET /health; (2) add tests; (3) document it.", "")
	f.Add("native-provider-plan:DOT-18:health-check", "Native provider plan completed: 1) add GET /health; 2) add tests; 3) document it.")
	f.Fuzz(func(t *testing.T, ref, summary string) {
		r := SemanticResult{Summary: summary, Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: ref}}}
		md, ok := SemanticMarkdown(r)
		check(t, md, ok, ref, summary)
		again, ok2 := SemanticMarkdown(r)
		if again != md || ok2 != ok {
			t.Fatalf("not deterministic: %q/%v then %q/%v", md, ok, again, ok2)
		}
		md, ok = RefMarkdown(ref)
		check(t, md, ok, ref, summary)
		md, ok = SummaryMarkdown(summary)
		check(t, md, ok, ref, summary)
		md, ok = Markdown(ProviderPlan{Explanation: summary, Steps: []Step{{Body: ref, Status: summary}}})
		check(t, md, ok, ref, summary)
		md, ok = Markdown(ProviderPlan{Markdown: ref, Explanation: summary})
		check(t, md, ok, ref, summary)
	})
}

func check(t *testing.T, md string, ok bool, ref, summary string) {
	t.Helper()
	if ok != (md != "") {
		t.Fatalf("ok=%v with markdown %q (ref %q, summary %q)", ok, md, ref, summary)
	}
	if ok && !utf8.ValidString(md) {
		t.Fatalf("invalid UTF-8 %q (ref %q, summary %q)", md, ref, summary)
	}
	if ok && strings.TrimSpace(md) != md {
		t.Fatalf("untrimmed %q (ref %q, summary %q)", md, ref, summary)
	}
}
