package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/chunkio"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// localState reports whether the scope has a live runner, and whether it
// has runner state on disk.
func (g *Gateway) localState(r *runner, sc string) (live, hasState bool) {
	r.mu.Lock()
	live = r.conn != nil || r.child != nil
	r.mu.Unlock()
	_, err := os.Lstat(runnerstate.Path(g.stateDir(sc)))
	return live, !errors.Is(err, os.ErrNotExist)
}

// unverified refuses a restore whose backup does not verify; cause (a
// backup verification reason) leads the message and is the ErrorInfo
// metadata "cause".
func unverified(cause failure.Reason, format string, args ...any) error {
	e := failure.New(codes.FailedPrecondition, failure.RunnerHarnessBackupUnverified, "%s", failure.Message(cause, fmt.Sprintf(format, args...)))
	e.Metadata = map[string]string{"cause": string(cause)}
	return e
}

// restore puts the stamped checkpoint of spec in place as the scope's
// runner state and provider home (of provider kind, SPEC B2) for run runID: the stamp must verify for the scope's lease (checked
// by the verifier, which re-hashes the stored backup), the downloaded
// archive is checked entry by entry into a private staging directory, the
// restored runner identity must equal the manifest's, and only then is the
// staged tree renamed into place (stale local state, when replaceLocal, is
// moved aside into continuity-breaks/ first). Any refusal leaves nothing
// behind and the local state untouched.
func (g *Gateway) restore(ctx context.Context, r *runner, sc, runID, kind string, spec *gatewayv1.RestoreSpec, replaceLocal bool) error {
	if g.cfg.Backup == nil {
		return failure.New(codes.FailedPrecondition, failure.RunnerHarnessBackupUnavailable, "a restore needs a backup verifier (-backup-addr)")
	}
	lease := LeaseFor(sc)
	if err := g.verifyRestoreStamp(ctx, sc, lease, spec); err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, m, err := g.downloadCheckpoint(dctx, sc, spec)
	if err != nil {
		return err
	}
	prof, ok := persistenceOf(kind)
	if !ok {
		return failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible,
			"checkpoint %s holds provider %q, which this gateway cannot restore", spec.GetCheckpointId(), kind)
	}
	scopeDir := g.stateDir(sc)
	if fi, err := os.Lstat(scopeDir); err == nil && (fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir()) {
		return failure.New(codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe,
			"durable state root %s is a symlink or not a directory; it is left untouched", scopeDir)
	}
	// Stage beside the scope roots: a refused restore leaves nothing in
	// the scope.
	if err := os.MkdirAll(g.cfg.StateRoot, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	stage, err := os.MkdirTemp(g.cfg.StateRoot, ".tether-checkpoint-")
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	defer os.RemoveAll(stage)
	payload := filepath.Join(stage, "payload")
	if err := os.Mkdir(payload, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	err = extractCheckpoint(stream, payload, prof)
	cancel()
	if err != nil {
		return extractError(err, spec)
	}
	for _, d := range prof.dirs {
		if err := os.MkdirAll(filepath.Join(payload, d), 0o700); err != nil {
			return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
		}
	}
	rs, err := restoredIdentity(payload, m)
	if err != nil {
		return err
	}
	if err := continueAbove(payload, rs, spec.GetMinSourceSeq()); err != nil {
		return err
	}
	return g.installRestored(r, sc, runID, lease, spec, replaceLocal, stage, payload, prof, rs)
}

// verifyRestoreStamp checks that the stamp of spec is for this scope, its
// lease and its checkpoint, and has the verifier verify it for the lease.
func (g *Gateway) verifyRestoreStamp(ctx context.Context, sc, lease string, spec *gatewayv1.RestoreSpec) error {
	st := spec.GetStamp()
	switch {
	case spec.GetLeaseId() != lease:
		return unverified(failure.BackupStampLeaseMismatch, "the replacement runner of scope %s runs under lease %s, not %s", sc, lease, spec.GetLeaseId())
	case st.GetSessionScope() != sc:
		return unverified(failure.BackupIdentityMismatch, "the stamp belongs to scope %s, not %s", st.GetSessionScope(), sc)
	case st.GetCheckpointId() != spec.GetCheckpointId():
		return unverified(failure.BackupIdentityMismatch, "the stamp names checkpoint %s, not %s", st.GetCheckpointId(), spec.GetCheckpointId())
	}
	vr, err := g.cfg.Backup.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: st, LeaseId: lease})
	if err != nil {
		return failure.Wrap(err, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "verifying the backup stamp: %v", err)
	}
	if !vr.GetValid() {
		return unverified(failure.Reason(vr.GetReason()), "the stamp of checkpoint %s does not verify for lease %s", spec.GetCheckpointId(), lease)
	}
	return nil
}

