package plan

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/prp"
)

func lines(ls ...string) string { return strings.Join(ls, "\n") }

// planArtifact wraps one ref as a semantic result.
func planArtifact(ref string) SemanticResult {
	return SemanticResult{Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: ref}}}
}

type semanticCase struct {
	name   string
	result SemanticResult
	want   string // "" means no plan
}

func runSemantic(t *testing.T, tests []semanticCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := SemanticMarkdown(tc.result)
			require.Equal(t, tc.want != "", ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestE3_PrefersProviderCompletedMarkdown(t *testing.T) {
	tests := []struct {
		name string
		plan ProviderPlan
		want string
	}{
		{"seed", ProviderPlan{
			Markdown:    "# Release plan\n\n1. Prepare\n2. Deploy",
			Explanation: "This fallback must not replace the completed plan.",
			Steps:       []Step{{Body: "Fallback", Status: "pending"}},
		}, "# Release plan\n\n1. Prepare\n2. Deploy"},
		{"outer whitespace and CRLF are normalised", ProviderPlan{
			Markdown: "\r\n# Release plan\r\n\r\n1. Prepare\r\n",
			Steps:    []Step{{Body: "Fallback"}},
		}, "# Release plan\n\n1. Prepare"},
		{"blank Markdown falls back to the checklist", ProviderPlan{
			Markdown: " \n\t",
			Steps:    []Step{{Body: "Fallback", Status: "pending"}},
		}, "- [ ] Fallback"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Markdown(tc.plan)
			require.True(t, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestE3_ExtractsProposedPlanFromSemanticArtifact(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("<proposed_plan>\n# Health check\n\n1. Add endpoint\n2. Verify it\n</proposed_plan>"),
			"# Health check\n\n1. Add endpoint\n2. Verify it"},
		{"surrounding prose and CRLF", planArtifact("Here is the plan:\r\n<proposed_plan>\r\n# A\r\n\r\n1. B\r\n</proposed_plan>\r\nDone."),
			"# A\n\n1. B"},
		{"the last non-empty block wins", planArtifact("<proposed_plan># Old</proposed_plan><proposed_plan># New</proposed_plan><proposed_plan> </proposed_plan>"),
			"# New"},
		{"unterminated block is not a plan", planArtifact("<proposed_plan>\n# Health check"), ""},
		{"other artifact kinds are ignored", SemanticResult{Artifacts: []Artifact{
			{Kind: "file", Ref: "<proposed_plan># No</proposed_plan>"},
		}}, ""},
		{"first decodable plan artifact wins", SemanticResult{Artifacts: []Artifact{
			{Kind: prp.ArtifactKindPlan, Ref: "opaque"},
			{Kind: prp.ArtifactKindPlan, Ref: "<proposed_plan># Second</proposed_plan>"},
			{Kind: prp.ArtifactKindPlan, Ref: "<proposed_plan># Third</proposed_plan>"},
		}}, "# Second"},
	})
}

func TestE3_DecodesCompactPlanReference(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("native-provider-plan:health-check-endpoint-v1#1-register-GET-health-return-200-json-status-ok;2-add-API-tests"),
			lines(
				"# Health check endpoint",
				"",
				"1. Register GET /health return 200 JSON status ok",
				"2. Add API tests",
			)},
		{"renumbers, skips empty steps, restores acronyms case-insensitively",
			planArtifact("native-provider-plan:api-docs-v2#3-write-api-docs;;5-POST-users-with-json-body;"),
			"# API docs\n\n1. Write API docs\n2. POST /users with JSON body"},
		{"percent-encoded words", planArtifact("native-provider-plan:release%20notes#1-draft%20them"),
			"# Release notes\n\n1. Draft them"},
		{"slug without a title", planArtifact("native-provider-plan:#1-do-it"), "# Plan\n\n1. Do it"},
		{"opaque compact reference", planArtifact("native-provider-plan:health-check-v1"), ""},
		{"steps without words", planArtifact("native-provider-plan:x#1-;2-"), ""},
	})
}

func TestE3_DecodesTaskScopedPlanURI(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("native-plan://DOT-13/health-check#1-add-GET-health;2-add-tests"),
			"# Health check\n\n1. Add GET /health\n2. Add tests"},
		{"query is ignored", planArtifact("native-plan://DOT-13/health-check?rev=2#1-add-tests"),
			"# Health check\n\n1. Add tests"},
		{"task only", planArtifact("native-plan://DOT-13#1-add-tests"), "# Plan\n\n1. Add tests"},
		{"opaque URI", planArtifact("native-plan://DOT-13/health-check"), ""},
	})
}

func TestE3_RetainsMarkdownEmbeddedAfterPlanReference(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("native-provider-plan:DOT-14-health-check-v1\n1. Add `GET /health`.\n2. Add tests."),
			"# Health check\n\n1. Add `GET /health`.\n2. Add tests."},
		{"embedded lines win over the fragment", planArtifact("native-provider-plan:DOT-14-health-check-v1#1-other\n- keep *this*"),
			"# Health check\n\n- keep *this*"},
		{"embedded document with its own heading", planArtifact("native-plan://DOT-14/x\n# Own title\n\n1. Step"),
			"# Own title\n\n1. Step"},
	})
}

