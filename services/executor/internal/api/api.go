// Package api is the gRPC face of the executor: handlers decode, call the
// store or domain, and map errors. No decisions live here.
package api

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/admission"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/livesession"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/suspend"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

// Server implements tether.executor.v1.ExecutorService.
type Server struct {
	executorv1.UnsafeExecutorServiceServer
	Store *store.Store
	Hub   *watch.Hub
	// Kick wakes the local dispatcher after a submission (optional).
	Kick func()
	// KickRun, when set, is called instead of Kick with the submitted
	// run's id.
	KickRun func(runID string)
	// Submit, when set, stores a submission instead of Store.Submit and
	// wakes whoever claims it (the local dispatcher's SubmitAndClaim,
	// which claims in the same commit when it can; Kick and KickRun are
	// then not called). run, when not nil, is the run as that commit left
	// it, which SubmitRun answers without reading it again.
	Submit func(ctx context.Context, runID string, in *prpv1.ExecutionInput) (created bool, run *executorv1.Run, err error)
	// DispatchCancellation, when set, hands the local driver of a run, if
	// any, its cancellation just recorded (dispatched at once, without
	// waiting for the database's notification nor reading it back).
	// AwaitCancellationAck, when set,
	// signals a local driver's acknowledgement with the record as its
	// commit left it (nil: CancelRun reads it); CancelRun polls the record
	// otherwise (a run driven by another replica).
	DispatchCancellation func(runID string, rec *executorv1.Cancellation)
	AwaitCancellationAck func(runID string) (<-chan *executorv1.Cancellation, func())
	// Controls holds this replica's live provider sessions (steering and
	// runtime-request resolution); ForwardToOwner sends calls for runs
	// driven elsewhere to the replica recorded with the lease.
	Controls *livesession.Registry
	// SelfAddr is this replica's advertised address (no self-forwarding).
	SelfAddr string
	// DialPeer connects to another replica for forwarding (nil:
	// grpcx.Dial without a CA); over mTLS it presents this replica's
	// certificate (SPEC S2, F6).
	DialPeer func(addr string) (*grpc.ClientConn, error)
	// Gateways gives a session scope's gateway (SPEC F2) for runner
	// lookups and session closes; nil: Gateway answers them all.
	Gateways suspend.Gateways
	Gateway  gatewayv1.RunnerGatewayClient
	// GatewayTTL after which a silent gateway is lost (DefaultGatewayTTL
	// when 0).
	GatewayTTL time.Duration
	// Suspender performs verified suspensions (CloseSession with suspend).
	Suspender *suspend.Suspender

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn

	// WorkspaceRoot is the fleet's workspace root: a run's workspace.cwd
	// must lie in <WorkspaceRoot>/<company_id> (SPEC T6; "" is
	// workspace.DefaultRoot).
	WorkspaceRoot string

	// Vault keeps company secrets (SPEC T3): PutSecret seals them, and a
	// submitted plain environment.configured value is stored as one and
	// named by reference. Nil: secrets are refused.
	Vault *secrets.Vault

	// Checkpoints deletes checkpoint archives through the backup verifier
	// (DeleteRun, PurgeCompany; SPEC L1); nil: a deletion that has
	// checkpoints to delete is refused.
	Checkpoints retention.CheckpointDeleter

	// Draining, when closed, ends open watches with Unavailable so a
	// graceful shutdown is not held up by them (clients resume from their
	// last cursor on another replica).
	Draining <-chan struct{}
}

var _ executorv1.ExecutorServiceServer = (*Server)(nil)

func (s *Server) gatewayTTL() time.Duration {
	if s.GatewayTTL <= 0 {
		return DefaultGatewayTTL
	}
	return s.GatewayTTL
}

// SubmitRun stores a run (idempotent by run id).
func (s *Server) SubmitRun(ctx context.Context, req *executorv1.SubmitRunRequest) (*executorv1.SubmitRunResponse, error) {
	if err := admission.Check(req.GetInput()); err != nil {
		return nil, err
	}
	if err := admission.CheckWorkspace(req.GetInput(), s.WorkspaceRoot); err != nil {
		return nil, err
	}
	// The run records who submitted it (SPEC T2).
	ctx = store.WithActor(ctx, s.principal(ctx))
	in, err := s.byReference(ctx, req.GetInput())
	if err != nil {
		return nil, err
	}
	created, run, err := s.submit(ctx, req.GetRunId(), in)
	if err != nil {
		return nil, err
	}
	return &executorv1.SubmitRunResponse{Run: visible(run), Created: created}, nil
}

