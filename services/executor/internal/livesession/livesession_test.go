package livesession

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

type fakeSession struct {
	mu          sync.Mutex
	caps        Capabilities
	activeTurn  string
	capCalls    int
	snapCalls   int
	steerErr    error
	steerBlock  bool
	steered     []SteerInput
	resolutions []string // command ids
}

func (f *fakeSession) Capabilities(context.Context) (Capabilities, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.capCalls++
	return f.caps, nil
}

func (f *fakeSession) ActiveTurnID(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapCalls++
	return f.activeTurn, nil
}

func (f *fakeSession) Steer(ctx context.Context, in SteerInput) error {
	f.mu.Lock()
	f.steered = append(f.steered, in)
	block, err := f.steerBlock, f.steerErr
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

func (f *fakeSession) ResolveRuntimeRequest(_ context.Context, commandID, _, _ string, _ map[string]any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resolutions = append(f.resolutions, commandID)
	return nil
}

func (f *fakeSession) CompleteToolCall(_ context.Context, callID string, _ bool, _ string) (string, error) {
	return "tool/" + callID, nil
}

func (f *fakeSession) counts() (caps, snaps, resolves int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capCalls, f.snapCalls, len(f.resolutions)
}

func registry() *Registry {
	var n atomic.Int64
	return NewRegistry(func() string { return fmt.Sprint(n.Add(1)) })
}

func active() *fakeSession {
	return &fakeSession{caps: Capabilities{Steering: true, RuntimeRequestResolution: true}, activeTurn: "provider-turn-1"}
}

func TestE9_CorrelatesTheQueuedCommentWithTheActiveProviderTurnAcknowledgement(t *testing.T) {
	r := registry()
	s := active()
	defer r.Attach("run-1", s)()
	st, err := r.SteeringState(context.Background(), "run-1")
	require.NoError(t, err)
	require.Equal(t, SteeringState{Disposition: "available", ActiveTurnID: "provider-turn-1"}, st)
	turn, err := r.Steer(context.Background(), "run-1", "Check mobile overflow first.", "queued-comment-1", 0)
	require.NoError(t, err)
	require.Equal(t, "provider-turn-1", turn)
	require.Equal(t, []SteerInput{{TurnID: "provider-turn-1", Message: Message{Role: "user", Text: "Check mobile overflow first."},
		CorrelationID: "queued-comment-1"}}, s.steered)
}

func TestE9_KeepsFailuresRetryableWithStableCodes(t *testing.T) {
	cases := map[string]struct {
		prepare func(*fakeSession)
		code    string
	}{
		"unsupported provider": {func(s *fakeSession) { s.caps.Steering = false }, failure.SteeringUnsupported},
		"stale turn":           {func(s *fakeSession) { s.activeTurn = "" }, failure.SteeringStaleTurn},
		"provider rejection":   {func(s *fakeSession) { s.steerErr = errors.New("request rejected") }, failure.SteeringRejected},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := registry()
			s := active()
			c.prepare(s)
			defer r.Attach("run-1", s)()
			_, err := r.Steer(context.Background(), "run-1", "Retryable steering", "queued-comment-error", 0)
			require.EqualValues(t, c.code, failure.CodeOf(err))
		})
	}
	r := registry()
	_, err := r.Steer(context.Background(), "nobody", "x", "y", 0)
	require.EqualValues(t, failure.SteeringTemporarilyUnavailable, failure.CodeOf(err))
	st, err := r.SteeringState(context.Background(), "nobody")
	require.NoError(t, err)
	require.Equal(t, "temporarily_unavailable", st.Disposition)
}

func TestE9_BoundsTheProviderAcknowledgementWait(t *testing.T) {
	r := registry()
	s := active()
	s.steerBlock = true
	defer r.Attach("run-1", s)()
	_, err := r.Steer(context.Background(), "run-1", "Do not wait forever", "queued-comment-timeout", 5*time.Millisecond)
	require.EqualValues(t, failure.SteeringTimeout, failure.CodeOf(err))
}

