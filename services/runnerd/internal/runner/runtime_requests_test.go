package runner

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// rrProvider adds runtime request answers to the fake provider.
type rrProvider struct {
	*fakeProvider
	mu       sync.Mutex
	resolved []string
	tools    []string
}

func (p *rrProvider) ResolveRequest(ctx context.Context, requestID string, resolution provider.Resolution) (*prpv1.RuntimeRequestEvent, error) {
	if requestID != "0" {
		return nil, &ProviderError{Code: failure.RuntimeRequestNotPending, Message: "runtime request " + requestID + " is not pending"}
	}
	d := resolution.Decision
	if d == "" {
		return nil, &ProviderError{Code: failure.RuntimeRequestResolutionInvalid, Message: "no decision"}
	}
	p.mu.Lock()
	p.resolved = append(p.resolved, requestID+":"+d)
	p.mu.Unlock()
	out := &prpv1.RuntimeRequestEvent{RequestId: requestID, Resolution: provider.ResolutionSummary(resolution, false)}
	p.emit(ProviderEvent{Type: "runtime_request.resolved", TurnID: "turn-1", Priority: P0, Body: out})
	return out, nil
}

func (p *rrProvider) AnswerToolCall(ctx context.Context, callID, turnID string, success bool, items []*prpv1.ToolContentItem) (*prpv1.ToolCallEvent, error) {
	if callID != "call-1" {
		return nil, &ProviderError{Code: failure.ToolCallNotPending, Message: "tool call " + callID + " is not pending"}
	}
	text := items[0].GetText()
	p.mu.Lock()
	p.tools = append(p.tools, callID+"@"+turnID+":"+text)
	p.mu.Unlock()
	return &prpv1.ToolCallEvent{CallId: callID, TurnId: proto.String(turnID), Success: proto.Bool(success)}, nil
}

func rrStarter(e *testEnv) func(*Config) {
	return func(c *Config) {
		c.StartProvider = func(ctx context.Context, cfg ProviderConfig, emit func(ProviderEvent)) (Provider, error) {
			p, err := e.prov.start(ctx, cfg, emit)
			if err != nil {
				return nil, err
			}
			return &rrProvider{fakeProvider: p.(*fakeProvider)}, nil
		}
	}
}