// submit stores a run under the id its company chose (SPEC T2: run ids are
// unique per company). Its internal key is that id, unless the id is
// already another company's run's key: then a fresh one. A resubmission
// finds the company's run of that id, whatever its key.
func (s *Server) submit(ctx context.Context, id string, in *prpv1.ExecutionInput) (created bool, run *executorv1.Run, err error) {
	ctx = store.WithClientRunID(ctx, id)
	key := id
	for range 3 {
		if s.Submit != nil {
			created, run, err = s.Submit(ctx, key, in)
		} else if created, err = s.Store.Submit(ctx, key, in); created {
			// The local dispatcher claims while the run is read back.
			s.kick(key)
		}
		if !errors.Is(err, store.ErrRunKeyTaken) {
			break
		}
		key = store.NewRunKey()
	}
	if err != nil {
		return false, nil, err
	}
	if run == nil {
		if run, _, err = s.Store.FindRun(ctx, store.RunRef{ID: id, Company: in.GetBinding().GetCompanyId()}); err != nil {
			return false, nil, err
		}
	}
	return created, run, nil
}

// runRef is the run a caller names by id and company (the request's
// company_id, "" when none), among the companies it may read (SPEC T2).
func runRef(ctx context.Context, id, company string) store.RunRef {
	ref := store.RunRef{ID: id, Company: company, Companies: authz.Companies(ctx)}
	if r, ok := authz.RunOf(ctx, id, company); ok {
		// As the authorizer resolved it: its company has the id once.
		ref.Company = r.Company
	}
	return ref
}

// resolve finds the run a caller names: its internal key and company.
func (s *Server) resolve(ctx context.Context, id, company string) (store.ResolvedRun, error) {
	if r, ok := authz.RunOf(ctx, id, company); ok {
		return r, nil
	}
	return s.Store.ResolveRun(ctx, runRef(ctx, id, company))
}

// kick wakes the local dispatcher for a run just submitted.
func (s *Server) kick(runID string) {
	switch {
	case s.KickRun != nil:
		s.KickRun(runID)
	case s.Kick != nil:
		s.Kick()
	}
}

// GetRun returns a run.
func (s *Server) GetRun(ctx context.Context, req *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	run, _, err := s.Store.FindRun(ctx, runRef(ctx, req.GetRunId(), req.GetCompanyId()))
	if err != nil {
		return nil, err
	}
	return &executorv1.GetRunResponse{Run: visible(run)}, nil
}

// ListRuns pages through runs.
func (s *Server) ListRuns(ctx context.Context, req *executorv1.ListRunsRequest) (*executorv1.ListRunsResponse, error) {
	runs, next, err := s.Store.ListRuns(ctx, store.ListFilter{
		NormalizedSessionID: req.GetNormalizedSessionId(), State: req.GetState(),
		Companies: store.ScopeCompanies(authz.Companies(ctx), req.GetCompanyId()),
	}, int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &executorv1.ListRunsResponse{Runs: visibleRuns(runs), NextPageToken: next}, nil
}

// cancelPoll is how often CancelRun reads the cancellation record while a
// driver on another replica dispatches it (a local driver's
// acknowledgement wakes it at once).
const cancelPoll = 20 * time.Millisecond

// CancelRun records a durable cancellation and waits (bounded) for the
// driver's acknowledgement.
func (s *Server) CancelRun(ctx context.Context, req *executorv1.CancelRunRequest) (*executorv1.CancelRunResponse, error) {
	scope := map[executorv1.CancellationScope]string{
		executorv1.CancellationScope_CANCELLATION_SCOPE_RUN:   "run",
		executorv1.CancellationScope_CANCELLATION_SCOPE_TURN:  "turn",
		executorv1.CancellationScope_CANCELLATION_SCOPE_ISSUE: "issue",
	}[req.GetScope()]
	run, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	// Registered before the record is written: a local driver's
	// acknowledgement cannot come before it is awaited.
	var acked <-chan *executorv1.Cancellation
	if s.AwaitCancellationAck != nil {
		var stop func()
		acked, stop = s.AwaitCancellationAck(run.Key)
		defer stop()
	}
	out, err := s.Store.RecordCancellation(ctx, store.CancelRequest{
		RunID: run.Key, Scope: scope, Reason: req.GetReason(), RequestID: req.GetRequestId(), Actor: authz.Actor(ctx, "api"),
	})
	if err != nil {
		return nil, err
	}
	rec := out.Record
	if out.NeedsDispatch {
		if s.DispatchCancellation != nil {
			s.DispatchCancellation(run.Key, rec)
		}
		wait := 5 * time.Second
		if req.GetWaitTimeout() != nil {
			wait = req.GetWaitTimeout().AsDuration()
		}
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
		poll := time.NewTicker(cancelPoll)
		defer poll.Stop()
		for rec.GetDispatchState() == "pending" {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-deadline.C:
				return &executorv1.CancelRunResponse{Active: out.Active, Cancellation: asNamed(rec, req.GetRunId())}, nil
			case got := <-acked:
				acked = nil
				if got.GetIntentId() == rec.GetIntentId() && got.GetDispatchState() != "pending" {
					// The record as the acknowledging commit left it: no
					// read back (SPEC P2).
					rec = got
					continue
				}
				// Not at hand: read the record once more, then poll.
			case <-poll.C:
			}
			if rec, err = s.Store.Cancellation(ctx, run.Key); err != nil {
				return nil, err
			}
		}
	}
	return &executorv1.CancelRunResponse{Active: out.Active, Cancellation: asNamed(rec, req.GetRunId())}, nil
}

