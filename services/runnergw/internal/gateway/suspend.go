package gateway

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/chunkio"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// Profile directories of the codex provider (SPEC B2) inside a runnerd
// state dir, and what never travels.
var (
	codexProfileDirs    = []string{"runner", "codex-home"}
	codexHomeExclusions = durable.LaunchOnlyCodexHomeEntries
	// codexHomeCredentials never travel from any depth of codex-home
	// (SPEC S4).
	codexHomeCredentials = []string{"auth.json"}
	// runnerExclusions: the provider host's socket (gone once the host has
	// exited cleanly; a socket is never archived).
	// The stage of an online checkpoint (runner.checkpoint) is never part
	// of one.
	runnerExclusions = []string{"provider.sock", checkpointStageDir}
)

// uploadChunk is the size of one UploadCheckpoint chunk (the verifier's
// maximum).
const uploadChunk = 1 << 20

// suspendTimeout bounds a whole suspension.
const suspendTimeout = 2 * time.Minute

// LeaseFor is the environment lease id of the runners this gateway launches
// for a session scope; stamps of their checkpoints are bound to it.
func LeaseFor(sc string) string { return "local-" + sc[:16] }

// readRunnerState reads a runnerd state dir's runner-state.json; (nil, nil)
// when there is none.
func readRunnerState(stateDir string) (*runnerstate.State, error) { return runnerstate.Read(stateDir) }

// runnerProcess is the runner process a state document records.
func runnerProcess(st *runnerstate.State) *prpv1.ProcessInfo {
	if st == nil || st.RunnerProcess == nil {
		return nil
	}
	return &prpv1.ProcessInfo{Pid: int32(st.RunnerProcess.PID), StartTicks: st.RunnerProcess.StartTicks}
}

// acquireOp serialises suspensions, restores and launches of one scope.
func (r *runner) acquireOp(ctx context.Context) (func(), error) {
	select {
	case r.ops <- struct{}{}:
		return func() { <-r.ops }, nil
	case <-ctx.Done():
		return nil, failure.ToStatus(ctx.Err())
	}
}

// SuspendRunner performs a verified suspension of the input's session
// scope: the live runner (launched on its state first when none runs) is
// sent runner.suspend, the gateway acknowledges what it emits so it exits,
// checks lifecycle suspended on disk, then snapshots the profile
// directories and uploads them to the backup verifier.
func (g *Gateway) SuspendRunner(ctx context.Context, req *gatewayv1.SuspendRunnerRequest) (*gatewayv1.SuspendRunnerResponse, error) {
	in := req.GetInput()
	sc := scope.OfRun(req.GetRunId(), in)
	if err := g.authorize(ctx, grant.Want{Method: grant.MethodSuspendRunner, RunID: req.GetRunId(), Scope: sc}); err != nil {
		return nil, err
	}
	prof, ok := persistenceOf(in.GetProvider().GetKind())
	if !ok {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible,
			"this gateway cannot checkpoint provider %q", in.GetProvider().GetKind())
	}
	if g.cfg.Backup == nil {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessBackupUnavailable, "this gateway has no backup verifier (-backup-addr)")
	}
	ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
	defer cancel()
	dir := g.stateDir(sc)
	log := g.log.With("session_scope", sc)
	r := g.runnerFor(sc)
	release, err := r.acquireOp(ctx)
	if err != nil {
		return nil, err
	}
	defer release()

	st, err := readRunnerState(dir)
	if err != nil {
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.NativeSessionCloseUnrecoverable, "reading runner state: %v", err)
	}
	if st == nil {
		return nil, failure.New(codes.NotFound, failure.RunnerStateMissing, "session scope %s has no runner state to suspend", sc)
	}
	lease := st.Identity.EnvironmentLeaseID
	if lease == "" {
		lease = LeaseFor(sc)
	}
	if want := req.GetLeaseId(); want != "" && want != lease {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerEnvironmentLeaseMismatch,
			"session scope %s runs under environment lease %s, not %s", sc, lease, want)
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "suspended by request"
	}

	r.mu.Lock()
	live, connected := r.conn != nil || r.child != nil, r.conn != nil
	r.mu.Unlock()
	if req.GetKeepRunning() && !req.GetArchiveState() && connected {
		return g.checkpointOnline(ctx, r, dir, sc, lease, in, prof, reason)
	}
	st, events, err := g.suspendRunnerState(ctx, r, dir, sc, in, reason, live, st)
	if err != nil {
		return nil, err
	}
	// A provider host whose runnerd went away would hold the provider's
	// files open: make sure nothing runs in the state dir.
	stopOrphanProviderHost(dir)

	receipt, err := g.upload(ctx, dir, sc, lease, in, st, prof)
	if err != nil {
		return nil, err
	}
	if err := settleCheckpointedState(dir, sc, receipt.GetCheckpoint().GetCheckpointId(), req.GetArchiveState(), log); err != nil {
		return nil, err
	}
	log.Info("runner suspended and checkpointed", "runner_instance_id", st.Identity.RunnerInstanceID,
		"checkpoint_id", receipt.GetCheckpoint().GetCheckpointId(), "manifest_digest", receipt.GetCheckpoint().GetManifestDigest(),
		"lease_id", lease, "provider_thread_id", st.ProviderThreadID)
	return &gatewayv1.SuspendRunnerResponse{
		SessionScope: sc, RunnerInstanceId: st.Identity.RunnerInstanceID, LeaseId: lease,
		ProviderThreadId: st.ProviderThreadID, Checkpoint: receipt.GetCheckpoint(), Stamp: receipt.GetStamp(),
		Events: events,
	}, nil
}

