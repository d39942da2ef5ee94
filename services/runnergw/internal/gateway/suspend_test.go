package gateway

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// fakeVerifier is an in-memory backup verifier: it keeps uploaded archives
// and "signs" stamps with a fixed token; a stamp verifies while its archive
// is unchanged.
type fakeVerifier struct {
	backupv1.UnimplementedBackupVerifierServer
	mu       sync.Mutex
	headers  []*backupv1.CheckpointHeader
	archives map[string][]byte
	digests  map[string]string
	cps      map[string]*backupv1.Checkpoint
	// claimRunner, when set, is the runner instance the manifest and stamp
	// name instead of the uploaded one (a backup of another runner).
	claimRunner string
	downloads   int
}

func sum(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

func (f *fakeVerifier) UploadCheckpoint(stream grpc.ClientStreamingServer[backupv1.UploadCheckpointRequest, backupv1.UploadCheckpointResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	var buf bytes.Buffer
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		buf.Write(m.GetChunk())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := randomID("cp")[:18]
	inst := h.GetRunnerInstanceId()
	if f.claimRunner != "" {
		inst = f.claimRunner
	}
	cp := &backupv1.Checkpoint{CheckpointId: id, ManifestDigest: sum(append([]byte(id), buf.Bytes()...)), Manifest: &backupv1.Manifest{
		CheckpointId: id, SessionScope: h.GetSessionScope(), RunnerInstanceId: inst,
		NormalizedSessionId: h.GetExecution().GetNormalizedSessionId(), ProviderSessionIdentity: h.GetProviderSessionIdentity(),
		SourceLeaseId: h.GetLeaseId(),
	}}
	f.headers = append(f.headers, h)
	f.archives[id], f.digests[id], f.cps[id] = buf.Bytes(), sum(buf.Bytes()), cp
	st := &backupv1.Stamp{ManifestDigest: cp.GetManifestDigest(), SessionScope: h.GetSessionScope(), RunnerInstanceId: inst,
		LeaseId: h.GetLeaseId(), CheckpointId: id, Signature: "fake-signature", Schema: "tether.backup-stamp.v2",
		CompletedAt: timestamppb.Now()} // the upload's time, as the verifier stamps it
	return stream.SendAndClose(&backupv1.UploadCheckpointResponse{Checkpoint: cp, Stamp: st})
}

func (f *fakeVerifier) VerifyStamp(_ context.Context, req *backupv1.VerifyStampRequest) (*backupv1.VerifyStampResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := req.GetStamp()
	switch {
	case st.GetSignature() != "fake-signature":
		return &backupv1.VerifyStampResponse{Reason: "backup_stamp_signature_invalid"}, nil
	case st.GetLeaseId() != req.GetLeaseId():
		return &backupv1.VerifyStampResponse{Reason: "backup_stamp_lease_mismatch"}, nil
	case f.digests[st.GetCheckpointId()] != sum(f.archives[st.GetCheckpointId()]):
		return &backupv1.VerifyStampResponse{Reason: "backup_digest_mismatch"}, nil
	}
	return &backupv1.VerifyStampResponse{Valid: true}, nil
}

func (f *fakeVerifier) DownloadCheckpoint(req *backupv1.DownloadCheckpointRequest, stream grpc.ServerStreamingServer[backupv1.DownloadCheckpointResponse]) error {
	f.mu.Lock()
	cp, data := f.cps[req.GetCheckpointId()], f.archives[req.GetCheckpointId()]
	f.downloads++
	f.mu.Unlock()
	if err := stream.Send(&backupv1.DownloadCheckpointResponse{Part: &backupv1.DownloadCheckpointResponse_Checkpoint{Checkpoint: cp}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		if err := stream.Send(&backupv1.DownloadCheckpointResponse{Part: &backupv1.DownloadCheckpointResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func startFakeVerifier(t *testing.T) (*fakeVerifier, backupv1.BackupVerifierClient) {
	f := &fakeVerifier{archives: map[string][]byte{}, digests: map[string]string{}, cps: map[string]*backupv1.Checkpoint{}}
	gs := grpc.NewServer()
	backupv1.RegisterBackupVerifierServer(gs, f)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(l) }()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return f, backupv1.NewBackupVerifierClient(conn)
}

func tarNames(t *testing.T, b []byte) map[string]bool {
	out := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out[h.Name] = true
	}
}

func (s server) SuspendRunner(ctx context.Context, req *gatewayv1.SuspendRunnerRequest) (*gatewayv1.SuspendRunnerResponse, error) {
	return s.g.SuspendRunner(ctx, req)
}

// openWith attaches a run with a restore spec and the executor's prior-run
// records; the answer is Opened or the refusal. The stream is closed again.
func (rl *relay) openWith(ctx context.Context, runID string, in *prpv1.ExecutionInput, spec *gatewayv1.RestoreSpec, prior ...*gatewayv1.PriorRun) (*gatewayv1.Opened, error) {
	s, err := rl.client.Attach(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
		RunId: runID, Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in, Restore: spec, PriorRuns: prior,
	}}}); err != nil {
		return nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, err
	}
	_ = s.CloseSend()
	return m.GetOpened(), nil
}

// waitDetached waits until no run is attached to the scope's runner.
func (rl *relay) waitDetached(sc string) {
	rl.t.Helper()
	require.Eventually(rl.t, func() bool { return rl.runner(sc).GetAttachedRunId() == "" }, 30*time.Second, 10*time.Millisecond)
}

func newSuspendRelay(t *testing.T) (*relay, *fakeVerifier) {
	var fv *fakeVerifier
	rl := newRelay(t, func(c *Config) {
		var client backupv1.BackupVerifierClient
		fv, client = startFakeVerifier(t)
		c.Backup = client
	})
	return rl, fv
}

func TestR5_GatewaySuspendsChecksTheLifecycleUploadsAndRestoresIntoANewRunner(t *testing.T) {
	t.Parallel()
	rl, fv := newSuspendRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("suspend", "acme", "first")
	sc := scope.Of(in)
	stateDir := filepath.Join(rl.cfg.StateRoot, sc)
	opened, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	// Credentials and scratch in the provider home never travel.
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, "codex-home", "auth.json"), []byte(`{"token":"secret"}`), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(stateDir, "codex-home", "tmp"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(stateDir, "codex-home", "sub"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, "codex-home", "sub", "auth.json"), []byte(`{"token":"secret"}`), 0o600))

	// A run attached to the scope makes the suspension busy.
	busy, _, err := rl.attach(ctx, "run-busy", nil, in)
	require.NoError(t, err)
	_, err = rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "idle"})
	require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err))
	require.NoError(t, busy.CloseSend())
	rl.waitDetached(sc)

	_, err = rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, LeaseId: "another-lease"})
	require.EqualValues(t, failure.RunnerEnvironmentLeaseMismatch, failure.CodeOf(err))

	resp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, Reason: "warm native session idle timeout"})
	require.NoError(t, err)
	require.Equal(t, sc, resp.GetSessionScope())
	require.Equal(t, opened.GetRunnerInstanceId(), resp.GetRunnerInstanceId())
	require.Equal(t, LeaseFor(sc), resp.GetLeaseId())
	require.NotEmpty(t, resp.GetProviderThreadId())
	var types []string
	for _, ev := range resp.GetEvents() {
		types = append(types, ev.GetEventType())
	}
	require.Contains(t, types, "runner.suspended")
	rs, err := readRunnerState(stateDir)
	require.NoError(t, err)
	require.Equal(t, "suspended", rs.Lifecycle)
	require.False(t, processAlive(runnerProcess(rs)), "runnerd exited")
	require.False(t, rl.runner(sc).GetConnected())

	fv.mu.Lock()
	h := fv.headers[0]
	names := tarNames(t, fv.archives[resp.GetCheckpoint().GetCheckpointId()])
	fv.mu.Unlock()
	require.Equal(t, []string{"runner", "codex-home"}, h.GetDirectories())
	require.Equal(t, "codex_app_server", h.GetExecution().GetDriverKind())
	require.Equal(t, "codex", h.GetExecution().GetProvider().AsMap()["kind"])
	require.Equal(t, resp.GetProviderThreadId(), h.GetProviderSessionIdentity().GetProviderSessionId())
	require.True(t, names["runner/runner-state.json"], "%v", names)
	require.True(t, names["codex-home/fake-codex-state.json"], "%v", names)
	require.False(t, names["codex-home/auth.json"])
	require.False(t, names["codex-home/sub/auth.json"], "SPEC S4: no auth.json at any depth")
	require.True(t, names["codex-home/sub/"], "%v", names)
	require.False(t, names["codex-home/tmp/"])

	// Suspending an already suspended runner checkpoints it again without
	// launching anything.
	again, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in})
	require.NoError(t, err)
	require.NotEqual(t, resp.GetCheckpoint().GetCheckpointId(), again.GetCheckpoint().GetCheckpointId())
	require.Empty(t, again.GetEvents())

	// The state is lost; a restore spec brings it back and the provider
	// thread resumes in a new runner with the same identity.
	require.NoError(t, os.RemoveAll(stateDir))
	spec := &gatewayv1.RestoreSpec{CheckpointId: resp.GetCheckpoint().GetCheckpointId(), Stamp: resp.GetStamp(), LeaseId: resp.GetLeaseId()}
	op, err := rl.openWith(ctx, "run-2", in, spec)
	require.NoError(t, err)
	require.Equal(t, opened.GetRunnerInstanceId(), op.GetRunnerInstanceId())
	require.NotEqual(t, opened.GetRunnerProcess().GetPid(), op.GetRunnerProcess().GetPid())
	rl.waitDetached(sc)
	in2 := proto.Clone(in).(*prpv1.ExecutionInput)
	in2.Task.Prompt = "second"
	_, evs = rl.turn(ctx, "run-3", nil, in2, nil)
	term := evs[len(evs)-1].GetPayload().AsMap()
	require.Equal(t, "succeeded", term["runTerminalState"], "%v", term)
	final := term["finalMessage"]
	require.Contains(t, final, "2 earlier messages")
	require.Equal(t, 1, countCalls(t, rl.callLog, "thread/resume"))
	_, err = os.Stat(filepath.Join(stateDir, "codex-home", "auth.json"))
	require.True(t, os.IsNotExist(err), "credentials were not restored")
}