// asNamed is a run's cancellation record as its caller names the run (the
// record holds the run's internal key, SPEC T2).
func asNamed(rec *executorv1.Cancellation, id string) *executorv1.Cancellation {
	if rec == nil || rec.GetRunId() == id {
		return rec
	}
	rec = proto.Clone(rec).(*executorv1.Cancellation)
	rec.RunId = id
	return rec
}

// Close releases forwarding connections.
func (s *Server) Close() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
}

// GetSteeringState reports whether the run's active turn can be steered.
func (s *Server) GetSteeringState(ctx context.Context, req *executorv1.GetSteeringStateRequest) (*executorv1.GetSteeringStateResponse, error) {
	run, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	st, err := s.controls().SteeringState(ctx, run.Key)
	if err != nil {
		return nil, err
	}
	return &executorv1.GetSteeringStateResponse{Disposition: st.Disposition, ActiveTurnId: st.ActiveTurnID}, nil
}

// SteerRun steers the run's active provider turn.
func (s *Server) SteerRun(ctx context.Context, req *executorv1.SteerRunRequest) (*executorv1.SteerRunResponse, error) {
	run, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	turn, err := s.controls().Steer(ctx, run.Key, req.GetMessage(), req.GetCorrelationId(), req.GetTimeout().AsDuration())
	if err != nil {
		return nil, err
	}
	return &executorv1.SteerRunResponse{TurnId: turn}, nil
}

