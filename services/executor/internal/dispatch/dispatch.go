// Package dispatch claims due runs and drives each one through the runner
// gateway under a fenced lease: it opens RunnerGateway/Attach with its fencing
// token, persists every relayed event idempotently, acknowledges the highest
// contiguous source seq and records the outcome.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Config configures a Dispatcher.
type Config struct {
	// Owner identifies this executor replica in leases.
	Owner string
	// LeaseTTL is the lease duration; renewals run every LeaseTTL/3.
	LeaseTTL time.Duration
	// PollInterval bounds how long a due run waits when no notification
	// arrives.
	PollInterval time.Duration
	// MaxActive bounds concurrently driven runs.
	MaxActive int
	// MaxAttachFailures is how many consecutive failed attaches a run
	// tolerates before it fails with the last error's code.
	MaxAttachFailures int
	Gateway           gatewayv1.RunnerGatewayClient
	Logger            *slog.Logger
}

// DefaultOwner names this process: host:pid.
func DefaultOwner() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}

// Dispatcher claims and drives runs.
type Dispatcher struct {
	cfg    Config
	store  *store.Store
	leases *leaseKeeper
	log    *slog.Logger
	kick   chan struct{}
	wg     sync.WaitGroup
}

// New returns a Dispatcher.
func New(s *store.Store, cfg Config) *Dispatcher {
	if cfg.Owner == "" {
		cfg.Owner = DefaultOwner()
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 60 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.MaxActive == 0 {
		cfg.MaxActive = 64
	}
	if cfg.MaxAttachFailures == 0 {
		cfg.MaxAttachFailures = 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Dispatcher{
		cfg: cfg, store: s, log: cfg.Logger,
		leases: newLeaseKeeper(s, cfg.Owner, cfg.LeaseTTL, cfg.Logger),
		kick:   make(chan struct{}, 1),
	}
}

// Kick wakes the claim loop (a run was submitted).
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run claims due runs until ctx ends, then waits for its drivers to stop.
// Drivers stop acting when ctx ends; their leases lapse and another replica
// takes the runs over.
func (d *Dispatcher) Run(ctx context.Context) error {
	go d.leases.run(ctx)
	sem := make(chan struct{}, d.cfg.MaxActive)
	defer d.wg.Wait()
	for {
		claimed := false
		select {
		case sem <- struct{}{}:
			c, err := d.store.ClaimNext(ctx, d.cfg.Owner, d.cfg.LeaseTTL)
			if err != nil && ctx.Err() == nil {
				d.log.Error("claim failed", "err", err)
			}
			if c == nil {
				<-sem
				break
			}
			claimed = true
			runCtx, cancel := context.WithCancelCause(ctx)
			d.leases.add(c.RunID, c.Attempt, cancel)
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				defer func() { <-sem }()
				defer cancel(nil)
				defer d.leases.remove(c.RunID)
				d.drive(runCtx, c)
			}()
		case <-ctx.Done():
			return nil
		}
		if claimed {
			continue // more may be due
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-d.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// drive attaches to the runner until the run reaches a terminal state, the
// lease is lost, or the executor stops. Transport trouble (the gateway
// restarting) is retried with backoff under the same lease.
func (d *Dispatcher) drive(ctx context.Context, c *store.Claim) {
	log := d.log.With("run_id", c.RunID, "attempt", c.Attempt)
	log.Info("run claimed")
	backoff := 100 * time.Millisecond
	for failures := 0; ; {
		done, err := d.attachOnce(ctx, c, log)
		if done || ctx.Err() != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				log.Warn("driver stopped", "cause", cause)
			}
			return
		}
		failures++
		code, msg := failure.CodeOf(err), err.Error()
		if code == "" {
			code = "runner_gateway_unavailable"
		}
		if permanent(err) || failures >= d.cfg.MaxAttachFailures {
			log.Error("run failed", "code", code, "err", err)
			if ferr := d.store.FailRun(context.WithoutCancel(ctx), c.Fence, code, msg); ferr != nil {
				log.Error("recording failure", "err", ferr)
			}
			return
		}
		log.Warn("attach interrupted; retrying", "err", err, "failures", failures)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// permanent reports errors that retrying the attach cannot fix.
func permanent(err error) bool {
	var ce *closedError
	if errors.As(err, &ce) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unimplemented, codes.NotFound:
		return true
	}
	return false
}

type closedError struct{ code, msg string }

func (e *closedError) Error() string { return e.code + ": " + e.msg }

func commandID(c *store.Claim, typ string) string {
	return fmt.Sprintf("%s/a%d/%s", c.RunID, c.Attempt, typ)
}

func newCommand(c *store.Claim, typ string, payload map[string]any) (*prpv1.Command, error) {
	p, err := structpb.NewStruct(payload)
	if err != nil {
		return nil, err
	}
	return &prpv1.Command{
		Schema: "tether.prp.command.v1", CommandId: commandID(c, typ), Type: typ,
		IssuedAt: timestamppb.Now(), Payload: p, RunId: c.RunID, Attempt: c.Attempt,
	}, nil
}

// attachOnce runs one Attach stream. done is true when the run needs no
// further driving (terminal, or failed and recorded).
func (d *Dispatcher) attachOnce(ctx context.Context, c *store.Claim, log *slog.Logger) (done bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := d.cfg.Gateway.Attach(sctx)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
		RunId:  c.RunID,
		Fence:  &gatewayv1.FencingToken{Owner: c.Owner, Attempt: c.Attempt},
		Target: &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK},
		Input:  c.Input,
	}}}); err != nil {
		return false, err
	}
	first, err := stream.Recv()
	if err != nil {
		return false, err
	}
	opened := first.GetOpened()
	if opened == nil {
		if cl := first.GetClosed(); cl != nil {
			return false, &closedError{cl.GetCode(), cl.GetMessage()}
		}
		return false, failure.New(codes.Internal, "runner_protocol_error", "gateway answered Open with %T", first.GetKind())
	}
	log = log.With("runner_instance_id", opened.GetRunnerInstanceId())
	log.Info("attached", "reused", opened.GetReused(), "runner_acked_seq", opened.GetRunnerAckedSeq())
	if err := d.store.RecordRunner(ctx, c.Fence, opened.GetRunnerInstanceId(), opened.GetRunnerProcess(), opened.GetProviderProcess()); err != nil {
		return true, err
	}
	inputJSON, err := protojson.Marshal(c.Input)
	if err != nil {
		return true, err
	}
	var inputMap map[string]any
	if err := jsonUnmarshal(inputJSON, &inputMap); err != nil {
		return true, err
	}
	attach, err := newCommand(c, "run.attach", map[string]any{"input": inputMap})
	if err != nil {
		return true, err
	}
	turn, err := newCommand(c, "turn.start", map[string]any{"text": c.Input.GetTask().GetPrompt()})
	if err != nil {
		return true, err
	}
	for _, cmd := range []*prpv1.Command{attach, turn} {
		if err := stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: cmd}}); err != nil {
			return false, err
		}
	}
	acks := newAckTracker()
	for {
		msg, err := stream.Recv()
		if err != nil {
			return false, err
		}
		switch k := msg.GetKind().(type) {
		case *gatewayv1.AttachResponse_Events:
			evs := k.Events.GetEvents()
			res, err := d.store.AppendEvents(ctx, c.Fence, evs)
			if err != nil {
				if failure.CodeOf(err) == store.CodeReplayConflict {
					log.Error("replay conflict", "err", err)
					if ferr := d.store.FailRun(context.WithoutCancel(ctx), c.Fence, store.CodeReplayConflict, err.Error()); ferr != nil {
						log.Error("recording failure", "err", ferr)
					}
					return true, err
				}
				if failure.CodeOf(err) == "native_session_lease_lost" {
					return true, err
				}
				return false, err
			}
			for inst, seq := range acks.persisted(opened.GetRunnerAckedSeq(), evs) {
				if err := stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
					SourceInstanceId: inst, PersistedThroughSeq: seq,
				}}}); err != nil {
					return false, err
				}
			}
			if res.Terminal {
				log.Info("run terminal persisted", "events", res.Inserted)
				if c.Input.GetSession().GetLifecycle().GetMode() != prpv1.LifecycleMode_LIFECYCLE_MODE_WARM {
					if closeCmd, err := newCommand(c, "session.close", map[string]any{"reason": "per_turn run ended"}); err == nil {
						_ = stream.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: closeCmd}})
					}
				}
				_ = stream.CloseSend()
				return true, nil
			}
		case *gatewayv1.AttachResponse_CommandResult:
			r := k.CommandResult
			switch r.GetStatus() {
			case "completed", "pending":
			default:
				if r.GetCode() == "turn_already_active" {
					continue // a re-attach found its turn still running
				}
				code := r.GetCode()
				if code == "" {
					code = "runner_command_failed"
				}
				msg := fmt.Sprintf("%s %s: %s", r.GetCommandType(), r.GetStatus(), r.GetMessage())
				log.Error("command refused", "code", code, "msg", msg)
				if err := d.store.FailRun(context.WithoutCancel(ctx), c.Fence, code, msg); err != nil {
					log.Error("recording failure", "err", err)
				}
				return true, failure.New(codes.FailedPrecondition, code, "%s", msg)
			}
		case *gatewayv1.AttachResponse_Closed:
			return false, &closedError{k.Closed.GetCode(), k.Closed.GetMessage()}
		}
	}
}
