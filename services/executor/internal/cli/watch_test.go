package cli

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func event(seq uint64, typ string, payload map[string]any) *executorv1.WatchRunResponse {
	p, err := structpb.NewStruct(payload)
	if err != nil {
		panic(err)
	}
	return &executorv1.WatchRunResponse{Seq: seq, Event: &prpv1.Event{RunId: "r1", EventType: typ, Payload: p}}
}

// A run waiting for an approval, a tool result or its next attempt says
// so in tetherctl watch instead of looking hung.
func TestD3_WatchShowsWaitingStates(t *testing.T) {
	var out bytes.Buffer
	r := &Renderer{W: &out}
	r.Event(event(1, "runtime_request.created", map[string]any{"requestId": "req-7", "requestType": "approval",
		"request": map[string]any{"type": "approval", "command": "rm -rf build"}}))
	r.Event(event(2, "runtime_request.created", map[string]any{"requestId": "req-8", "requestType": "input",
		"request": map[string]any{"type": "input", "prompt": "Which color?"}}))
	r.Event(event(3, "runtime_request.resolved", map[string]any{"requestId": "req-7"}))
	r.Event(event(4, "semantic_tool.input", map[string]any{"callId": "call-1", "tool": "lookup", "namespace": "crm"}))
	r.Event(event(5, "run.retry_scheduled", map[string]any{"code": "runner_attach_failed", "message": "gateway down",
		"attempt": 1.0, "nextAttemptAt": "2026-12-01T19:30:00Z"}))
	got := out.String()
	require.Contains(t, got, "⏸ approval requested (request req-7): rm -rf build")
	require.Contains(t, got, "⏸ input requested (request req-8): Which color?")
	require.Contains(t, got, "· request req-7 resolved")
	require.Contains(t, got, "⏸ tool call pending: crm/lookup (call call-1)")
	require.Contains(t, got, "↻ attempt 1 failed (runner_attach_failed: gateway down); retry scheduled at ")
	require.Contains(t, got, localTime("2026-12-01T19:30:00Z"))
}

// fakeReplica serves WatchRun from a fixed list of events, then ends with
// end (nil: the stream's normal end); it records the cursors asked for.
type fakeReplica struct {
	executorv1.ExecutorServiceClient
	events  []*executorv1.WatchRunResponse
	end     error
	cursors []uint64
}

func (f *fakeReplica) WatchRun(_ context.Context, req *executorv1.WatchRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[executorv1.WatchRunResponse], error) {
	f.cursors = append(f.cursors, req.GetAfterSeq())
	var evs []*executorv1.WatchRunResponse
	for _, e := range f.events {
		if e.GetSeq() > req.GetAfterSeq() {
			evs = append(evs, e)
		}
	}
	return &fakeStream{evs: evs, end: f.end}, nil
}

type fakeStream struct {
	grpc.ServerStreamingClient[executorv1.WatchRunResponse]
	evs []*executorv1.WatchRunResponse
	end error
}

func (s *fakeStream) Recv() (*executorv1.WatchRunResponse, error) {
	if len(s.evs) == 0 {
		if s.end != nil {
			return nil, s.end
		}
		return nil, io.EOF
	}
	e := s.evs[0]
	s.evs = s.evs[1:]
	return e, nil
}

// A replica that drains mid-watch ends the stream with executor_draining;
// the watch resumes after the last event it showed on the next replica,
// each event shown once. Other errors end the watch.
func TestD3_WatchResumesOnAnotherReplicaWhenOneDrains(t *testing.T) {
	all := []*executorv1.WatchRunResponse{event(1, "turn.started", nil), event(2, "item.delta", nil), event(3, "run.terminal", nil)}
	draining := failure.ToStatus(failure.Newf(failure.ExecutorDraining, "this executor is shutting down; resume the watch from cursor 2"))
	a := &fakeReplica{events: all[:2], end: draining}
	b := &fakeReplica{events: all}
	var seen []uint64
	err := Watch(context.Background(), []executorv1.ExecutorServiceClient{a, b}, "r1", "", 0, func(m *executorv1.WatchRunResponse) {
		seen = append(seen, m.GetSeq())
	})
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2, 3}, seen)
	require.Equal(t, []uint64{0}, a.cursors)
	require.Equal(t, []uint64{2}, b.cursors, "resumed after the last event shown")

	other := &fakeReplica{events: all[:1], end: failure.ToStatus(failure.Newf(failure.RunNotFound, "no run"))}
	err = Watch(context.Background(), []executorv1.ExecutorServiceClient{other, b}, "r1", "", 0, func(*executorv1.WatchRunResponse) {})
	require.EqualValues(t, failure.RunNotFound, failure.CodeOf(err))
	require.Len(t, b.cursors, 1, "not resumed")
}