// suspendRunnerState has the scope's runner suspend itself: a live runner
// is sent runner.suspend; a runner that is not running (it stopped on its
// own idle timeout, or crashed) is launched on its state first (it starts
// no provider until a turn asks for one). It returns the runner state,
// which must be durably suspended and the scope's, and the events the
// runner emitted meanwhile.
func (g *Gateway) suspendRunnerState(ctx context.Context, r *runner, dir, sc string, in *prpv1.ExecutionInput, reason string, live bool, st *runnerstate.State) (*runnerstate.State, []*prpv1.Event, error) {
	var events []*prpv1.Event
	var err error
	if live || processAlive(runnerProcess(st)) || st.Lifecycle != runnerstate.LifecycleSuspended {
		// A live runner suspends itself; a runner that is not running (it
		// stopped on its own idle timeout, or crashed) is launched on its
		// state first: it starts no provider until a turn asks for one.
		if _, _, _, err := g.ensureRunner(ctx, sc, in, launchMode(g.stateDir(sc)), "", nil); err != nil {
			return nil, nil, err
		}
		events, err = g.controlCommand(ctx, r, sc, &prpv1.RunnerSuspend{Reason: reason})
		if err != nil {
			return nil, nil, err
		}
		if st, err = readRunnerState(dir); err != nil || st == nil {
			return nil, nil, failure.New(codes.FailedPrecondition, failure.NativeSessionCloseUnrecoverable,
				"provider_transport_failed: runner did not durably suspend before checkpoint (state unreadable: %v)", err)
		}
	}
	if st.Lifecycle != runnerstate.LifecycleSuspended || processAlive(runnerProcess(st)) {
		return nil, nil, failure.New(codes.FailedPrecondition, failure.NativeSessionCloseUnrecoverable,
			"provider_transport_failed: runner did not durably suspend before checkpoint (lifecycle %q)", st.Lifecycle)
	}
	if st.Identity.SessionScope != sc {
		return nil, nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessIdentityMismatch,
			"the runner state of scope %s names scope %s", sc, st.Identity.SessionScope)
	}
	return st, events, nil
}

// settleCheckpointedState moves the scope's local state aside after
// checkpoint id when archive is set (the next run continues from the
// stamped checkpoint, not from the local state: a configuration change
// goes through the backup), else marks the state as that checkpoint's.
func settleCheckpointedState(dir, sc, id string, archive bool, log *slog.Logger) error {
	if archive {
		dest, err := archiveState(dir)
		if err != nil {
			return failure.Wrap(err, codes.Internal, failure.RunnerContinuityBreakArchiveFailed,
				"moving the runner state of scope %s aside after checkpoint %s: %v", sc, id, err)
		}
		log.Info("runner state archived; the next run restores the checkpoint", "archive", dest)
	} else if err := markCheckpoint(dir, id); err != nil {
		// Only costs a download: the next Open restores the checkpoint.
		log.Warn("marking the checkpoint", "checkpoint_id", id, "err", err)
	}
	return nil
}

// launchMode is the transport a scope's runner was last launched with.
func launchMode(dir string) string {
	if mode := readLaunchRecord(dir).Mode; mode != "" {
		return mode
	}
	return prp.ModeDialWSLoopback
}