func TestR2_RequestResolveCommandReachesTheProviderOnce(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(rrStarter(e))
	e.gw.waitConns(1)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}

	// No turn yet: nothing to resolve.
	res := e.gw.command(cs.attach("c-attach"))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(cs.next("c-r0", CmdRequestResolve, map[string]any{"requestId": "0", "resolution": map[string]any{"decision": "accept"}}))
	assert.Equal(t, failure.NoActiveTurn, res.GetCode())

	res = e.gw.command(cs.next("c-turn1", CmdTurnStart, map[string]any{"text": "hello"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	for _, tc := range []struct {
		id, code string
		payload  map[string]any
	}{
		{"c-bad1", failure.CommandInvalid, map[string]any{"resolution": map[string]any{"decision": "accept"}}},
		{"c-bad2", failure.CommandInvalid, map[string]any{"requestId": "0"}},
		{"c-bad3", failure.RuntimeRequestStaleTurn, map[string]any{"requestId": "0", "turnId": "turn-9", "resolution": map[string]any{"decision": "accept"}}},
		{"c-bad4", failure.RuntimeRequestNotPending, map[string]any{"requestId": "5", "resolution": map[string]any{"decision": "accept"}}},
		{"c-bad5", failure.RuntimeRequestResolutionInvalid, map[string]any{"requestId": "0", "resolution": map[string]any{}}},
	} {
		res = e.gw.command(cs.next(tc.id, CmdRequestResolve, tc.payload))
		assert.Equal(t, runnerstate.StatusRejected, res.GetStatus(), tc.id)
		assert.Equal(t, tc.code, res.GetCode(), tc.id)
	}

	// requestId 0 given as a JSON number is the same request "0".
	cmd := cs.next("c-resolve", CmdRequestResolve, map[string]any{"requestId": 0.0, "turnId": "turn-1", "resolution": map[string]any{"decision": "accept"}})
	res = e.gw.command(cmd)
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, "0", res.GetResult().GetFields()["requestId"].GetStringValue())
	// A resend of the same command id gets the stored result, no second effect.
	res = e.gw.command(cmd)
	assert.Equal(t, runnerstate.StatusCompleted, res.GetStatus())
	ev := e.gw.waitEvent("runtime_request.resolved", 1)
	assert.Equal(t, "turn-1", ev.GetTurnId())
	assert.Equal(t, "run-1", ev.GetRunId())
	assert.Len(t, e.gw.eventsOf("runtime_request.resolved"), 1)
}

func TestR2_ToolResultCommandAndRevokedAuthority(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	rpCh := make(chan *rrProvider, 1)
	e.start(func(c *Config) {
		c.StartProvider = func(ctx context.Context, cfg ProviderConfig, emit func(ProviderEvent)) (Provider, error) {
			p, err := e.prov.start(ctx, cfg, emit)
			if err != nil {
				return nil, err
			}
			rp := &rrProvider{fakeProvider: p.(*fakeProvider)}
			rpCh <- rp
			return rp, nil
		}
	})
	e.gw.waitConns(1)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	rp := <-rpCh

	res := e.gw.command(cs.next("c-tool0", CmdToolResult, map[string]any{"text": "x"}))
	assert.Equal(t, failure.CommandInvalid, res.GetCode())
	res = e.gw.command(cs.next("c-tool1", CmdToolResult, map[string]any{"callId": "call-9", "text": "x"}))
	assert.Equal(t, failure.ToolCallNotPending, res.GetCode())
	res = e.gw.command(cs.next("c-tool2", CmdToolResult, map[string]any{"callId": "call-1", "success": "yes"}))
	assert.Equal(t, failure.CommandInvalid, res.GetCode())
	res = e.gw.command(cs.next("c-tool3", CmdToolResult, map[string]any{"callId": "call-1", "text": "lookup(alpha) = 42"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	assert.Equal(t, "turn-1", res.GetResult().GetFields()["turnId"].GetStringValue())
	rp.mu.Lock()
	assert.Equal(t, []string{"call-1@turn-1:lookup(alpha) = 42"}, rp.tools)
	rp.mu.Unlock()

	// The turn ends and run-2 continues the session: an answer of run-1 is
	// refused as revoked before it reaches the provider.
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "ok"})
	e.gw.waitEvent("run.terminal", 1)
	cs2 := &cmdSeq{t: t, seq: cs.seq, runID: "run-2", attempt: 1}
	res = e.gw.command(cs2.attach("c-attach2"))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	res = e.gw.command(cs2.next("c-turn2", CmdTurnStart, map[string]any{"text": "next"}))
	require.Equal(t, runnerstate.StatusCompleted, res.GetStatus(), res.GetMessage())
	cs.seq = cs2.seq
	res = e.gw.command(cs.next("c-tool-old", CmdToolResult, map[string]any{"callId": "call-1", "text": "late"}))
	assert.Equal(t, runnerstate.StatusRejected, res.GetStatus())
	assert.Equal(t, failure.NativeToolAuthorityEpochRevoked, res.GetCode())
	rp.mu.Lock()
	assert.Len(t, rp.tools, 1)
	rp.mu.Unlock()
}

func TestR2_RuntimeRequestsNeedACapableProvider(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.start(nil)
	e.gw.waitConns(1)
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	attachAndTurn(t, e, cs)
	res := e.gw.command(cs.next("c-r", CmdRequestResolve, map[string]any{"requestId": "0", "resolution": map[string]any{"decision": "accept"}}))
	assert.Equal(t, failure.RuntimeRequestResolutionUnsupported, res.GetCode())
	res = e.gw.command(cs.next("c-t", CmdToolResult, map[string]any{"callId": "c", "text": "x"}))
	assert.Equal(t, failure.RuntimeRequestResolutionUnsupported, res.GetCode())
}
