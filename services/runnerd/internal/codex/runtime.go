package codex

// Server requests (provider -> client) that need an answer from outside the
// driver:
//
//   - item/commandExecution/requestApproval, item/fileChange/requestApproval
//     and item/tool/requestUserInput become runtime requests: the driver
//     emits runtime_request.created and keeps the JSON-RPC request open until
//     ResolveRequest answers it (runtime_request.resolved), the provider
//     withdraws it (runtime_request.cancelled), its turn ends or the provider
//     is lost (runtime_request.expired, replayAllowed false).
//   - item/tool/call (dynamic tools) is a tool call: the driver emits
//     semantic_tool.input and tool.execution.started and asks the session's
//     ToolHandler; a handler that does not answer at once leaves the call
//     pending until AnswerToolCall. A call that does not belong to the active
//     turn (an old run's call, e.g. re-issued after a resume) is failed at
//     once with native_tool_authority_epoch_revoked.
//
// Events (Type, priority, payload):
//
//	runtime_request.created   P0 {requestId, requestKind:"runtime", requestType:"approval"|"input", kind, method,
//	                              threadId, turnId, itemId[, command, cwd, reason, availableDecisions,
//	                              proposedExecpolicyAmendment (command approval); reason, grantRoot (file change);
//	                              questions, isBlocking (user input)], request:{schema:"tether.runtime_request.v2", …}}
//	runtime_request.resolved  P0 {requestId, requestKind, requestType, kind, turnId, itemId, resolution}
//	runtime_request.expired   P0 {requestId, requestKind, requestType, kind, turnId, itemId, reason, replayAllowed:false, request}
//	runtime_request.cancelled P0 {requestId, requestKind, requestType, kind, turnId, itemId, reason:failure.ProviderResolved}
//	semantic_tool.input       P0 {callId, requestId, tool, namespace, arguments, turnId, semantic_tool:{schema, phase:"input", …}}
//	tool.execution.started    P1 {callId, requestId, tool, namespace}
//	semantic_tool.result      P0 {callId, requestId, tool, success, contentItems, source[, code], semantic_tool:{schema, phase:"result", …}}
//	tool.execution.completed  P1 {callId, tool, success[, code]}

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// Runtime request kinds (payload "kind").
const (
	KindCommandApproval    = provider.KindCommandApproval
	KindFileChangeApproval = provider.KindFileChangeApproval
	KindUserInput          = provider.KindUserInput
)

// Schemas of the normalized request objects in runtime_request.* payloads.
const (
	RuntimeRequestSchema = prp.RuntimeRequestSchema
	QuestionSetSchema    = provider.QuestionSetSchema
	SemanticToolSchema   = provider.SemanticToolSchema
)

// Codes of runtime request and tool call failures.
const (
	approvalDecisionsDelimiter = "|"
)

// amendmentDecisions are the object decisions a command approval accepts.
var amendmentDecisions = map[string]bool{"acceptWithExecpolicyAmendment": true, "applyNetworkPolicyAmendment": true}

// serverRequest is a runtime request waiting for ResolveRequest.
type serverRequest struct {
	rawID       json.RawMessage
	requestID   string
	method      string
	kind        string
	requestType string
	turnID      string
	itemID      string
	questionIDs map[string]bool
	request     *prpv1.RuntimeRequest // normalized request object (payload "request")
}

func (r *serverRequest) basePayload() *prpv1.RuntimeRequestEvent {
	return provider.RequestBase(r.requestID, r.requestType, r.kind, r.turnID, r.itemID)
}

// ToolCall is one dynamic tool call (item/tool/call) of the provider.
type ToolCall struct {
	RequestID string // JSON-RPC id of the server request, as text
	ThreadID  string
	TurnID    string
	CallID    string
	Namespace string
	Tool      string
	Arguments json.RawMessage
}

// ToolOutput answers a tool call. ContentItems are codex content items
// ({type:"inputText", text} | {type:"inputImage", imageUrl} |
// {type:"inputAudio", audioUrl}).
type ToolOutput struct {
	Success      bool
	ContentItems []*prpv1.ToolContentItem
}

