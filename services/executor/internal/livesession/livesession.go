// Package livesession routes same-turn steering (E9) and runtime-request
// resolutions (E8) to the live provider session of a run, with the
// reference's stable codes, bounded acknowledgement waits, joined duplicate
// resolutions and per-session reservations.
package livesession

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/failure"
)

// Stable codes.
const (
	DefaultSteerTimeout              = 10 * time.Second
	maxCompletedReservationsPerRun   = 256
	dispositionAvailable             = "available"
	dispositionUnsupported           = "unsupported"
	dispositionTemporarilyUnavailble = "temporarily_unavailable"
)

// Capabilities is what a provider session supports.
type Capabilities struct {
	Steering                 bool
	RuntimeRequestResolution bool
}

// Message is a steering message.
type Message struct {
	Role, Text string
}

// SteerInput is what a session's Steer receives.
type SteerInput struct {
	TurnID        string
	Message       Message
	CorrelationID string
}

// Session is a live provider session of a run (the executor's driver).
type Session interface {
	Capabilities(ctx context.Context) (Capabilities, error)
	// ActiveTurnID returns the provider's active turn, "" when none.
	ActiveTurnID(ctx context.Context) (string, error)
	Steer(ctx context.Context, in SteerInput) error
	ResolveRuntimeRequest(ctx context.Context, commandID, requestID, turnID string, resolution map[string]any) error
	// CompleteToolCall answers a dynamic tool call of this session.
	CompleteToolCall(ctx context.Context, callID string, success bool, text string) (commandID string, err error)
}

type entry struct {
	session Session
	gen     uint64
}

type reservation struct {
	commandID   string
	fingerprint string
	done        chan struct{}
	err         error
	completedAt time.Time
}

// Registry holds the live sessions of the runs this replica drives.
type Registry struct {
	mu       sync.Mutex
	gen      uint64
	sessions map[string]*entry
	resv     map[string]map[string]*reservation // run → request → reservation
	newID    func() string
}

// NewRegistry returns an empty registry; newID mints command ids.
func NewRegistry(newID func() string) *Registry {
	return &Registry{sessions: map[string]*entry{}, resv: map[string]map[string]*reservation{}, newID: newID}
}

// Attach registers the run's live session; the returned function detaches
// it and clears the run's resolution reservations, so a later session may
// resolve the same request id again with a new command id.
func (r *Registry) Attach(runID string, s Session) (detach func()) {
	r.mu.Lock()
	r.gen++
	e := &entry{session: s, gen: r.gen}
	r.sessions[runID] = e
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.sessions[runID] == e {
			delete(r.sessions, runID)
			delete(r.resv, runID)
		}
	}
}

func (r *Registry) session(runID string) *entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessions[runID]
}

// Has reports whether this replica drives the run now.
func (r *Registry) Has(runID string) bool { return r.session(runID) != nil }

// SteeringState is GetSteeringState's answer.
type SteeringState struct {
	Disposition  string
	ActiveTurnID string
}

// SteeringState reports whether the run can be steered now.
func (r *Registry) SteeringState(ctx context.Context, runID string) (SteeringState, error) {
	e := r.session(runID)
	if e == nil {
		return SteeringState{Disposition: dispositionTemporarilyUnavailble}, nil
	}
	caps, err := e.session.Capabilities(ctx)
	if err != nil {
		return SteeringState{}, err
	}
	if !caps.Steering {
		return SteeringState{Disposition: dispositionUnsupported}, nil
	}
	turn, err := e.session.ActiveTurnID(ctx)
	if err != nil {
		return SteeringState{}, err
	}
	if turn == "" {
		return SteeringState{Disposition: dispositionTemporarilyUnavailble}, nil
	}
	return SteeringState{Disposition: dispositionAvailable, ActiveTurnID: turn}, nil
}

// Steer sends a user message into the run's active provider turn and waits
// at most timeout (default 10 s) for the provider's acknowledgement.
func (r *Registry) Steer(ctx context.Context, runID, text, correlationID string, timeout time.Duration) (string, error) {
	e := r.session(runID)
	if e == nil {
		return "", failure.Newf(failure.SteeringTemporarilyUnavailable, "run %s has no live provider session here", runID)
	}
	caps, err := e.session.Capabilities(ctx)
	if err != nil {
		return "", err
	}
	if !caps.Steering {
		return "", failure.Newf(failure.SteeringUnsupported, "the provider of run %s cannot be steered", runID)
	}
	turn, err := e.session.ActiveTurnID(ctx)
	if err != nil {
		return "", err
	}
	if turn == "" {
		return "", failure.Newf(failure.SteeringStaleTurn, "run %s has no active provider turn", runID)
	}
	if timeout <= 0 {
		timeout = DefaultSteerTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- e.session.Steer(sctx, SteerInput{TurnID: turn, Message: Message{Role: "user", Text: text}, CorrelationID: correlationID})
	}()
	select {
	case err := <-done:
		if err == nil {
			return turn, nil
		}
		switch code := failure.CodeOf(err); {
		case code == failure.SteeringTimeout || errors.Is(err, context.DeadlineExceeded):
			return "", failure.Newf(failure.SteeringTimeout, "the provider did not acknowledge within %s", timeout)
		case code == failure.SteeringStaleTurn || code == failure.SteeringUnsupported || code == failure.SteeringRejected:
			return "", err
		default:
			return "", failure.Newf(failure.SteeringRejected, "%s", err.Error())
		}
	case <-sctx.Done():
		if ctx.Err() != nil {
			return "", failure.ToStatus(ctx.Err())
		}
		return "", failure.Newf(failure.SteeringTimeout, "the provider did not acknowledge within %s", timeout)
	}
}

