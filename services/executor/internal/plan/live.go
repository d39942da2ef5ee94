package plan

import (
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// Runner events this file reads. A runner reports a provider plan update as
// EventPlanUpdated with the provider's own data:
//
//	{source: "turn_plan", explanation?, steps: [{step, status}]}   codex turn/plan/updated
//	{source: "plan_item", markdown}                                 a completed codex plan item
//
// and the turn's semantic artifacts on its EventTerminal as
// artifacts: [{kind, ref}].
const (
	EventPlanUpdated = prp.EventRunPlanUpdated
	EventTerminal    = prp.EventRunTerminal
	eventDiagnostic  = prp.EventHarnessDiagnostic
)

// StoredEvents returns events as the executor stores them, with the E3 rules
// applied (events it does not change are returned as they are; changed ones
// are copies):
//
//   - a run.plan_updated carries the rendered Markdown instead of the
//     provider's data: {source, markdown} ([Markdown]);
//   - a run.plan_updated whose data or rendering is larger than MaxRefBytes
//     becomes a harness.diagnostic {code: native_provider_plan_too_large, ...};
//   - an artifact of a run.terminal whose ref is larger than MaxRefBytes
//     keeps only {kind, code: native_provider_plan_too_large}.
//
// The result depends only on each event's bytes, so a replayed event is
// stored identically, and applying it to its own output changes nothing.
func StoredEvents(events []*prpv1.Event) []*prpv1.Event {
	var out []*prpv1.Event
	for i, ev := range events {
		stored := storedEvent(ev)
		if stored == ev && out == nil {
			continue
		}
		if out == nil {
			out = append(make([]*prpv1.Event, 0, len(events)), events[:i]...)
		}
		out = append(out, stored)
	}
	if out == nil {
		return events
	}
	return out
}

func storedEvent(ev *prpv1.Event) *prpv1.Event {
	switch ev.GetEventType() {
	case EventPlanUpdated:
		return storedPlanUpdate(ev)
	case EventTerminal:
		return storedTerminal(ev)
	}
	return ev
}

func storedPlanUpdate(ev *prpv1.Event) *prpv1.Event {
	f := ev.GetPayload().GetFields()
	source := strings.ToValidUTF8(f["source"].GetStringValue(), "\uFFFD")
	p := ProviderPlan{
		Markdown:    f["markdown"].GetStringValue(),
		Explanation: f["explanation"].GetStringValue(),
	}
	size := len(p.Markdown) + len(p.Explanation)
	for _, v := range f["steps"].GetListValue().GetValues() {
		s := v.GetStructValue().GetFields()
		body := s["step"].GetStringValue()
		p.Steps = append(p.Steps, Step{Body: body, Status: s["status"].GetStringValue()})
		size += len(body)
	}
	md, _ := Markdown(p)
	// The rendered checklist may be a little longer than the provider's
	// data; bounding both keeps what is stored within the bound (and so a
	// fixed point).
	size = max(size, len(md))
	out := proto.CloneOf(ev)
	if size > MaxRefBytes {
		out.EventType = eventDiagnostic
		out.Payload = mustStruct(map[string]any{
			"code":              failure.NativeProviderPlanTooLarge,
			"message":           "a provider plan of " + strconv.Itoa(size) + " bytes exceeds the bound of " + strconv.Itoa(MaxRefBytes) + "; it was not kept",
			"originalEventType": EventPlanUpdated,
			"source":            source,
		})
		return out
	}
	payload := map[string]any{"markdown": md}
	if source != "" {
		payload["source"] = source
	}
	out.Payload = mustStruct(payload)
	if proto.Equal(out, ev) {
		return ev
	}
	return out
}

func storedTerminal(ev *prpv1.Event) *prpv1.Event {
	arts := ev.GetPayload().GetFields()["artifacts"].GetListValue().GetValues()
	var out *prpv1.Event
	for i, v := range arts {
		a := v.GetStructValue().GetFields()
		if len(a["ref"].GetStringValue()) <= MaxRefBytes {
			continue
		}
		if out == nil {
			out = proto.CloneOf(ev)
		}
		out.Payload.Fields["artifacts"].GetListValue().Values[i] = structpb.NewStructValue(mustStruct(map[string]any{
			"kind": strings.ToValidUTF8(a["kind"].GetStringValue(), "\uFFFD"), "code": failure.NativeProviderPlanTooLarge,
		}))
	}
	if out == nil {
		return ev
	}
	return out
}

// UpdateMarkdown returns the rendered plan of a stored run.plan_updated
// event; ok is false for any other event or an update with nothing to show.
func UpdateMarkdown(ev *prpv1.Event) (md string, ok bool) {
	if ev.GetEventType() != EventPlanUpdated {
		return "", false
	}
	md = ev.GetPayload().GetFields()["markdown"].GetStringValue()
	return md, md != ""
}

// ResultArtifact is one artifact of a run's result as stored: a refused
// artifact has a Code and no Ref.
type ResultArtifact struct {
	Kind, Ref, Code string
}

// TerminalResult reads the semantic result of a stored run.terminal: its
// artifacts, and the plan their native_provider_plan artifact carries
// ([SemanticMarkdown], with the final message as the result summary).
func TerminalResult(ev *prpv1.Event) (arts []ResultArtifact, md string) {
	f := ev.GetPayload().GetFields()
	var r SemanticResult
	for _, v := range f["artifacts"].GetListValue().GetValues() {
		a := v.GetStructValue().GetFields()
		ra := ResultArtifact{Kind: a["kind"].GetStringValue(), Ref: a["ref"].GetStringValue(), Code: a["code"].GetStringValue()}
		if ra.Kind == "" {
			continue
		}
		arts = append(arts, ra)
		if ra.Code == "" {
			r.Artifacts = append(r.Artifacts, Artifact{Kind: ra.Kind, Ref: ra.Ref})
		}
	}
	if len(r.Artifacts) == 0 {
		return arts, ""
	}
	r.Summary = f["finalMessage"].GetStringValue()
	md, _ = SemanticMarkdown(r)
	return arts, md
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic("plan: " + err.Error()) // only strings: cannot fail
	}
	return s
}