// TextOutput is a ToolOutput with one text item.
func TextOutput(success bool, text string) ToolOutput {
	return ToolOutput{Success: success, ContentItems: []*prpv1.ToolContentItem{provider.TextItem(text)}}
}

// ToolHandler decides how a tool call is answered. It runs on the reader
// goroutine and must not block: return (out, true) to answer at once (a
// built-in tool) or (_, false) to leave the call pending until
// AnswerToolCall. A nil handler leaves every call pending.
type ToolHandler func(ToolCall) (ToolOutput, bool)

// StubToolHandler is a deterministic built-in tool for tests: mock_lookup
// {"key":K} answers "lookup(K) = 42"; any other tool answers
// "<tool>(<compact arguments>) = ok".
func StubToolHandler(c ToolCall) (ToolOutput, bool) {
	if c.Tool == "mock_lookup" {
		var a struct {
			Key string `json:"key"`
		}
		_ = json.Unmarshal(c.Arguments, &a)
		return TextOutput(true, "lookup("+a.Key+") = 42"), true
	}
	var b bytes.Buffer
	if err := json.Compact(&b, c.Arguments); err != nil {
		b.Reset()
	}
	return TextOutput(true, c.Tool+"("+b.String()+") = ok"), true
}

// pendingTool is a tool call waiting for its answer.
type pendingTool struct {
	call  ToolCall
	rawID json.RawMessage
}

// requestIDText renders a JSON-RPC id as text: integers as their decimal
// (0 is a real id), strings unquoted.
func requestIDText(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	var s string
	if len(t) > 0 && t[0] == '"' && json.Unmarshal(t, &s) == nil {
		return s
	}
	return string(t)
}

// serverRequestParams holds the params of the server requests the driver
// reads; each request fills the fields of its kind (codexwire's
// CommandApprovalParams, UserInputParams, ToolCallParams; fileChange
// approvals add reason and grantRoot). Questions and the amendment stay
// raw: they travel on in the runtime request's payload as codex sent them.
type serverRequestParams struct {
	ThreadID                    string          `json:"threadId"`
	TurnID                      string          `json:"turnId"`
	ItemID                      string          `json:"itemId"`
	CallID                      string          `json:"callId"`
	Command                     string          `json:"command"`
	Cwd                         string          `json:"cwd"`
	Reason                      string          `json:"reason"`
	GrantRoot                   string          `json:"grantRoot"`
	ProposedExecpolicyAmendment json.RawMessage `json:"proposedExecpolicyAmendment"`
	AvailableDecisions          json.RawMessage `json:"availableDecisions"`
	Questions                   json.RawMessage `json:"questions"`
	IsBlocking                  *bool           `json:"isBlocking"`
	Namespace                   *string         `json:"namespace"`
	Tool                        string          `json:"tool"`
	Arguments                   json.RawMessage `json:"arguments"`
}

// handleServerRequest answers or parks a provider->client request. It runs
// on the reader goroutine.
func (s *Session) handleServerRequest(msg wireMessage) {
	var p serverRequestParams
	_ = decodeParams(msg.Params, &p) // what does not decode stays empty
	switch msg.Method {
	case codexwire.RequestCommandApproval, codexwire.RequestFileApproval, codexwire.RequestUserInput:
		s.onRuntimeRequest(msg, p)
	case codexwire.RequestToolCall:
		s.onToolCall(msg, p)
	default:
		s.answerUnsupported(msg, p)
	}
}

// rawValue is raw as a JSON value (nil when absent or null), numbers kept
// exact.
func rawValue(raw json.RawMessage) any {
	if !present(raw) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	return v
}

// payloadValue is raw as an event payload's opaque value (nil when absent,
// null or not JSON).
func payloadValue(raw json.RawMessage) *structpb.Value {
	if !present(raw) {
		return nil
	}
	v := &structpb.Value{}
	if protojson.Unmarshal(raw, v) != nil {
		return nil
	}
	if _, null := v.GetKind().(*structpb.Value_NullValue); null {
		return nil
	}
	return v
}

