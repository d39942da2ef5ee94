package provider

import (
	"context"
	"encoding/json"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Runtime requests (SPEC R2, E8) are one typed model for every driver:
// the payload of runtime_request.* is a prpv1.RuntimeRequestEvent, its
// normalized request a prpv1.RuntimeRequest, the answer a Resolution, and
// a tool call's payloads a prpv1.ToolCallEvent.

// RuntimeRequestProvider is implemented by providers that can answer
// runtime requests and tool calls (codex; OpenCode answers permissions).
type RuntimeRequestProvider interface {
	// ResolveRequest answers the pending runtime request requestID; the
	// result is the runtime_request.resolved payload.
	ResolveRequest(ctx context.Context, requestID string, resolution Resolution) (*prpv1.RuntimeRequestEvent, error)
	// AnswerToolCall answers the pending tool call callID of turn turnID;
	// the result is {callId, turnId, success}.
	AnswerToolCall(ctx context.Context, callID, turnID string, success bool, contentItems []*prpv1.ToolContentItem) (*prpv1.ToolCallEvent, error)
}

// Request kinds, types and schemas of the normalized request objects.
const (
	RequestKindRuntime     = "runtime"
	RequestTypeApproval    = "approval"
	RequestTypeInput       = "input"
	KindCommandApproval    = "command_approval"
	KindFileChangeApproval = "file_change_approval"
	KindPermission         = "permission_approval"
	KindUserInput          = "user_input"
	StatusPending          = "pending"
	StatusExpired          = "expired"
	QuestionSetSchema      = "tether.question_set.v1"
	SemanticToolSchema     = "tether.prp.semantic_tool.v1"
)

// RequestBase is the identity every runtime_request.* payload starts with.
func RequestBase(requestID, requestType, kind, turnID, itemID string) *prpv1.RuntimeRequestEvent {
	return &prpv1.RuntimeRequestEvent{
		RequestId: requestID, RequestKind: RequestKindRuntime, RequestType: requestType, Kind: kind,
		TurnId: proto.String(turnID), ItemId: proto.String(itemID),
	}
}

// BaseOf is ev's identity alone (RequestBase of its fields).
func BaseOf(ev *prpv1.RuntimeRequestEvent) *prpv1.RuntimeRequestEvent {
	return &prpv1.RuntimeRequestEvent{
		RequestId: ev.GetRequestId(), RequestKind: ev.GetRequestKind(), RequestType: ev.GetRequestType(), Kind: ev.GetKind(),
		TurnId: ev.TurnId, ItemId: ev.ItemId,
	}
}

// ExpiredRequest is the payload of runtime_request.expired for a request
// announced with base (its identity) and normalized request: the reason,
// replayAllowed false and a copy of the request with status "expired"
// (SPEC R8, E5).
func ExpiredRequest(base *prpv1.RuntimeRequestEvent, request *prpv1.RuntimeRequest, reason string) *prpv1.RuntimeRequestEvent {
	out := proto.Clone(base).(*prpv1.RuntimeRequestEvent)
	out.Reason = reason
	out.ReplayAllowed = proto.Bool(false)
	if request != nil {
		req := proto.Clone(request).(*prpv1.RuntimeRequest)
		req.Status = StatusExpired
		out.Request = req
	}
	return out
}

// Resolution is a request.resolve's answer as the drivers take it:
//
//	approvals:  {"decision": "accept"|"acceptForSession"|"decline"|"cancel"}
//	            or an object decision {"decision": {<kind>: <amendment>}}
//	user input: {"answers": {<questionId>: "text" | ["a", …] | {"answers": [...]}}}
type Resolution struct {
	// Decision is a plain decision, or an object decision's kind.
	Decision string
	// Amendment is an object decision's value (Object is true).
	Amendment *structpb.Value
	Object    bool
	// ObjectKeys is the number of keys of an object decision (it must be 1).
	ObjectKeys int
	// Answers are the answers by question id; HasAnswers says whether the
	// resolution carried answers at all, AnswersInvalid names a question
	// whose answers are not text, a list of text or {answers: [text]}.
	Answers        map[string][]string
	HasAnswers     bool
	AnswersInvalid string
}

// ParseResolution reads a request.resolve's resolution object.
func ParseResolution(s *structpb.Struct) Resolution {
	var r Resolution
	f := s.GetFields()
	switch d := f["decision"].GetKind().(type) {
	case *structpb.Value_StringValue:
		r.Decision = d.StringValue
	case *structpb.Value_StructValue:
		r.Object = true
		r.ObjectKeys = len(d.StructValue.GetFields())
		keys := make([]string, 0, r.ObjectKeys)
		for k := range d.StructValue.GetFields() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) > 0 {
			r.Decision, r.Amendment = keys[0], d.StructValue.GetFields()[keys[0]]
		}
	}
	answers := f["answers"].GetStructValue()
	if answers == nil {
		return r
	}
	r.HasAnswers = true
	r.Answers = make(map[string][]string, len(answers.GetFields()))
	ids := make([]string, 0, len(answers.GetFields()))
	for id := range answers.GetFields() {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		list, ok := answerList(answers.GetFields()[id])
		if !ok && r.AnswersInvalid == "" {
			r.AnswersInvalid = id
		}
		r.Answers[id] = list
	}
	return r
}