// controlCommand sends the connected runner of sc a control command (typ:
// runner.suspend or session.close, both of which end with the runner
// exiting) under a control attachment, acknowledges every event it emits,
// and waits for the runner process to be gone. It returns the events the
// runner emitted meanwhile.
func (g *Gateway) controlCommand(ctx context.Context, r *runner, sc string, body proto.Message) ([]*prpv1.Event, error) {
	events, _, err := g.command(ctx, r, sc, body, true)
	return events, err
}

// command sends the connected runner of sc the control command of body
// under a control attachment and acknowledges every event it
// emits meanwhile. untilExit: the command ends with the runner exiting
// (see controlCommand), and command returns once the process is gone;
// otherwise it returns with the command's result once it is answered
// completed. It returns the events the runner emitted meanwhile.
func (g *Gateway) command(ctx context.Context, r *runner, sc string, body proto.Message, untilExit bool) ([]*prpv1.Event, *structpb.Struct, error) {
	cmd := prp.NewCommand(body)
	typ := cmd.GetType()
	cmdID := randomID(strings.ReplaceAll(typ, ".", "-") + "-")
	cmd.CommandId = cmdID
	att := &attachment{runID: cmdID, out: make(chan *gatewayv1.AttachResponse, 64), done: make(chan struct{})}
	sent, err := g.sendControl(r, sc, cmd, att)
	if sent == nil {
		return nil, nil, err
	}
	defer func() {
		att.close()
		r.mu.Lock()
		if r.att == att {
			r.att = nil
		}
		r.mu.Unlock()
	}()
	if err != nil {
		return nil, nil, failure.Wrap(err, codes.Unavailable, failure.RunnerDisconnected, "sending %s: %v", typ, err)
	}

	w := &controlEvents{seen: map[uint64]bool{}, acked: sent.after}
	answered := false
	for gone := false; !gone; {
		select {
		case m := <-att.out:
			if b := m.GetEvents(); b != nil {
				w.take(r, b)
			}
			if res := m.GetCommandResult(); res != nil && res.GetCommandId() == cmdID {
				answered = true
				if res.GetStatus() != "completed" {
					return w.events, nil, commandFailed(typ, res)
				}
				if !untilExit {
					return w.events, res.GetResult(), nil
				}
			}
		case <-att.done:
			if !untilExit {
				return w.events, nil, failure.New(codes.Unavailable, failure.RunnerDisconnected,
					"the runner of scope %s went away before it answered %s", sc, typ)
			}
			gone = true // the runner's connection ended
		case <-ctx.Done():
			if !untilExit {
				return w.events, nil, failure.New(codes.DeadlineExceeded, failure.RunnerDisconnected, "%s: no answer within %s", typ, suspendTimeout)
			}
			return w.events, nil, failure.New(codes.DeadlineExceeded, failure.NativeSessionCloseUnrecoverable,
				"provider_transport_failed: runner did not durably suspend before checkpoint (no exit within %s)", suspendTimeout)
		}
	}
	if !answered {
		g.log.Warn("runner went away before answering", "command", typ, "session_scope", sc)
	}
	return w.events, nil, awaitRunnerExit(ctx, sent.child, sent.proc)
}

// sentControl is what sendControl hands back: the acknowledged sequence
// the replay started after, and the runner process (launched child or
// the process its hello named) to wait for.
type sentControl struct {
	after uint64
	child *launched
	proc  *prpv1.ProcessInfo
}

// sendControl makes att the runner's (control) attachment and sends a
// replay and the command cmd, under the runner's lock. A nil result means
// nothing was attached (err says why); with a result, err is the write's
// failure and the caller detaches att.
func (g *Gateway) sendControl(r *runner, sc string, cmd *prpv1.Command, att *attachment) (*sentControl, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.att; old != nil {
		return nil, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy, "session scope %s is serving run %s", sc, old.runID)
	}
	if r.conn == nil {
		return nil, failure.New(codes.Unavailable, failure.RunnerDisconnected, "the runner of scope %s is reconnecting", sc)
	}
	r.att = att
	conn := r.conn
	sent := &sentControl{after: r.ackedSeq, child: r.child, proc: r.hello.GetRunnerProcess()}
	cmd.Schema, cmd.ControllerSeq, cmd.IssuedAt = prp.CommandSchema, r.lastCmdSeq+1, timestamppb.Now()
	err := writeRunner(conn, &prpv1.Frame{Kind: &prpv1.Frame_Replay{Replay: &prpv1.Replay{AfterSourceSeq: sent.after}}})
	if err == nil {
		err = r.writeCommand(conn, cmd)
		r.sentAttach(cmd)
	}
	if err == nil {
		r.lastCmdSeq = cmd.ControllerSeq
	}
	return sent, err
}