func TestE8_RevalidatesLifecycleAfterProviderReadsAndBlocksStaleDispatch(t *testing.T) {
	r := registry()
	s := active()
	defer r.Attach("run-1", s)()
	authorized := 0
	_, err := r.ResolveRuntimeRequest(context.Background(), ResolveInput{
		RunID: "run-1", RequestID: "runtime-request-1", TurnID: "provider-turn-1",
		Resolution: map[string]any{"action": "decline"},
		Authorize: func(context.Context) error {
			authorized++
			caps, snaps, _ := s.counts()
			require.Equal(t, 1, caps, "capabilities were read first")
			require.Equal(t, 1, snaps, "the active turn was read first")
			return failure.New(409, "runtime_request_no_longer_pending", "answered elsewhere")
		},
	})
	require.EqualValues(t, "runtime_request_no_longer_pending", failure.CodeOf(err))
	require.Equal(t, 1, authorized)
	_, _, resolves := s.counts()
	require.Zero(t, resolves, "nothing was sent to the provider")
}

func TestE8_AtomicallyJoinsDuplicateResponsesAndRejectsAConcurrentConflict(t *testing.T) {
	r := registry()
	s := active()
	defer r.Attach("run-1", s)()
	release := make(chan struct{})
	var authCalls atomic.Int32
	auth := func(context.Context) error { authCalls.Add(1); <-release; return nil }
	in := ResolveInput{RunID: "run-1", RequestID: "runtime-request-concurrent", TurnID: "provider-turn-1",
		Resolution: map[string]any{"action": "decline"}, Authorize: auth}
	type out struct {
		id  string
		err error
	}
	first, dup := make(chan out, 1), make(chan out, 1)
	go func() { id, err := r.ResolveRuntimeRequest(context.Background(), in); first <- out{id, err} }()
	require.Eventually(t, func() bool { return authCalls.Load() == 1 }, time.Second, time.Millisecond)
	go func() { id, err := r.ResolveRuntimeRequest(context.Background(), in); dup <- out{id, err} }()
	require.Eventually(t, func() bool { _, snaps, _ := s.counts(); return snaps == 2 }, time.Second, time.Millisecond)

	conflict := in
	conflict.Resolution = map[string]any{"action": "cancel"}
	_, err := r.ResolveRuntimeRequest(context.Background(), conflict)
	require.EqualValues(t, failure.RuntimeRequestResolutionConflict, failure.CodeOf(err))
	require.EqualValues(t, 1, authCalls.Load())
	_, _, resolves := s.counts()
	require.Zero(t, resolves)

	close(release)
	a, b := <-first, <-dup
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.Equal(t, a.id, b.id, "one command id for joined duplicates")
	_, _, resolves = s.counts()
	require.Equal(t, 1, resolves, "dispatched once")
}

func TestE8_ClearsCompletedResponseReservationsWhenTheSessionTearsDown(t *testing.T) {
	r := registry()
	s := active()
	detach := r.Attach("run-1", s)
	in := ResolveInput{RunID: "run-1", RequestID: "runtime-request-reused", TurnID: "provider-turn-1",
		Resolution: map[string]any{"action": "decline"}}
	first, err := r.ResolveRuntimeRequest(context.Background(), in)
	require.NoError(t, err)
	detach()
	defer r.Attach("run-1", s)()
	second, err := r.ResolveRuntimeRequest(context.Background(), in)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	_, _, resolves := s.counts()
	require.Equal(t, 2, resolves)
}

func TestE13_ToolAuthorityIsBoundToTheRunsLiveSession(t *testing.T) {
	r := registry()
	detach := r.Attach("run-1", active())
	id, err := r.CompleteToolCall(context.Background(), "run-1", "call-1", true, "42")
	require.NoError(t, err)
	require.Equal(t, "tool/call-1", id)
	detach() // the run ended; a continuation may take the scope
	_, err = r.CompleteToolCall(context.Background(), "run-1", "call-2", true, "42")
	require.EqualValues(t, failure.NativeToolAuthorityEpochRevoked, failure.CodeOf(err))
}