// ResolveInput asks to answer a provider's runtime request.
type ResolveInput struct {
	RunID, RequestID, TurnID string
	Resolution               map[string]any
	// Authorize revalidates the caller's right to answer (e.g. that the
	// request is still pending) after the provider reads and before
	// dispatch; its error is returned and nothing is dispatched.
	Authorize func(ctx context.Context) error
}

// ResolveRuntimeRequest answers a runtime request once: identical
// concurrent resolutions join (one dispatch, one command id); a different
// one is runtime_request_resolution_conflict.
func (r *Registry) ResolveRuntimeRequest(ctx context.Context, in ResolveInput) (string, error) {
	e := r.session(in.RunID)
	if e == nil {
		return "", failure.Newf(failure.NativeSessionNotActive, "run %s has no live provider session here", in.RunID)
	}
	caps, err := e.session.Capabilities(ctx)
	if err != nil {
		return "", err
	}
	if !caps.RuntimeRequestResolution {
		return "", failure.Newf(failure.RuntimeRequestResolutionUnsupported, "the provider of run %s cannot resolve runtime requests", in.RunID)
	}
	turn, err := e.session.ActiveTurnID(ctx)
	if err != nil {
		return "", err
	}
	if turn != in.TurnID {
		return "", failure.Newf(failure.RuntimeRequestStaleTurn, "request %s: turn %s is not the active turn (the active turn is %q)", in.RequestID, in.TurnID, turn)
	}
	fp, err := json.Marshal(map[string]any{"turnId": in.TurnID, "resolution": in.Resolution})
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	if cur := r.sessions[in.RunID]; cur != e {
		r.mu.Unlock()
		return "", failure.Newf(failure.NativeSessionNotActive, "run %s's session changed", in.RunID)
	}
	byReq := r.resv[in.RunID]
	if byReq == nil {
		byReq = map[string]*reservation{}
		r.resv[in.RunID] = byReq
	}
	if res, ok := byReq[in.RequestID]; ok {
		r.mu.Unlock()
		if res.fingerprint != string(fp) {
			return "", failure.Newf(failure.RuntimeRequestResolutionConflict, "request %s is already being resolved differently", in.RequestID)
		}
		select {
		case <-res.done:
		case <-ctx.Done():
			return "", failure.ToStatus(ctx.Err())
		}
		if res.err != nil {
			return "", res.err
		}
		return res.commandID, nil
	}
	res := &reservation{commandID: "native-runtime-response:" + r.newID(), fingerprint: string(fp), done: make(chan struct{})}
	byReq[in.RequestID] = res
	r.mu.Unlock()

	res.err = r.dispatch(ctx, e, in, res.commandID)
	r.mu.Lock()
	if res.err != nil {
		if r.resv[in.RunID] != nil && r.resv[in.RunID][in.RequestID] == res {
			delete(r.resv[in.RunID], in.RequestID)
		}
	} else {
		res.completedAt = time.Now()
		r.pruneLocked(in.RunID)
	}
	r.mu.Unlock()
	close(res.done)
	if res.err != nil {
		return "", res.err
	}
	return res.commandID, nil
}

func (r *Registry) dispatch(ctx context.Context, e *entry, in ResolveInput, commandID string) error {
	if in.Authorize != nil {
		if err := in.Authorize(ctx); err != nil {
			return err
		}
	}
	r.mu.Lock()
	same := r.sessions[in.RunID] == e
	r.mu.Unlock()
	if !same {
		return failure.Newf(failure.NativeSessionNotActive, "run %s's session changed during authorisation", in.RunID)
	}
	return e.session.ResolveRuntimeRequest(ctx, commandID, in.RequestID, in.TurnID, in.Resolution)
}

// pruneLocked keeps the newest completed reservations of a run.
func (r *Registry) pruneLocked(runID string) {
	byReq := r.resv[runID]
	var completed int
	var oldestKey string
	var oldest time.Time
	for k, v := range byReq {
		if !v.completedAt.IsZero() {
			completed++
			if oldest.IsZero() || v.completedAt.Before(oldest) {
				oldest, oldestKey = v.completedAt, k
			}
		}
	}
	if completed > maxCompletedReservationsPerRun {
		delete(byReq, oldestKey)
	}
}

// CompleteToolCall answers a dynamic tool call of the run's live session.
// Tool authority is bound to the run: without a live session of this run
// here (it ended, or a continuation took the scope) the answer is refused
// with native_tool_authority_epoch_revoked.
func (r *Registry) CompleteToolCall(ctx context.Context, runID, callID string, success bool, text string) (string, error) {
	e := r.session(runID)
	if e == nil {
		return "", failure.Newf(failure.NativeToolAuthorityEpochRevoked, "run %s no longer holds tool authority", runID)
	}
	return e.session.CompleteToolCall(ctx, callID, success, text)
}