// answerList reads one question's answers: text, a list of text or
// {answers: [text]}.
func answerList(v *structpb.Value) ([]string, bool) {
	var items []*structpb.Value
	switch x := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return []string{x.StringValue}, true
	case *structpb.Value_ListValue:
		items = x.ListValue.GetValues()
	case *structpb.Value_StructValue:
		inner, ok := x.StructValue.GetFields()["answers"].GetKind().(*structpb.Value_ListValue)
		if !ok {
			return nil, false
		}
		items = inner.ListValue.GetValues()
	default:
		return nil, false
	}
	out := []string{}
	for _, e := range items {
		s, ok := e.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return nil, false
		}
		out = append(out, s.StringValue)
	}
	return out, true
}

// ResolutionSummary is the resolution as runtime_request.resolved reports
// it: the decision (an object decision by its kind, with its amendment) or
// the answers.
func ResolutionSummary(r Resolution, input bool) *prpv1.RuntimeResolution {
	if input {
		out := &prpv1.RuntimeResolution{Answers: make(map[string]*structpb.ListValue, len(r.Answers))}
		for id, list := range r.Answers {
			l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(list))}
			for _, a := range list {
				l.Values = append(l.Values, structpb.NewStringValue(a))
			}
			out.Answers[id] = l
		}
		return out
	}
	return &prpv1.RuntimeResolution{Decision: r.Decision, Amendment: r.Amendment}
}

// DynamicTool is a caller-implemented tool offered to the provider, in
// codex's thread/start dynamicTools shape {description, inputSchema, name,
// type} (fields in that order: the JSON a tool contract digest reads).
type DynamicTool struct {
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Name        string          `json:"name"`
	Type        string          `json:"type"`
}

// TextItem is a tool answer's text content item.
func TextItem(text string) *prpv1.ToolContentItem {
	return &prpv1.ToolContentItem{Type: "inputText", Text: proto.String(text)}
}

// ValidContentItem reports whether it is inputText, inputImage or
// inputAudio.
func ValidContentItem(it *prpv1.ToolContentItem) bool {
	switch it.GetType() {
	case "inputText", "inputImage", "inputAudio":
		return true
	}
	return false
}

// ApprovalDecisions are the plain decisions every approval takes.
var ApprovalDecisions = []string{"accept", "acceptForSession", "decline", "cancel"}

// IsApprovalDecision reports whether d is one of ApprovalDecisions.
func IsApprovalDecision(d string) bool {
	return slices.Contains(ApprovalDecisions, d)
}