// controlEvents collects the events a runner emits under a control
// attachment and acknowledges them as they become contiguous.
type controlEvents struct {
	events []*prpv1.Event
	seen   map[uint64]bool
	acked  uint64
}

// take records the new events of batch b and acknowledges the contiguous
// ones to the runner.
func (w *controlEvents) take(r *runner, b *prpv1.EventBatch) {
	for _, ev := range decodeBatch(b) {
		if ev.GetSourceSeq() > w.acked && !w.seen[ev.GetSourceSeq()] {
			w.seen[ev.GetSourceSeq()] = true
			w.events = append(w.events, ev)
		}
	}
	n := w.acked
	for w.seen[n+1] {
		n++
	}
	if n <= w.acked {
		return
	}
	w.acked = n
	r.mu.Lock()
	if n > r.ackedSeq {
		r.ackedSeq = n
	}
	c := r.conn
	r.mu.Unlock()
	if c != nil {
		_ = writeRunner(c, &prpv1.Frame{Kind: &prpv1.Frame_Ack{Ack: &prpv1.Ack{AckedSourceSeq: n}}})
	}
}

// commandFailed is the error of a control command answered other than
// completed.
func commandFailed(typ string, res *prpv1.CommandResult) error {
	if res.GetCode() == failure.TurnAlreadyActive {
		return failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy, "%s: %s", typ, res.GetMessage())
	}
	if typ != prp.CommandRunnerSuspend {
		return failure.New(codes.FailedPrecondition, failure.Reason(res.GetCode()), "%s: %s", typ, res.GetMessage())
	}
	return failure.New(codes.FailedPrecondition, failure.NativeSessionCloseUnrecoverable,
		"%s: runner did not durably suspend before checkpoint (%s: %s)", failure.ProviderTransportFailed, res.GetCode(), res.GetMessage())
}

// awaitRunnerExit waits for the runner process itself to be gone: the
// launched child, else the process its hello named.
func awaitRunnerExit(ctx context.Context, child *launched, proc *prpv1.ProcessInfo) error {
	var exited <-chan struct{}
	if child != nil {
		exited = child.done
	} else {
		exited = waitGone(proc, 30*time.Second)
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return failure.New(codes.DeadlineExceeded, failure.NativeSessionCloseUnrecoverable,
			"provider_transport_failed: runner did not durably suspend before checkpoint (the runner process did not exit)")
	}
	return nil
}

// decodeBatch returns a relayed batch's events: the relay carries them as
// their protobuf encoding (opaque to GetEvents), so they are decoded here.
func decodeBatch(b *prpv1.EventBatch) []*prpv1.Event {
	if len(b.GetEvents()) > 0 {
		return b.GetEvents()
	}
	raw, err := proto.Marshal(b)
	if err != nil {
		return nil
	}
	out := &prpv1.EventBatch{}
	if err := proto.Unmarshal(raw, out); err != nil {
		return nil
	}
	return out.GetEvents()
}

// waitGone returns a channel closed once p (not a child) is gone, or after
// limit.
func waitGone(p *prpv1.ProcessInfo, limit time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(limit)
		for processAlive(p) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return done
}

// executionIdentity is the backup identity of an input.
func executionIdentity(in *prpv1.ExecutionInput) (*backupv1.ExecutionIdentity, error) {
	p := in.GetProvider()
	prov := map[string]any{"kind": p.GetKind()}
	for k, v := range map[string]string{
		"model": p.GetModel(), "approvalPolicy": p.GetApprovalPolicy(), "sandbox": p.GetSandbox(),
		"permissionMode": p.GetPermissionMode(), "agent": p.GetAgent(),
	} {
		if v != "" {
			prov[k] = v
		}
	}
	ps, err := structpb.NewStruct(prov)
	if err != nil {
		return nil, err
	}
	driver := in.GetSession().GetDriverKind()
	if driver == "" {
		driver = scope.DefaultDriverKind(p.GetKind())
	}
	w := in.GetWorkspace()
	return &backupv1.ExecutionIdentity{
		CompanyId: in.GetBinding().GetCompanyId(), AgentId: in.GetBinding().GetAgentId(), IssueId: in.GetBinding().GetIssueId(),
		NormalizedSessionId: in.GetSession().GetNormalizedSessionId(), DriverKind: driver,
		Workspace: &backupv1.Workspace{Cwd: w.GetCwd(), RepoUrl: w.GetRepoUrl(), RepoRef: w.GetRef(), BranchName: w.GetBranch()},
		Provider:  ps,
	}, nil
}