// answerUnsupported gives requests the driver does not handle a conservative
// answer and reports a harness.diagnostic.
func (s *Session) answerUnsupported(msg wireMessage, p serverRequestParams) {
	turnID := p.TurnID
	itemID := p.ItemID
	if itemID == "" {
		itemID = p.CallID
	}
	var result any
	var answer string
	switch msg.Method {
	case "item/permissions/requestApproval", "execCommandApproval", "applyPatchApproval":
		result = codexwire.PlainDecision("decline")
		if msg.Method != "item/permissions/requestApproval" {
			result = codexwire.PlainDecision("denied")
		}
		answer = "declined"
	case "mcpServer/elicitation/request":
		result = codexwire.ElicitationResponse{Action: "decline"}
		answer = "declined"
	default:
		answer = "rpc_error"
	}
	s.emitFromReader(Event{Type: "harness.diagnostic", TurnID: turnID, ItemID: itemID, Priority: PriorityP1, Body: &prpv1.HarnessDiagnostic{
		Code:      failure.ProviderServerRequestUnsupported,
		Method:    msg.Method,
		RequestId: requestIDText(msg.ID),
		Answer:    answer,
		Message:   "server request " + msg.Method + " is not supported; answered conservatively (" + answer + ")",
	}})
	respond := func() error { return s.respond(msg.ID, result) }
	if result == nil {
		respond = func() error { return s.respondError(msg.ID, -32601, "tether-runnerd does not support "+msg.Method) }
	}
	if err := respond(); err != nil {
		s.log.Warn("codex: cannot answer server request", "method", msg.Method, "err", err)
	}
}

func (s *Session) onRuntimeRequest(msg wireMessage, p serverRequestParams) {
	r := &serverRequest{
		rawID:     append(json.RawMessage(nil), bytes.TrimSpace(msg.ID)...),
		requestID: requestIDText(msg.ID),
		method:    msg.Method,
		turnID:    p.TurnID,
		itemID:    p.ItemID,
	}
	payload := requestPayload(r, msg.Method, p)
	s.mu.Lock()
	dup := s.serverReqs[r.requestID] != nil
	if !dup {
		s.serverReqs[r.requestID] = r
	}
	s.mu.Unlock()
	if dup {
		// Two open requests under one id cannot be told apart: refuse the
		// second one.
		s.diagnostic(failure.ProviderProtocolError, msg.Method, r.turnID, r.itemID, "server request id "+r.requestID+" is already pending; the second request is refused")
		_ = s.respondError(msg.ID, -32600, "duplicate request id "+r.requestID)
		return
	}
	s.emitFromReader(Event{Type: "runtime_request.created", TurnID: r.turnID, ItemID: r.itemID, Priority: PriorityP0, Body: payload})
}

