package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/executor/internal/livesession"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// liveSession is the livesession.Session of one Attach stream: it knows the
// provider's active turn from the relayed events and sends steering and
// runtime-request resolutions as runner commands, waiting for their results.
type liveSession struct {
	claim *store.Claim
	send  func(*gatewayv1.AttachRequest) error // serialised by the caller
	// toolEpoch is the scope's tool authority epoch the gateway gave this
	// attachment: tool results and runtime-request answers carry it, and
	// the gateway refuses them once it is revoked (SPEC E13, S1).
	toolEpoch uint64

	mu      sync.Mutex
	turn    string
	pending map[string]chan *prpv1.CommandResult
	// answering maps the runner's event that settles an answer (see
	// observe: "request:<id>" for a runtime request's resolution,
	// "tool:<callId>" for a tool call's result) to the command carrying
	// the answer. That event comes before anything the answer caused —
	// also before a run.terminal that ends the stream ahead of the
	// command's result when the provider finishes at once — so it
	// completes the waiting call as well.
	answering map[string]string
}

func newLiveSession(c *store.Claim, send func(*gatewayv1.AttachRequest) error, toolEpoch uint64) *liveSession {
	return &liveSession{claim: c, send: send, toolEpoch: toolEpoch, pending: map[string]chan *prpv1.CommandResult{}, answering: map[string]string{}}
}

// withToolEpoch stamps a tool result or runtime-request answer with the
// attachment's tool authority epoch.
func (l *liveSession) withToolEpoch(cmd *prpv1.Command) *prpv1.Command {
	if l.toolEpoch != 0 {
		cmd.ControllerEpoch = strconv.FormatUint(l.toolEpoch, 10)
	}
	return cmd
}

var _ livesession.Session = (*liveSession)(nil)

// observe tracks the provider's active turn from relayed events.
func (l *liveSession) observe(ev *prpv1.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ev.GetEventType() {
	case prp.EventTurnStarted:
		var p prpv1.TurnStarted
		if prp.DecodePayload(ev, &p) == nil && p.GetProviderTurnId() != "" {
			l.turn = p.GetProviderTurnId()
		} else {
			l.turn = ev.GetTurnId()
		}
	case prp.EventTurnCompleted, prp.EventTurnFailed, prp.EventTurnInterrupted, prp.EventTurnCancelled, prp.EventRunTerminal:
		l.turn = ""
	case prp.EventRuntimeRequestResolved:
		l.answered("request:" + ev.GetPayload().GetFields()["requestId"].GetStringValue())
	case prp.EventToolResult:
		if f := ev.GetPayload().GetFields(); f["source"].GetStringValue() == "controller" {
			l.answered("tool:" + f["callId"].GetStringValue())
		}
	}
}

// answered completes the call waiting for the answer key names; under l.mu.
func (l *liveSession) answered(key string) {
	cid, ok := l.answering[key]
	if !ok {
		return
	}
	delete(l.answering, key)
	if ch, ok := l.pending[cid]; ok {
		delete(l.pending, cid)
		ch <- &prpv1.CommandResult{CommandId: cid, Status: "completed"}
	}
}

// answer registers that the runner's event named by key settles command
// commandID (see answering); the returned func forgets it.
func (l *liveSession) answer(key, commandID string) func() {
	l.mu.Lock()
	l.answering[key] = commandID
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		if l.answering[key] == commandID {
			delete(l.answering, key)
		}
		l.mu.Unlock()
	}
}

// result hands a command result to its waiter; false when nobody waits.
func (l *liveSession) result(r *prpv1.CommandResult) bool {
	l.mu.Lock()
	ch, ok := l.pending[r.GetCommandId()]
	delete(l.pending, r.GetCommandId())
	l.mu.Unlock()
	if ok {
		ch <- r
	}
	return ok
}

// providerCapabilities is what each provider's driver offers: the codex
// app-server steering and runtime-request resolution; OpenCode runtime
// requests (its permission requests) but no steering (SPEC R10).
var providerCapabilities = map[string]livesession.Capabilities{
	"codex":    {Steering: true, RuntimeRequestResolution: true},
	"opencode": {RuntimeRequestResolution: true},
}