// downloadCheckpoint starts the download of spec's checkpoint and checks
// its first message, the checkpoint record: its manifest must be the
// stamp's and name this scope and the stamp's runner.
func (g *Gateway) downloadCheckpoint(ctx context.Context, sc string, spec *gatewayv1.RestoreSpec) (backupv1.BackupVerifier_DownloadCheckpointClient, *backupv1.Manifest, error) {
	st := spec.GetStamp()
	stream, err := g.cfg.Backup.DownloadCheckpoint(ctx, &backupv1.DownloadCheckpointRequest{
		Selector: &backupv1.DownloadCheckpointRequest_CheckpointId{CheckpointId: spec.GetCheckpointId()}})
	if err != nil {
		return nil, nil, failure.Wrap(err, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "downloading checkpoint: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, failure.Wrap(err, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "downloading checkpoint %s: %v", spec.GetCheckpointId(), err)
	}
	cp := first.GetCheckpoint()
	m := cp.GetManifest()
	switch {
	case cp == nil || m == nil:
		return nil, nil, unverified(failure.BackupManifestMismatch, "the download did not start with the checkpoint record")
	case cp.GetManifestDigest() != st.GetManifestDigest():
		return nil, nil, unverified(failure.BackupStampManifestMismatch, "checkpoint %s has manifest %s, the stamp names %s",
			cp.GetCheckpointId(), cp.GetManifestDigest(), st.GetManifestDigest())
	case m.GetSessionScope() != sc || m.GetRunnerInstanceId() != st.GetRunnerInstanceId():
		return nil, nil, unverified(failure.BackupIdentityMismatch, "the manifest belongs to scope %s runner %s", m.GetSessionScope(), m.GetRunnerInstanceId())
	}
	return stream, m, nil
}

// extractCheckpoint extracts the downloaded archive into payload, entry by
// entry (the profile's directories, its exclusions left out), and reads
// the stream to its end: the download's digest check ends it, and the
// archive is accepted only when it ended cleanly.
func extractCheckpoint(stream backupv1.BackupVerifier_DownloadCheckpointClient, payload string, prof persistence) error {
	src := chunkio.NewReader(func() ([]byte, error) {
		msg, err := stream.Recv()
		return msg.GetChunk(), err
	})
	var excl, anywhere []string
	for _, e := range prof.exclude {
		excl = append(excl, prof.home+"/"+e)
	}
	for _, e := range prof.anywhere {
		anywhere = append(anywhere, prof.home+"/"+e)
	}
	_, err := archive.Extract(src, payload, archive.ExtractOptions{Top: prof.dirs, Exclude: excl, ExcludeAnywhere: anywhere})
	if err == nil {
		_, err = io.Copy(io.Discard, src)
	}
	return err
}

// extractError is the restore's error for a failed extraction: an unsafe
// or malformed archive as is, a backup verification failure unverified,
// anything else the verifier being unavailable.
func extractError(err error, spec *gatewayv1.RestoreSpec) error {
	switch code := failure.CodeOf(err); {
	case strings.HasPrefix(string(code), "runner_remote_checkpoint_"):
		return err // an unsafe or malformed archive
	case strings.HasPrefix(string(code), "backup_"):
		return unverified(code, "checkpoint %s: %v", spec.GetCheckpointId(), err)
	}
	return failure.Wrap(err, codes.Unavailable, failure.RunnerHarnessBackupUnavailable, "restoring checkpoint %s: %v", spec.GetCheckpointId(), err)
}

// installRestored renames the verified staged tree into the scope (stale
// local state, when replaceLocal, moved aside first), binds the run to the
// restored runner and lease and resets the runner's cursors.
func (g *Gateway) installRestored(r *runner, sc, runID, lease string, spec *gatewayv1.RestoreSpec, replaceLocal bool, stage, payload string, prof persistence, rs *runnerstate.State) error {
	scopeDir := g.stateDir(sc)
	if err := os.MkdirAll(scopeDir, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	if replaceLocal {
		// R13: no provider of the replaced root outlives it (runnerd
		// killed, its provider host kept the turn going); it is stopped
		// before the restored runner's provider starts.
		stopOrphanProviderHost(scopeDir)
		dest, err := archiveState(scopeDir)
		if err != nil {
			return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "moving stale runner state aside: %v", err)
		}
		g.log.Warn("stale runner state moved aside", "session_scope", sc, "archive", dest)
	}
	if err := swapIn(scopeDir, stage, payload, prof.home); err != nil {
		return err
	}
	// A verified restore is the run's authority over the scope: the control
	// plane names this run under the restored runner and lease.
	restoredLease := rs.Identity.EnvironmentLeaseID
	if restoredLease == "" {
		restoredLease = lease
	}
	if err := durable.Bind(scopeDir, durable.Identity{RunID: runID, NormalizedSessionID: rs.Identity.NormalizedSessionID,
		RunnerInstanceID: rs.Identity.RunnerInstanceID, EnvironmentLeaseID: restoredLease}); err != nil {
		return err
	}
	if err := markCheckpoint(scopeDir, spec.GetCheckpointId()); err != nil {
		// Only costs a download: the next Open with this checkpoint
		// restores it again.
		g.log.Warn("marking the restored checkpoint", "session_scope", sc, "err", err)
	}
	r.mu.Lock()
	// The restored runner's cursors are its own, not those of whatever ran
	// in this scope before.
	r.ackedSeq, r.lastCmdSeq, r.instanceID = 0, 0, rs.Identity.RunnerInstanceID
	r.bound, r.attachSent = nil, 0
	r.mu.Unlock()
	g.log.Info("runner state restored from a stamped checkpoint", "session_scope", sc, "checkpoint_id", spec.GetCheckpointId(),
		"runner_instance_id", rs.Identity.RunnerInstanceID, "provider_thread_id", rs.ProviderThreadID, "lease_id", lease)
	return nil
}

// restoredIdentity reads the restored runner state in payload; it must be
// the manifest's runner, suspended.
func restoredIdentity(payload string, m *backupv1.Manifest) (*runnerstate.State, error) {
	rs, err := readRunnerState(payload)
	if err != nil || rs == nil {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessIdentityMismatch, "the checkpoint holds no readable runner state (%v)", err)
	}
	if rs.Identity.RunnerInstanceID != m.GetRunnerInstanceId() || rs.Identity.SessionScope != m.GetSessionScope() ||
		rs.Identity.NormalizedSessionID != m.GetNormalizedSessionId() ||
		rs.ProviderThreadID != m.GetProviderSessionIdentity().GetProviderSessionId() {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessIdentityMismatch,
			"restored runner %s (scope %s, session %s, thread %s) is not the manifest's runner %s (scope %s, session %s, thread %s)",
			rs.Identity.RunnerInstanceID, rs.Identity.SessionScope, rs.Identity.NormalizedSessionID, rs.ProviderThreadID,
			m.GetRunnerInstanceId(), m.GetSessionScope(), m.GetNormalizedSessionId(), m.GetProviderSessionIdentity().GetProviderSessionId())
	}
	if rs.Lifecycle != runnerstate.LifecycleSuspended {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerHarnessIdentityMismatch, "the checkpoint's runner is %q, not suspended", rs.Lifecycle)
	}
	return rs, nil
}