// requestPayload fills in r's kind, type, questions and normalized request
// from the provider's request, and returns its runtime_request.created
// payload.
func requestPayload(r *serverRequest, method string, p serverRequestParams) *prpv1.RuntimeRequestEvent {
	payload := &prpv1.RuntimeRequestEvent{Method: method, ThreadId: proto.String(p.ThreadID)}
	req := &prpv1.RuntimeRequest{
		Schema: RuntimeRequestSchema, RequestKind: provider.RequestKindRuntime, RequestId: r.requestID,
		Status: provider.StatusPending, TurnId: proto.String(r.turnID), ItemId: proto.String(r.itemID),
	}
	switch method {
	case codexwire.RequestCommandApproval:
		r.kind, r.requestType = KindCommandApproval, provider.RequestTypeApproval
		payload.Command, payload.Cwd, payload.Reason = p.Command, p.Cwd, p.Reason
		payload.ProposedExecpolicyAmendment = payloadValue(p.ProposedExecpolicyAmendment)
		req.Prompt = firstNonEmpty(p.Reason, p.Command, "Approve a command")
	case codexwire.RequestFileApproval:
		r.kind, r.requestType = KindFileChangeApproval, provider.RequestTypeApproval
		payload.Reason, payload.GrantRoot = p.Reason, p.GrantRoot
		req.Prompt = firstNonEmpty(p.Reason, "Approve file changes")
	default:
		r.kind, r.requestType = KindUserInput, provider.RequestTypeInput
		var questions []codexwire.InputQuestion
		if decodeParams(p.Questions, &questions) != nil {
			questions = nil
		}
		payload.Questions = payloadValue(p.Questions).GetListValue()
		if payload.Questions == nil {
			payload.Questions = &structpb.ListValue{}
		}
		payload.IsBlocking = p.IsBlocking
		set, ids, prompt := questionSet(questions)
		r.questionIDs = ids
		req.Input = set
		req.Prompt = firstNonEmpty(prompt, "Input requested")
	}
	if r.requestType == provider.RequestTypeApproval {
		payload.AvailableDecisions = availableDecisions(p.AvailableDecisions)
	}
	req.Type = r.requestType
	r.request = req
	base := r.basePayload()
	payload.RequestId, payload.RequestKind, payload.RequestType, payload.Kind = base.RequestId, base.RequestKind, base.RequestType, base.Kind
	payload.TurnId, payload.ItemId = base.TurnId, base.ItemId
	payload.Request = req
	return payload
}