// Capabilities reports the run's provider's capabilities.
func (l *liveSession) Capabilities(context.Context) (livesession.Capabilities, error) {
	return providerCapabilities[l.claim.Input.GetProvider().GetKind()], nil
}

// ActiveTurnID returns the provider's active turn, "" when none.
func (l *liveSession) ActiveTurnID(context.Context) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.turn, nil
}

func (l *liveSession) call(ctx context.Context, cmd *prpv1.Command) (*prpv1.CommandResult, error) {
	ch := make(chan *prpv1.CommandResult, 1)
	l.mu.Lock()
	l.pending[cmd.GetCommandId()] = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.pending, cmd.GetCommandId())
		l.mu.Unlock()
	}()
	if err := l.send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: cmd}}); err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.RunnerDisconnected, "sending %s: %v", cmd.GetType(), err)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Steer sends turn.steer and waits for the runner's result.
func (l *liveSession) Steer(ctx context.Context, in livesession.SteerInput) error {
	id := in.CorrelationID
	if id == "" {
		id = store.NewID("steer-")
	}
	cmd := newCommand(l.claim, &prpv1.TurnSteer{Text: in.Message.Text, ExpectedTurnId: in.TurnID, CorrelationId: in.CorrelationID})
	cmd.CommandId = fmt.Sprintf("%s/steer/%s", l.claim.RunID, id)
	r, err := l.call(ctx, cmd)
	if err != nil {
		return err
	}
	switch {
	case r.GetStatus() == "completed":
		return nil
	case r.GetCode() == failure.NoActiveTurn || r.GetCode() == failure.TurnMismatch:
		return failure.Newf(failure.SteeringStaleTurn, "stale: the active turn changed: %s", r.GetMessage())
	case r.GetCode() == failure.CommandUnsupported:
		return failure.Newf(failure.SteeringUnsupported, "unsupported: %s", r.GetMessage())
	}
	return failure.Newf(failure.SteeringRejected, "%s: %s", r.GetCode(), r.GetMessage())
}

// ResolveRuntimeRequest sends request.resolve with the reservation's
// command id and waits for the runner's result.
func (l *liveSession) ResolveRuntimeRequest(ctx context.Context, commandID, requestID, turnID string, resolution map[string]any) error {
	res, err := structpb.NewStruct(resolution)
	if err != nil {
		return err
	}
	cmd := newCommand(l.claim, &prpv1.RequestResolve{RequestId: requestID, TurnId: turnID, Resolution: res})
	cmd.CommandId = commandID
	defer l.answer("request:"+requestID, commandID)()
	r, err := l.call(ctx, l.withToolEpoch(cmd))
	if err != nil {
		return err
	}
	if r.GetStatus() != "completed" {
		code := failure.Reason(r.GetCode())
		if code == "" {
			code = failure.RuntimeRequestRejected
		}
		// The registry's gRPC code: a malformed answer
		// (runtime_request_resolution_invalid) is the caller's error,
		// InvalidArgument; the run's state (not pending, stale turn) is
		// FailedPrecondition, as is a runner code the registry lacks.
		c := code.GRPC()
		if c == codes.Unknown {
			c = codes.FailedPrecondition
		}
		return failure.New(c, code, "%s", r.GetMessage())
	}
	return nil
}

// CompleteToolCall sends tool.result for a dynamic tool call and waits for
// the runner's result (the runner refuses a call of another turn with
// native_tool_authority_epoch_revoked).
func (l *liveSession) CompleteToolCall(ctx context.Context, callID string, success bool, text string) (string, error) {
	cmd := newCommand(l.claim, &prpv1.ToolResult{CallId: callID, Success: proto.Bool(success), Text: proto.String(text)})
	cmd.CommandId = fmt.Sprintf("%s/tool/%s", l.claim.RunID, callID)
	defer l.answer("tool:"+callID, cmd.GetCommandId())()
	r, err := l.call(ctx, l.withToolEpoch(cmd))
	if err != nil {
		return "", err
	}
	if r.GetStatus() != "completed" {
		code := failure.Reason(r.GetCode())
		if code == "" {
			code = failure.ToolResultRejected
		}
		return "", failure.New(codes.FailedPrecondition, code, "%s", r.GetMessage())
	}
	return cmd.GetCommandId(), nil
}