func TestR5_GatewayRefusesAnUnverifiedOrForeignBackupAndRestoresNothing(t *testing.T) {
	t.Parallel()
	rl, fv := newSuspendRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("refuse", "acme", "first")
	sc := scope.Of(in)
	stateDir := filepath.Join(rl.cfg.StateRoot, sc)
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	fv.mu.Lock()
	fv.claimRunner = "runner-someone-else"
	fv.mu.Unlock()
	foreign, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in})
	require.NoError(t, err)
	fv.mu.Lock()
	fv.claimRunner = ""
	fv.mu.Unlock()
	good, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in})
	require.NoError(t, err)
	require.NoError(t, os.RemoveAll(stateDir))

	nothingRestored := func() {
		t.Helper()
		_, err := os.Stat(stateDir)
		require.True(t, os.IsNotExist(err), "nothing was restored")
		entries, err := os.ReadDir(filepath.Dir(stateDir))
		require.NoError(t, err)
		for _, e := range entries {
			require.NotContains(t, e.Name(), ".tether-checkpoint-")
		}
	}
	specOf := func(r *gatewayv1.SuspendRunnerResponse) *gatewayv1.RestoreSpec {
		return &gatewayv1.RestoreSpec{CheckpointId: r.GetCheckpoint().GetCheckpointId(), Stamp: proto.Clone(r.GetStamp()).(*backupv1.Stamp), LeaseId: r.GetLeaseId()}
	}

	forged := specOf(good)
	forged.Stamp.Signature = "forged"
	_, err = rl.openWith(ctx, "run-forged", in, forged)
	require.EqualValues(t, failure.RunnerHarnessBackupUnverified, failure.CodeOf(err))
	require.Contains(t, err.Error(), "backup_stamp_signature_invalid")
	nothingRestored()

	wrongLease := specOf(good)
	wrongLease.LeaseId = "local-0000000000000000"
	_, err = rl.openWith(ctx, "run-lease", in, wrongLease)
	require.EqualValues(t, failure.RunnerHarnessBackupUnverified, failure.CodeOf(err))
	nothingRestored()

	fv.mu.Lock()
	fv.archives[good.GetCheckpoint().GetCheckpointId()][600] ^= 1 // tampered after it was stamped
	fv.mu.Unlock()
	_, err = rl.openWith(ctx, "run-tampered", in, specOf(good))
	require.EqualValues(t, failure.RunnerHarnessBackupUnverified, failure.CodeOf(err))
	require.Contains(t, err.Error(), "backup_digest_mismatch")
	nothingRestored()

	// A validly stamped backup whose runner state is another runner's.
	_, err = rl.openWith(ctx, "run-foreign", in, specOf(foreign))
	require.EqualValues(t, failure.RunnerHarnessIdentityMismatch, failure.CodeOf(err))
	nothingRestored()
	require.Equal(t, 1, countCalls(t, rl.callLog, "process-start"), "no provider was started")
}
