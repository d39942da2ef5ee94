package runner

// Runtime requests and tool calls (SPEC R2, E8). The provider driver emits
// runtime_request.created when the provider asks for an approval or user
// input, and semantic_tool.input / tool.execution.started when it calls a
// dynamic tool; they reach the controller like every other provider event.
// The controller answers with two commands, journaled like all commands
// (executed at most once per command id; a resend gets the stored result):
//
//	request.resolve {requestId, resolution[, turnId]}
//	    requestId   the runtime request's id (text; a JSON number is accepted)
//	    resolution  approvals: {"decision": "accept"|"acceptForSession"|"decline"|"cancel"}
//	                user input: {"answers": {<questionId>: "text" | ["a", …] | {"answers": [...]}}}
//	    turnId      optional; must name the active turn (runtime_request_stale_turn)
//	    result      {requestId, requestKind, requestType, kind, turnId, itemId, resolution}
//
//	tool.result {callId, success?, text? | contentItems?}
//	    success      default true
//	    text         one inputText content item, or
//	    contentItems [{type:"inputText", text} | {type:"inputImage", imageUrl} | {type:"inputAudio", audioUrl}]
//	    result       {callId, turnId, success}
//
// Rejections (no effect): no_active_turn, runtime_request_stale_turn,
// runtime_request_not_pending, runtime_request_resolution_invalid,
// runtime_request_resolution_unsupported, tool_call_not_pending,
// tool_result_invalid, native_tool_authority_epoch_revoked (the command's run
// is not the run whose turn made the call: an old run's answer after a
// continuation), plus the usual command_invalid / run_not_attached /
// runner_attempt_fenced.

import (
	"context"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provider"

	"google.golang.org/protobuf/proto"
)

// Command types of runtime request resolution and tool results.
const (
	CmdRequestResolve = prp.CommandRequestResolve
	CmdToolResult     = prp.CommandToolResult
)

// providerRejection maps driver errors that had no effect to a rejection.
func providerRejection(fallback string, err error) *cmdError {
	switch code := ProviderErrorCode(err); code {
	case failure.RuntimeRequestNotPending, failure.RuntimeRequestResolutionInvalid, failure.ToolCallNotPending, failure.ToolResultInvalid, failure.NativeToolAuthorityEpochRevoked:
		return &cmdError{runnerstate.StatusRejected, code, err.Error()}
	}
	return providerFailure(fallback, err)
}

func (r *Runner) activeRuntimeProvider() (RuntimeRequestProvider, *cmdError) {
	t := r.st.ActiveTurn
	if t == nil || r.sup.prov == nil {
		return nil, rejected(failure.NoActiveTurn, "no turn is active")
	}
	rp, ok := r.sup.prov.(RuntimeRequestProvider)
	if !ok {
		return nil, rejected(failure.RuntimeRequestResolutionUnsupported, "the provider cannot answer runtime requests")
	}
	return rp, nil
}

func (r *Runner) cmdRequestResolve(c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.requireRun(c); e != nil {
		return nil, e
	}
	body, err := prp.RequestResolveOf(c)
	if err != nil {
		return nil, bodyInvalid(err)
	}
	requestID := body.GetRequestId()
	if requestID == "" || len(requestID) > 160 {
		return nil, rejected(failure.CommandInvalid, "request.resolve needs payload.requestId (1..160)")
	}
	resolution := body.GetResolution()
	if resolution == nil {
		return nil, rejected(failure.CommandInvalid, "request.resolve needs payload.resolution (an object)")
	}
	rp, e := r.activeRuntimeProvider()
	if e != nil {
		return nil, e
	}
	t := r.st.ActiveTurn
	if want := body.GetTurnId(); want != "" && want != t.TurnID {
		return nil, staleTurn(failure.RuntimeRequestStaleTurn, want, t.TurnID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	res, err := rp.ResolveRequest(ctx, requestID, provider.ParseResolution(resolution))
	r.pumpProviderEvents()
	if err != nil {
		return nil, providerRejection("provider_request_resolve_failed", err)
	}
	return res, nil
}

func (r *Runner) cmdToolResult(c *prpv1.Command) (proto.Message, *cmdError) {
	// The answering run must be the run whose turn made the call: an old
	// run's answer after a continuation is refused as revoked.
	if cur := r.st.CurrentRun; cur != nil && c.GetRunId() != "" && c.GetRunId() != cur.RunID {
		return nil, rejected(failure.NativeToolAuthorityEpochRevoked, "run %s no longer holds the tool authority (current run: %s)", c.GetRunId(), cur.RunID)
	}
	if e := r.requireRun(c); e != nil {
		return nil, e
	}
	body, err := prp.ToolResultOf(c)
	if err != nil {
		return nil, rejected(failure.CommandInvalid, "tool.result payload: %v", err)
	}
	callID := body.GetCallId()
	if callID == "" || len(callID) > 160 {
		return nil, rejected(failure.CommandInvalid, "tool.result needs payload.callId (1..160)")
	}
	success := body.Success == nil || body.GetSuccess()
	items := []*prpv1.ToolContentItem{}
	if l := body.GetContentItems(); len(l) > 0 {
		for _, m := range l {
			var it prpv1.ToolContentItem
			if err := prp.DecodeStruct(m, &it); err != nil {
				return nil, rejected(failure.ToolResultInvalid, "tool.result content item: %v", err)
			}
			items = append(items, &it)
		}
	} else if body.Text != nil {
		items = append(items, provider.TextItem(body.GetText()))
	}
	rp, e := r.activeRuntimeProvider()
	if e != nil {
		return nil, e
	}
	t := r.st.ActiveTurn
	if t.RunID != c.GetRunId() && c.GetRunId() != "" {
		return nil, rejected(failure.NativeToolAuthorityEpochRevoked, "the active turn belongs to run %s", t.RunID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	res, err := rp.AnswerToolCall(ctx, callID, t.TurnID, success, items)
	r.pumpProviderEvents()
	if err != nil {
		return nil, providerRejection("provider_tool_result_failed", err)
	}
	return res, nil
}