// writeProfile writes the profile directories of a runnerd state dir as
// one tar stream (runner/…, <provider home>/…) without the excluded
// entries.
func writeProfile(w io.Writer, dir string, prof persistence) error {
	tw := tar.NewWriter(w)
	lim := &archive.Limits{}
	for _, d := range prof.dirs {
		opts := archive.WriteOptions{Prefix: d, Exclude: runnerExclusions, Limits: lim}
		if d == prof.home {
			opts.Exclude, opts.ExcludeAnywhere = prof.exclude, prof.anywhere
		}
		if _, err := archive.WriteTar(tw, filepath.Join(dir, d), opts); err != nil {
			return err
		}
	}
	return tw.Close()
}

// upload snapshots the profile directories and streams them to the backup
// verifier; the answer is its receipt.
func (g *Gateway) upload(ctx context.Context, dir, sc, lease string, in *prpv1.ExecutionInput, st *runnerstate.State, prof persistence) (*backupv1.UploadCheckpointResponse, error) {
	exec, err := executionIdentity(in)
	if err != nil {
		return nil, failure.Wrap(err, codes.InvalidArgument, failure.RunnerHarnessStateMismatch, "execution identity: %v", err)
	}
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.cfg.Backup.UploadCheckpoint(uctx)
	if err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "backup verifier: %v", err)
	}
	hdr := &backupv1.CheckpointHeader{
		SessionScope: sc, RunnerInstanceId: st.Identity.RunnerInstanceID, LeaseId: lease, Execution: exec,
		ProviderSessionIdentity: &backupv1.ProviderSessionIdentity{ProviderSessionId: st.ProviderThreadID},
		Directories:             prof.dirs, CompletedAt: timestamppb.Now(),
	}
	if err := stream.Send(&backupv1.UploadCheckpointRequest{Part: &backupv1.UploadCheckpointRequest_Header{Header: hdr}}); err != nil {
		_, rerr := stream.CloseAndRecv()
		return nil, uploadErr(err, rerr)
	}
	out := chunkio.NewWriter(uploadChunk, func(chunk []byte) error {
		return stream.Send(&backupv1.UploadCheckpointRequest{Part: &backupv1.UploadCheckpointRequest_Chunk{Chunk: chunk}})
	})
	err = writeProfile(out, dir, prof)
	if err == nil {
		err = out.Close()
	}
	if serr := out.Err(); serr != nil {
		_, rerr := stream.CloseAndRecv()
		return nil, uploadErr(serr, rerr)
	}
	if err != nil {
		cancel() // abandon the upload: the verifier stores nothing
		return nil, err
	}
	res, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return res, nil
}

// uploadErr prefers the verifier's answer over the transport error of a
// Send (a refused upload ends the stream early).
func uploadErr(sendErr, recvErr error) error {
	if recvErr != nil && !errors.Is(recvErr, io.EOF) {
		return recvErr
	}
	return failure.Wrap(sendErr, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "backup verifier: %v", sendErr)
}

// CloseRunner closes the scope's connected runner with session.close (see
// the RPC): the runner interrupts a turn in progress, stops its provider,
// records its state as suspended and exits. A scope whose runner is not
// connected answers closed=false and launches nothing.
func (g *Gateway) CloseRunner(ctx context.Context, req *gatewayv1.CloseRunnerRequest) (*gatewayv1.CloseRunnerResponse, error) {
	in := req.GetInput()
	sc := scope.OfRun(req.GetRunId(), in)
	if err := g.authorize(ctx, grant.Want{Method: grant.MethodCloseRunner, RunID: req.GetRunId(), Scope: sc}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
	defer cancel()
	r := g.runnerFor(sc)
	release, err := r.acquireOp(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	r.mu.Lock()
	connected, inst := r.conn != nil, r.instanceID
	r.mu.Unlock()
	out := &gatewayv1.CloseRunnerResponse{SessionScope: sc, RunnerInstanceId: inst}
	if !connected {
		return out, nil
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "session closed by request"
	}
	events, err := g.controlCommand(ctx, r, sc, &prpv1.SessionClose{Reason: reason})
	out.Events = events
	if err != nil {
		return nil, err
	}
	out.Closed = true
	g.log.Info("runner closed", "session_scope", sc, "runner_instance_id", inst, "reason", reason)
	return out, nil
}