// availableDecisions lists the decisions offered: the provider's list
// (object decisions by their key) plus decline, which codex always honours.
func availableDecisions(raw json.RawMessage) []string {
	out := []string{}
	seen := map[string]bool{}
	add := func(d string) {
		if d != "" && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	var list []json.RawMessage
	if !present(raw) || json.Unmarshal(raw, &list) != nil {
		for _, d := range provider.ApprovalDecisions {
			add(d)
		}
		return out
	}
	for _, d := range list {
		var name string
		var object map[string]json.RawMessage
		switch {
		case json.Unmarshal(d, &name) == nil:
			add(name)
		case json.Unmarshal(d, &object) == nil && object != nil:
			keys := make([]string, 0, len(object))
			for k := range object {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			add(strings.Join(keys, approvalDecisionsDelimiter))
		}
	}
	add("decline")
	return out
}

// questionSet converts codex request_user_input questions to the
// tether.question_set.v1 shape the executor's durable fallback reads:
// questions with options become single_select (option ids option-<n>,
// labels kept), others text.
func questionSet(questions []codexwire.InputQuestion) (*prpv1.QuestionSet, map[string]bool, string) {
	ids := map[string]bool{}
	set := &prpv1.QuestionSet{Schema: QuestionSetSchema}
	prompt := ""
	for _, q := range questions {
		id := q.ID
		if id == "" {
			continue
		}
		ids[id] = true
		text := firstNonEmpty(q.Question, q.Header, id)
		if prompt == "" {
			prompt = text
		}
		nq := &prpv1.Question{Id: id, Prompt: text, Required: true, AnswerMode: "text", Header: q.Header}
		for i, o := range q.Options {
			nq.Options = append(nq.Options, &prpv1.QuestionOption{Id: "option-" + strconv.Itoa(i+1), Label: o.Label, Description: o.Description})
		}
		if len(q.Options) > 0 {
			nq.AnswerMode = "single_select"
		}
		set.Questions = append(set.Questions, nq)
	}
	return set, ids, prompt
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// PendingRequests returns the ids of the runtime requests still waiting.
func (s *Session) PendingRequests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.serverReqs))
	for id := range s.serverReqs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// ResolveRequest answers a pending runtime request and emits
// runtime_request.resolved before any notification that follows the answer.
//
// resolution for approvals: {"decision": "accept"|"acceptForSession"|
// "decline"|"cancel"} (a command approval also takes an object decision
// {"acceptWithExecpolicyAmendment":{…}} or {"applyNetworkPolicyAmendment":{…}});
// for user input: {"answers": {<questionId>: "text" | ["a", …] |
// {"answers": [...]}}}. Errors: runtime_request_not_pending (unknown,
// answered, expired), runtime_request_resolution_invalid, or the session
// failure. ctx is not used for the (non-blocking) write; it is checked once.
func (s *Session) ResolveRequest(ctx context.Context, requestID string, resolution provider.Resolution) (*prpv1.RuntimeRequestEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	r := s.serverReqs[requestID]
	failErr := s.failErr
	s.mu.Unlock()
	if failErr != nil {
		return nil, errorf(failure.RuntimeRequestNotPending, "runtime request %s is no longer pending: %s", requestID, failErr.Error())
	}
	if r == nil {
		return nil, errorf(failure.RuntimeRequestNotPending, "runtime request %s is not pending", requestID)
	}
	result, summary, cerr := buildResolution(r, resolution)
	if cerr != nil {
		return nil, cerr
	}

	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	if s.failErr != nil || s.serverReqs[requestID] != r {
		s.mu.Unlock()
		return nil, errorf(failure.RuntimeRequestNotPending, "runtime request %s is no longer pending", requestID)
	}
	delete(s.serverReqs, requestID)
	s.mu.Unlock()
	if err := s.respond(r.rawID, result); err != nil {
		// The transport is broken and the session is failing; put the
		// request back so the failure expires it.
		s.mu.Lock()
		if s.failErr == nil {
			s.serverReqs[requestID] = r
		}
		s.mu.Unlock()
		return nil, err
	}
	payload := r.basePayload()
	payload.Resolution = summary
	s.emitFn(Event{Type: "runtime_request.resolved", TurnID: r.turnID, ItemID: r.itemID, Priority: PriorityP0, Body: payload})
	return proto.Clone(payload).(*prpv1.RuntimeRequestEvent), nil
}

// buildResolution validates resolution for r and returns the JSON-RPC result
// and the summary reported in events.
func buildResolution(r *serverRequest, res provider.Resolution) (any, *prpv1.RuntimeResolution, *Error) {
	if r.requestType == provider.RequestTypeApproval {
		switch {
		case res.Object:
			if r.kind != KindCommandApproval || res.ObjectKeys != 1 {
				return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "an object decision must be acceptWithExecpolicyAmendment or applyNetworkPolicyAmendment on a command approval")
			}
			if !amendmentDecisions[res.Decision] {
				return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "object decision %q is not supported", res.Decision)
			}
			amendment, err := protojson.Marshal(res.Amendment)
			if err != nil {
				return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "object decision %q: %v", res.Decision, err)
			}
			object, err := json.Marshal(map[string]json.RawMessage{res.Decision: amendment})
			if err != nil {
				return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "object decision %q: %v", res.Decision, err)
			}
			return codexwire.DecisionResponse{Decision: object}, provider.ResolutionSummary(res, false), nil
		case res.Decision != "":
			if !provider.IsApprovalDecision(res.Decision) {
				return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "decision %q is not one of accept, acceptForSession, decline, cancel", res.Decision)
			}
			return codexwire.PlainDecision(res.Decision), provider.ResolutionSummary(res, false), nil
		}
		return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "an approval resolution needs a decision")
	}
	if !res.HasAnswers {
		return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "a user input resolution needs answers {questionId: text | [text] | {answers:[text]}}")
	}
	for qid := range res.Answers {
		if !r.questionIDs[qid] {
			return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "question %q was not asked", qid)
		}
	}
	if q := res.AnswersInvalid; q != "" {
		return nil, nil, errorf(failure.RuntimeRequestResolutionInvalid, "answers of %q must be text, a list of text or {answers:[text]}", q)
	}
	out := codexwire.UserInputResponse{Answers: make(map[string]codexwire.InputAnswer, len(res.Answers))}
	for qid, list := range res.Answers {
		out.Answers[qid] = codexwire.InputAnswer{Answers: list}
	}
	return out, provider.ResolutionSummary(res, true), nil
}