// continueAbove makes the restored runner state in payload continue its
// source seqs above minSeq, the highest seq the executor holds from this
// runner instance: a checkpoint that predates events the runner emitted
// afterwards (on a gateway since lost, SPEC F3) must not reuse their seqs.
// Those events are persisted, so they count as acknowledged.
func continueAbove(payload string, rs *runnerstate.State, minSeq uint64) error {
	if minSeq < rs.NextSourceSeq {
		return nil
	}
	rs.NextSourceSeq, rs.AckedSourceSeq = minSeq+1, max(rs.AckedSourceSeq, minSeq)
	raw, err := runnerstate.Encode(rs)
	if err == nil {
		err = atomicfile.Write(filepath.Dir(runnerstate.Path(payload)), filepath.Base(runnerstate.Path(payload)), raw, 0o600)
	}
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "advancing the restored runner's source seq: %v", err)
	}
	return nil
}

// swapIn moves the staged profile directories of payload into scopeDir.
func swapIn(scopeDir, stage, payload, home string) error {
	// Swap the staged directories in: the provider home first, the runner
	// state (whose presence marks the scope as having state) last. The
	// scope holds no runner state (checked under the scope's op lock); any
	// leftover provider home is moved aside into the staging directory.
	for _, d := range []string{home, runnerstate.Dir} {
		target := filepath.Join(scopeDir, d)
		if _, err := os.Lstat(target); err == nil {
			if err := os.Rename(target, filepath.Join(stage, "previous-"+d)); err != nil {
				return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
			}
		}
		if err := os.Rename(filepath.Join(payload, d), target); err != nil {
			return failure.Wrap(err, codes.Internal, failure.RunnerRemoteCheckpointRestoreFailed, "swapping the restored state into place: %v", err)
		}
	}
	if d, err := os.Open(scopeDir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