// ResolveRuntimeRequest answers a provider's runtime request once, after
// revalidating that it is still pending.
func (s *Server) ResolveRuntimeRequest(ctx context.Context, req *executorv1.ResolveRuntimeRequestRequest) (*executorv1.ResolveRuntimeRequestResponse, error) {
	if err := admission.CheckStruct("resolution", req.GetResolution(), admission.MaxResolutionBytes); err != nil {
		return nil, err
	}
	run, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	id, err := s.controls().ResolveRuntimeRequest(ctx, livesession.ResolveInput{
		RunID: run.Key, RequestID: req.GetRequestId(), TurnID: req.GetTurnId(),
		Resolution: req.GetResolution().AsMap(),
		Authorize: func(ctx context.Context) error {
			pending, err := s.Store.RuntimeRequestPending(ctx, run.Key, req.GetRequestId())
			if err != nil {
				return err
			}
			if !pending {
				return failure.New(codes.FailedPrecondition, failure.RuntimeRequestNoLongerPending,
					"runtime request %s of run %s is not pending", req.GetRequestId(), req.GetRunId())
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return &executorv1.ResolveRuntimeRequestResponse{CommandId: id}, nil
}

// CompleteToolCall answers a dynamic tool call of the run.
func (s *Server) CompleteToolCall(ctx context.Context, req *executorv1.CompleteToolCallRequest) (*executorv1.CompleteToolCallResponse, error) {
	// An ended run's tool authority is revoked: the registry answers
	// native_tool_authority_epoch_revoked (SPEC E13).
	run, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	id, err := s.controls().CompleteToolCall(ctx, run.Key, req.GetCallId(), req.GetSuccess(), req.GetText())
	if err != nil {
		return nil, err
	}
	return &executorv1.CompleteToolCallResponse{CommandId: id}, nil
}

func (s *Server) controls() *livesession.Registry {
	if s.Controls == nil {
		return livesession.NewRegistry(func() string { return "" })
	}
	return s.Controls
}

// WatchRun replays events after the cursor, then streams live ones, and ends
// after the run's terminal event. Live events come from the run's feed in
// the hub (one read per notification for all watchers of the run); a
// watcher that falls DefaultBuffer events behind is cut off with
// Unavailable watch_consumer_too_slow and resumes from its last seq.
func (s *Server) WatchRun(req *executorv1.WatchRunRequest, stream executorv1.ExecutorService_WatchRunServer) error {
	ctx := stream.Context()
	run, found, err := s.Store.FindRun(ctx, runRef(ctx, req.GetRunId(), req.GetCompanyId()))
	if err != nil {
		return err
	}
	// The run's events name it by its internal key: a run whose key is
	// not the id its company chose (SPEC T2) has them renamed, one by one.
	rename := found.Key != run.GetRunId()
	if req.GetAfterSeq() > run.GetEventCount() {
		return failure.New(codes.OutOfRange, failure.WatchCursorOutOfRange,
			"after_seq %d is beyond the run's last event %d", req.GetAfterSeq(), run.GetEventCount())
	}
	if run.GetEndedAt() != nil && req.GetAfterSeq() >= run.GetEventCount() {
		return nil // the terminal event lies at or before the cursor
	}
	w := s.Hub.Watch(found.Key, req.GetAfterSeq())
	defer w.Close()
	// The run's events skip the interceptors' per-message hooks: with
	// 1,000 watchers each event is 1,000 sends.
	out := grpcx.Unwrapped(stream)
	if !rename {
		// While this watcher waits, the run's feed sends the events it
		// encoded on the stream itself (no wake-up of this goroutine per
		// event); Next returns the others.
		w.SendWith(out.SendMsg)
	}
	for {
		evs, err := w.Next(ctx, s.Draining)
		if err != nil {
			return watchEnded(err, w.Cursor())
		}
		for _, e := range evs {
			if e.Wire != nil && !rename {
				// Encoded once by the run's feed for all of its watchers.
				if err := out.SendMsg(e.Wire); err != nil {
					return err
				}
				continue
			}
			m := &executorv1.WatchRunResponse{Seq: e.Seq, Event: e.Event}
			if rename {
				m.Event = renamed(e.Event, found.Key, run.GetRunId())
			}
			terminal := e.Event.GetEventType() == store.EventTerminal
			if terminal {
				// The result is recorded with the terminal event, and
				// read with it.
				m.Result = e.Result
				if m.Result == nil {
					run, err := s.Store.GetRun(ctx, found.Key)
					if err != nil {
						return err
					}
					m.Result = run.GetResult()
				}
			}
			if err := out.SendMsg(m); err != nil {
				return err
			}
			if terminal {
				return nil
			}
		}
	}
}

// renamed is a run's event as the run's company names the run: its id
// instead of the run's internal key (SPEC T2), in the event's run_id, its
// source_event_id (the executor's own events are numbered under the run)
// and its payload's values that name the run.
func renamed(ev *prpv1.Event, key, id string) *prpv1.Event {
	ev = proto.Clone(ev).(*prpv1.Event)
	if ev.GetRunId() == key {
		ev.RunId = id
	}
	if rest, ok := strings.CutPrefix(ev.GetSourceEventId(), key+":"); ok {
		ev.SourceEventId = id + ":" + rest
	}
	for _, v := range ev.GetPayload().GetFields() {
		renameValue(v, key, id)
	}
	return ev
}

func renameValue(v *structpb.Value, key, id string) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		if k.StringValue == key {
			k.StringValue = id
		}
	case *structpb.Value_StructValue:
		for _, f := range k.StructValue.GetFields() {
			renameValue(f, key, id)
		}
	case *structpb.Value_ListValue:
		for _, f := range k.ListValue.GetValues() {
			renameValue(f, key, id)
		}
	}
}

// watchEnded maps the error that ended a watch at cursor to the stream's
// status. (Out of WatchRun's loop: errors.As's target would be allocated for
// every event of every watcher.)
func watchEnded(err error, cursor uint64) error {
	var slow *watch.ErrTooSlow
	switch {
	case errors.As(err, &slow):
		return watchTooSlow(slow)
	case errors.Is(err, watch.ErrStopped):
		return failure.New(codes.Unavailable, failure.ExecutorDraining,
			"this executor is shutting down; resume the watch from cursor %d", cursor)
	}
	return err
}

func watchTooSlow(e *watch.ErrTooSlow) error {
	f := failure.New(codes.Unavailable, failure.WatchConsumerTooSlow,
		"the watcher fell %d events behind the run; resume the watch from cursor %d", e.Buffer, e.Cursor)
	f.Metadata = map[string]string{"after_seq": strconv.FormatUint(e.Cursor, 10)}
	return f
}