// onServerRequestResolved handles serverRequest/resolved: a request the
// driver did not answer was withdrawn by the provider (e.g. its turn was
// interrupted).
func (s *Session) onServerRequestResolved(p codexwire.ServerRequestResolved) {
	t := bytes.TrimSpace(p.RequestID)
	var id string
	switch {
	case len(t) > 0 && t[0] == '"':
		if json.Unmarshal(t, &id) != nil {
			return
		}
	case len(t) > 0 && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')):
		id = string(t)
	default:
		return
	}
	s.mu.Lock()
	r := s.serverReqs[id]
	delete(s.serverReqs, id)
	s.mu.Unlock()
	if r == nil {
		return
	}
	payload := r.basePayload()
	payload.Reason = failure.ProviderResolved
	s.emitFromReader(Event{Type: "runtime_request.cancelled", TurnID: r.turnID, ItemID: r.itemID, Priority: PriorityP0, Body: payload})
}

// expireRequests removes the pending runtime requests and tool calls (of one
// turn, or all when turnID is ""), emitting runtime_request.expired and
// tool.execution.completed. The caller holds emitMu and decides whether
// events may still be emitted (emit false drops them silently).
func (s *Session) expireRequests(turnID, reason string, emit bool) {
	s.mu.Lock()
	var reqs []*serverRequest
	for id, r := range s.serverReqs {
		if turnID == "" || r.turnID == turnID {
			reqs = append(reqs, r)
			delete(s.serverReqs, id)
		}
	}
	var calls []*pendingTool
	for id, c := range s.toolCalls {
		if turnID == "" || c.call.TurnID == turnID {
			calls = append(calls, c)
			delete(s.toolCalls, id)
		}
	}
	s.mu.Unlock()
	if !emit {
		return
	}
	sort.Slice(reqs, func(i, j int) bool { return lessID(reqs[i].requestID, reqs[j].requestID) })
	for _, r := range reqs {
		payload := provider.ExpiredRequest(r.basePayload(), r.request, reason)
		s.emitFn(Event{Type: "runtime_request.expired", TurnID: r.turnID, ItemID: r.itemID, Priority: PriorityP0, Body: payload})
	}
	sort.Slice(calls, func(i, j int) bool { return lessID(calls[i].call.RequestID, calls[j].call.RequestID) })
	for _, c := range calls {
		s.emitFn(Event{Type: "tool.execution.completed", TurnID: c.call.TurnID, ItemID: c.call.CallID, Priority: PriorityP1, Body: &prpv1.ToolCallEvent{
			CallId: c.call.CallID, Tool: c.call.Tool, Success: proto.Bool(false), Code: reason,
		}})
	}
}

func lessID(a, b string) bool {
	ai, errA := strconv.ParseInt(a, 10, 64)
	bi, errB := strconv.ParseInt(b, 10, 64)
	if errA == nil && errB == nil {
		return ai < bi
	}
	return a < b
}

// ---- tool calls ----

func (s *Session) onToolCall(msg wireMessage, p serverRequestParams) {
	call := ToolCall{
		RequestID: requestIDText(msg.ID),
		ThreadID:  p.ThreadID,
		TurnID:    p.TurnID,
		CallID:    p.CallID,
		Tool:      p.Tool,
		Arguments: json.RawMessage("null"),
	}
	if p.Namespace != nil {
		call.Namespace = *p.Namespace
	}
	if present(p.Arguments) {
		if b, err := json.Marshal(rawValue(p.Arguments)); err == nil {
			call.Arguments = b // compact, keys sorted
		}
	}
	args := payloadValue(p.Arguments)
	if args == nil {
		args = structpb.NewStructValue(&structpb.Struct{})
	}
	rawID := append(json.RawMessage(nil), bytes.TrimSpace(msg.ID)...)
	pt := &pendingTool{call: call, rawID: rawID}
	active, dup, activeID := s.announceTool(pt, args)
	switch {
	case !active:
		msgText := failure.NativeToolAuthorityEpochRevoked + ": tool call " + call.CallID + " belongs to turn " + strconv.Quote(call.TurnID) +
			", which is not the active turn (" + strconv.Quote(activeID) + "); its run's tool authority was revoked"
		s.finishTool(pt, TextOutput(false, msgText), "driver", failure.NativeToolAuthorityEpochRevoked)
		return
	case dup:
		s.finishTool(pt, TextOutput(false, "tool call id is empty or already pending"), "driver", failure.ProviderProtocolError)
		return
	}
	if d := s.cfg.ToolTimeout; d > 0 {
		time.AfterFunc(d, func() { s.timeoutTool(pt, d) })
	}
	if s.cfg.ToolHandler == nil {
		return
	}
	out, ok := s.cfg.ToolHandler(call)
	if !ok {
		return
	}
	s.mu.Lock()
	still := s.toolCalls[call.CallID] == pt
	if still {
		delete(s.toolCalls, call.CallID)
	}
	s.mu.Unlock()
	if still {
		s.finishTool(pt, out, "builtin", "")
	}
}