func TestE3_NormalizesPlainNumberedPlan(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("1. Add GET /health. | 2. Add tests. | 3. Document it."),
			"# Plan\n\n1. Add GET /health.\n2. Add tests.\n3. Document it."},
		{"one item per line", planArtifact("1. Add GET /health\n2. Add tests"),
			"# Plan\n\n1. Add GET /health\n2. Add tests"},
		{"decimal numbers in items are text", planArtifact("1. Return 200. Then log | 2. Bump to 2. later"),
			"# Plan\n\n1. Return 200. Then log\n2. Bump to 2. later"},
		{"numbering must start at 1", planArtifact("2. Add tests | 3. Document"), ""},
		{"a Markdown document with a heading is kept", planArtifact("# Rollout\n\n- step"), "# Rollout\n\n- step"},
		{"prose is not a plan", planArtifact("We will add tests."), ""},
	})
}

func TestE3_NormalizesTaskLabelledInlineNumberedPlan(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", planArtifact("DOT-16 plan: (1) add GET /health; (2) add tests; (3) document it."),
			"# Plan\n\n1. add GET /health\n2. add tests\n3. document it."},
		{"comma list with a conjunction", planArtifact("Plan: (1) add GET /health, (2) add tests, and (3) document it."),
			"# Plan\n\n1. add GET /health\n2. add tests\n3. document it."},
		{"mixed marker styles are text", planArtifact("Plan: (1) bump to 2. later; (2) ship"),
			"# Plan\n\n1. bump to 2. later\n2. ship"},
		{"label must end with a colon", planArtifact("DOT-16 plan (1) add tests; (2) ship"), ""},
		{"empty item", planArtifact("Plan: (1) ; (2) ship"), ""},
	})
}

func TestE3_UsesExplicitlyNumberedSummaryWhenArtifactIsOpaque(t *testing.T) {
	runSemantic(t, []semanticCase{
		{"seed", SemanticResult{
			Summary:   "Native provider plan completed: 1) add GET /health; 2) add tests; 3) document it.",
			Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: "native-provider-plan:DOT-18:health-check"}},
		}, "# Plan\n\n1. add GET /health\n2. add tests\n3. document it."},
		{"a decodable artifact wins over the summary", SemanticResult{
			Summary:   "Plan: 1) from the summary",
			Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: "native-plan://DOT-18/x#1-from-the-artifact"}},
		}, "# X\n\n1. From the artifact"},
		{"no plan artifact, no plan", SemanticResult{
			Summary: "Native provider plan completed: 1) add GET /health; 2) add tests.",
		}, ""},
		{"summary that is not explicitly numbered", SemanticResult{
			Summary:   "Native provider plan completed. Add tests then document.",
			Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: "native-provider-plan:DOT-18:health-check"}},
		}, ""},
		{"summary numbering that skips", SemanticResult{
			Summary:   "Plan: 1) add tests; 3) document it.",
			Artifacts: []Artifact{{Kind: prp.ArtifactKindPlan, Ref: "native-provider-plan:DOT-18:health-check"}},
		}, "# Plan\n\n1. add tests; 3) document it."},
	})
}

func TestE3_RendersBoundedChecklistWithoutProvenance(t *testing.T) {
	seed := ProviderPlan{
		Explanation: "Release safely",
		Steps: []Step{
			{Body: "Prepare", Status: "completed"},
			{Body: "Deploy", Status: "in_progress"},
			{Body: "Verify", Status: "blocked"},
		},
		RunID:            "must-not-appear",
		ProviderThreadID: "native-secret",
	}
	many := ProviderPlan{}
	for range MaxSteps + 3 {
		many.Steps = append(many.Steps, Step{Body: "s", Status: "pending"})
	}
	manyWant := strings.TrimSuffix(strings.Repeat("- [ ] s\n", MaxSteps), "\n") + "\n_… and 3 more steps_"

	tests := []struct {
		name string
		plan ProviderPlan
		want string
	}{
		{"seed", seed, lines(
			"Release safely",
			"",
			"- [x] Prepare",
			"- [ ] Deploy _(in progress)_",
			"- [ ] Verify _(blocked)_",
		)},
		{"status spellings", ProviderPlan{Steps: []Step{
			{Body: "a", Status: "inProgress"}, {Body: "b", Status: "done"}, {Body: "c", Status: "PENDING"},
			{Body: "d", Status: "mystery"}, {Body: "e"},
		}}, lines("- [ ] a _(in progress)_", "- [x] b", "- [ ] c", "- [ ] d", "- [ ] e")},
		{"bodies fold onto one line; blank bodies are skipped", ProviderPlan{Steps: []Step{
			{Body: "  multi\nline\n\n- [x] injected  "}, {Body: " \n "},
		}}, "- [ ] multi line - [x] injected"},
		{"explanation only", ProviderPlan{Explanation: " Just this \n"}, "Just this"},
		{"long bodies are truncated", ProviderPlan{Steps: []Step{{Body: strings.Repeat("x", MaxStepRunes+10)}}},
			"- [ ] " + strings.Repeat("x", MaxStepRunes-1) + "…"},
		{"bounded step count", many, manyWant},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Markdown(tc.plan)
			require.True(t, ok)
			require.Equal(t, tc.want, got)
			require.NotContains(t, got, "must-not-appear")
			require.NotContains(t, got, "native-secret")
		})
	}
	t.Run("nothing to render", func(t *testing.T) {
		got, ok := Markdown(ProviderPlan{RunID: "must-not-appear", Steps: []Step{{Body: " "}}})
		require.False(t, ok)
		require.Empty(t, got)
	})
}
