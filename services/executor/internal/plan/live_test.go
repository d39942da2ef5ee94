package plan

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

func event(typ string, payload map[string]any) *prpv1.Event {
	s, err := structpb.NewStruct(payload)
	if err != nil {
		panic(err)
	}
	return &prpv1.Event{RunId: "run-1", SourceInstanceId: "ri-1", SourceSeq: 7, EventType: typ, Payload: s}
}

func step(body, status string) map[string]any { return map[string]any{"step": body, "status": status} }

func TestE3_StoredEventsRenderPlanUpdatesAndRefuseOversizedPlans(t *testing.T) {
	big := strings.Repeat("x", MaxRefBytes+1)
	atBound := strings.Repeat("y", MaxRefBytes)
	tests := []struct {
		name   string
		in     *prpv1.Event
		want   *prpv1.Event // nil: unchanged
		plan   string
		planOK bool
	}{
		{"other events are untouched", event("item.completed", map[string]any{"kind": "plan", "itemId": "p1"}), nil, "", false},
		{"codex steps render as a checklist",
			event(EventPlanUpdated, map[string]any{"source": "turn_plan", "explanation": "Fix it.",
				"steps": []any{step("Read", "completed"), step("Write", "inProgress"), step("Test", "pending")}}),
			event(EventPlanUpdated, map[string]any{"source": "turn_plan",
				"markdown": "Fix it.\n\n- [x] Read\n- [ ] Write _(in progress)_\n- [ ] Test"}),
			"Fix it.\n\n- [x] Read\n- [ ] Write _(in progress)_\n- [ ] Test", true},
		{"a plan item's Markdown is kept, trimmed",
			event(EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": "\r\n# Plan\r\n\r\n1. a\r\n"}),
			event(EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": "# Plan\n\n1. a"}),
			"# Plan\n\n1. a", true},
		{"an update with nothing to show keeps no plan",
			event(EventPlanUpdated, map[string]any{"source": "turn_plan", "steps": []any{}}),
			event(EventPlanUpdated, map[string]any{"source": "turn_plan", "markdown": ""}), "", false},
		{"a plan at the bound is kept",
			event(EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": atBound}),
			nil, atBound, true},
		{"a plan over the bound is a diagnostic with the stable code",
			event(EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": big}),
			event("harness.diagnostic", map[string]any{"code": failure.NativeProviderPlanTooLarge, "originalEventType": EventPlanUpdated, "source": "plan_item",
				"message": "a provider plan of 65537 bytes exceeds the bound of 65536; it was not kept"}), "", false},
		{"steps count towards the bound",
			event(EventPlanUpdated, map[string]any{"source": "turn_plan", "explanation": atBound[:MaxRefBytes/2],
				"steps": []any{step(atBound[:MaxRefBytes/2+1], "pending")}}),
			event("harness.diagnostic", map[string]any{"code": failure.NativeProviderPlanTooLarge, "originalEventType": EventPlanUpdated, "source": "turn_plan",
				"message": "a provider plan of 65537 bytes exceeds the bound of 65536; it was not kept"}), "", false},
		{"a terminal's artifacts within the bound are untouched",
			event(EventTerminal, map[string]any{"runTerminalState": "succeeded",
				"artifacts": []any{map[string]any{"kind": prp.ArtifactKindPlan, "ref": atBound}}}), nil, "", false},
		{"a terminal's artifact over the bound keeps only its kind and the code",
			event(EventTerminal, map[string]any{"runTerminalState": "succeeded", "artifacts": []any{
				map[string]any{"kind": "other", "ref": "r"},
				map[string]any{"kind": prp.ArtifactKindPlan, "ref": big}}}),
			event(EventTerminal, map[string]any{"runTerminalState": "succeeded", "artifacts": []any{
				map[string]any{"kind": "other", "ref": "r"},
				map[string]any{"kind": prp.ArtifactKindPlan, "code": failure.NativeProviderPlanTooLarge}}}), "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig := proto.Clone(tc.in)
			out := StoredEvents([]*prpv1.Event{tc.in})
			require.Len(t, out, 1)
			require.True(t, proto.Equal(orig, tc.in), "the input is not changed")
			want := tc.want
			if want == nil {
				want = tc.in
				require.Same(t, tc.in, out[0])
			}
			require.True(t, proto.Equal(want, out[0]), "got %v", out[0])
			again := StoredEvents(out)
			require.Same(t, out[0], again[0], "the stored form is a fixed point")
			md, ok := UpdateMarkdown(out[0])
			require.Equal(t, tc.planOK, ok)
			require.Equal(t, tc.plan, md)
		})
	}
}

func TestE3_AChecklistWhoseRenderingExceedsTheBoundIsRefused(t *testing.T) {
	// 64,000 bytes of provider data that render to 66,301 bytes.
	body := strings.Repeat("é", 100) + strings.Repeat("a", 400)
	var steps []any
	for range 100 {
		steps = append(steps, step(body, "in_progress"))
	}
	in := event(EventPlanUpdated, map[string]any{"source": "turn_plan", "explanation": strings.Repeat("é", 2000), "steps": steps})
	out := StoredEvents([]*prpv1.Event{in})[0]
	require.Equal(t, "harness.diagnostic", out.GetEventType())
	require.Equal(t, failure.NativeProviderPlanTooLarge, out.GetPayload().GetFields()["code"].GetStringValue())
	require.Contains(t, out.GetPayload().GetFields()["message"].GetStringValue(), "66301 bytes")
}

func TestE3_StoredEventsKeepsOrderAndUnchangedEvents(t *testing.T) {
	a := event("turn.started", nil)
	b := event(EventPlanUpdated, map[string]any{"source": "plan_item", "markdown": "# P"})
	c := event("item.delta", map[string]any{"delta": "x"})
	in := []*prpv1.Event{a, b, c}
	out := StoredEvents(in)
	require.Len(t, out, 3)
	require.Same(t, a, out[0])
	require.Same(t, c, out[2])
	require.Same(t, b, in[1], "the caller's slice is not changed")
	unchanged := []*prpv1.Event{a, c}
	require.Equal(t, &unchanged[0], &StoredEvents(unchanged)[0], "nothing to change: the same slice")
}

func TestE3_TerminalResultExtractsThePlanOfTheResultArtifacts(t *testing.T) {
	compact := "native-provider-plan:health-check-endpoint-v1#1-register-GET-health-return-200-json-status-ok;2-add-API-tests"
	tests := []struct {
		name     string
		payload  map[string]any
		wantArts []ResultArtifact
		wantPlan string
	}{
		{"no artifacts", map[string]any{"finalMessage": "Plan: 1) a; 2) b."}, nil, ""},
		{"a compact ref", map[string]any{"artifacts": []any{map[string]any{"kind": prp.ArtifactKindPlan, "ref": compact}}},
			[]ResultArtifact{{Kind: prp.ArtifactKindPlan, Ref: compact}},
			"# Health check endpoint\n\n1. Register GET /health return 200 JSON status ok\n2. Add API tests"},
		{"an opaque ref falls back to a numbered final message",
			map[string]any{"finalMessage": "Native provider plan completed: 1) add GET /health; 2) add tests.",
				"artifacts": []any{map[string]any{"kind": prp.ArtifactKindPlan, "ref": "opaque"}}},
			[]ResultArtifact{{Kind: prp.ArtifactKindPlan, Ref: "opaque"}},
			"# Plan\n\n1. add GET /health\n2. add tests."},
		{"a refused artifact yields no plan, even from the summary",
			map[string]any{"finalMessage": "Plan: 1) a; 2) b.",
				"artifacts": []any{map[string]any{"kind": prp.ArtifactKindPlan, "code": failure.NativeProviderPlanTooLarge}}},
			[]ResultArtifact{{Kind: prp.ArtifactKindPlan, Code: failure.NativeProviderPlanTooLarge}}, ""},
		{"artifacts without a kind are dropped",
			map[string]any{"artifacts": []any{map[string]any{"ref": "x"}, "not an object"}}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			arts, md := TerminalResult(event(EventTerminal, tc.payload))
			require.Equal(t, tc.wantArts, arts)
			require.Equal(t, tc.wantPlan, md)
		})
	}
}