// announceTool emits a tool call's semantic_tool.input and
// tool.execution.started and, when the call belongs to the active turn and
// its id is new, makes it pending, all under emitMu: an answer can never
// find the call announced but not yet pending.
func (s *Session) announceTool(pt *pendingTool, args *structpb.Value) (active, dup bool, activeID string) {
	call := pt.call
	ns := proto.String(call.Namespace)
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	failed := s.failErr != nil
	s.mu.Unlock()
	if !failed {
		s.emitFn(Event{Type: "semantic_tool.input", TurnID: call.TurnID, ItemID: call.CallID, Priority: PriorityP0, Body: &prpv1.ToolCallEvent{
			CallId: call.CallID, RequestId: call.RequestID, Tool: call.Tool, Namespace: ns, Arguments: args, TurnId: proto.String(call.TurnID),
			SemanticTool: &prpv1.SemanticTool{
				Schema: SemanticToolSchema, Phase: "input", CallId: call.CallID, Tool: call.Tool, Namespace: ns, Arguments: args,
			},
		}})
		s.emitFn(Event{Type: "tool.execution.started", TurnID: call.TurnID, ItemID: call.CallID, Priority: PriorityP1, Body: &prpv1.ToolCallEvent{
			CallId: call.CallID, RequestId: call.RequestID, Tool: call.Tool, Namespace: ns,
		}})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	active = s.turn != nil && s.turn.id == call.TurnID && call.TurnID != ""
	if s.turn != nil {
		activeID = s.turn.id
	}
	dup = call.CallID == "" || s.toolCalls[call.CallID] != nil
	if active && !dup {
		s.toolCalls[call.CallID] = pt
	}
	return active, dup, activeID
}

// timeoutTool answers a tool call still pending after d with success false
// and semantic_tool_timeout, so the provider's turn is not held forever by a
// controller that never answers.
func (s *Session) timeoutTool(pt *pendingTool, d time.Duration) {
	s.mu.Lock()
	still := s.failErr == nil && s.toolCalls[pt.call.CallID] == pt
	if still {
		delete(s.toolCalls, pt.call.CallID)
	}
	s.mu.Unlock()
	if !still {
		return
	}
	s.log.Warn("codex: tool call unanswered; answering it as failed", "call", pt.call.CallID, "timeout", d)
	msg := fmt.Sprintf("%s: tool call %s got no result within %s", failure.SemanticToolTimeout, pt.call.CallID, d)
	s.finishTool(pt, TextOutput(false, msg), "driver", failure.SemanticToolTimeout)
}

// finishTool writes the answer of a tool call and emits its result events
// (via emitFromReader: it takes emitMu).
func (s *Session) finishTool(pt *pendingTool, out ToolOutput, source, code string) {
	if err := s.respond(pt.rawID, toolResult(out)); err != nil {
		s.log.Warn("codex: cannot answer tool call", "call", pt.call.CallID, "err", err)
		return
	}
	for _, ev := range toolResultEvents(pt.call, out, source, code) {
		s.emitFromReader(ev)
	}
}

func toolResult(out ToolOutput) codexwire.ToolCallResponse {
	items := make([]codexwire.ContentItem, 0, len(out.ContentItems))
	for _, it := range out.ContentItems {
		items = append(items, codexwire.ContentItem{Type: it.GetType(), Text: it.GetText(), ImageURL: it.GetImageUrl(), AudioURL: it.GetAudioUrl()})
	}
	return codexwire.ToolCallResponse{ContentItems: items, Success: out.Success}
}

func toolResultEvents(call ToolCall, out ToolOutput, source, code string) []Event {
	res := &prpv1.ToolCallEvent{
		CallId: call.CallID, RequestId: call.RequestID, Tool: call.Tool, Success: proto.Bool(out.Success),
		ContentItems: out.ContentItems, Source: source, Code: code,
		SemanticTool: &prpv1.SemanticTool{
			Schema: SemanticToolSchema, Phase: "result", CallId: call.CallID, Tool: call.Tool,
			Success: proto.Bool(out.Success), ContentItems: out.ContentItems,
		},
	}
	done := &prpv1.ToolCallEvent{CallId: call.CallID, Tool: call.Tool, Success: proto.Bool(out.Success), Code: code}
	return []Event{
		{Type: "semantic_tool.result", TurnID: call.TurnID, ItemID: call.CallID, Priority: PriorityP0, Body: res},
		{Type: "tool.execution.completed", TurnID: call.TurnID, ItemID: call.CallID, Priority: PriorityP1, Body: done},
	}
}

// PendingToolCalls returns the call ids of tool calls waiting for an answer.
// It takes emitMu like AnswerToolCall, so a call whose semantic_tool.input
// was already emitted is always in the list (announceTool emits, then makes
// the call pending, under emitMu).
func (s *Session) PendingToolCalls() []string {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.toolCalls))
	for id := range s.toolCalls {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// AnswerToolCall answers a pending tool call. turnID, when not empty, is the
// turn the answering authority drives: a call of another turn (an old run's
// call) is refused with native_tool_authority_epoch_revoked, as is a call
// whose turn is no longer active. Errors: tool_call_not_pending,
// tool_result_invalid, native_tool_authority_epoch_revoked.
func (s *Session) AnswerToolCall(ctx context.Context, callID, turnID string, out ToolOutput) (*prpv1.ToolCallEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, it := range out.ContentItems {
		if !provider.ValidContentItem(it) {
			return nil, errorf(failure.ToolResultInvalid, "content item type %q is not inputText, inputImage or inputAudio", it.GetType())
		}
	}
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	pt := s.toolCalls[callID]
	switch {
	case s.failErr != nil:
		s.mu.Unlock()
		return nil, errorf(failure.ToolCallNotPending, "tool call %s is no longer pending: %s", callID, s.failErr.Error())
	case pt == nil:
		s.mu.Unlock()
		return nil, errorf(failure.ToolCallNotPending, "tool call %s is not pending", callID)
	case turnID != "" && pt.call.TurnID != turnID:
		s.mu.Unlock()
		return nil, errorf(failure.NativeToolAuthorityEpochRevoked, "tool call %s belongs to turn %s, not %s", callID, pt.call.TurnID, turnID)
	case s.turn == nil || s.turn.id != pt.call.TurnID:
		s.mu.Unlock()
		return nil, errorf(failure.NativeToolAuthorityEpochRevoked, "tool call %s belongs to turn %s, which is no longer active", callID, pt.call.TurnID)
	}
	delete(s.toolCalls, callID)
	s.mu.Unlock()
	if err := s.respond(pt.rawID, toolResult(out)); err != nil {
		s.mu.Lock()
		if s.failErr == nil {
			s.toolCalls[callID] = pt
		}
		s.mu.Unlock()
		return nil, err
	}
	for _, ev := range toolResultEvents(pt.call, out, "controller", "") {
		s.emitFn(ev)
	}
	return &prpv1.ToolCallEvent{CallId: callID, TurnId: proto.String(pt.call.TurnID), Success: proto.Bool(out.Success)}, nil
}
