// Package api serves tether.backup.v1.BackupVerifier: handlers decode the
// request, call the domain (internal/checkpoint, internal/providerpack) and
// map the result; they hold no logic of their own.
package api

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/chunkio"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/services/backup/internal/checkpoint"
	"github.com/tether-run/tether/services/backup/internal/manifest"
	"github.com/tether-run/tether/services/backup/internal/providerpack"
	"github.com/tether-run/tether/services/backup/internal/store"
)

// ChunkSize is the size of download chunks.
const ChunkSize = 1 << 20

// Server implements backupv1.BackupVerifierServer.
type Server struct {
	backupv1.UnimplementedBackupVerifierServer
	Svc *checkpoint.Service
	// PackRoots are the directories VerifyProviderPack may read: a pack root
	// must be one of them or below one of them.
	PackRoots []string
}

// UploadCheckpoint receives the header, then the archive chunks, which are
// piped to the domain as they arrive (one chunk in memory at a time).
func (s *Server) UploadCheckpoint(stream grpc.ClientStreamingServer[backupv1.UploadCheckpointRequest, backupv1.UploadCheckpointResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return failure.New(codes.InvalidArgument, failure.BackupUploadHeaderMissing, "the upload ended before its header")
		}
		return err
	}
	ph := first.GetHeader()
	if ph == nil {
		return failure.New(codes.InvalidArgument, failure.BackupUploadHeaderMissing, "an upload starts with its header")
	}
	h := checkpoint.Header{
		SessionScope: ph.GetSessionScope(), RunnerInstanceID: ph.GetRunnerInstanceId(), LeaseID: ph.GetLeaseId(),
		Execution: ExecutionFromProto(ph.GetExecution()), ProviderSessionIdentity: SessionIdentityFromProto(ph.GetProviderSessionIdentity()),
		Directories: ph.GetDirectories(),
	}
	if ph.GetCompletedAt() != nil {
		h.CompletedAt = ph.GetCompletedAt().AsTime()
	}
	if _, err := checkpoint.CheckHeader(h); err != nil {
		return err
	}
	errSecondHeader := errors.New("second header")
	src := chunkio.NewReader(func() ([]byte, error) {
		msg, err := stream.Recv()
		if err == nil && msg.GetHeader() != nil {
			return nil, errSecondHeader
		}
		return msg.GetChunk(), err
	})
	r, err := s.Svc.Upload(ctx, h, src)
	if err == nil {
		// Padding after the archive's end is drained (bounded), not refused.
		_, _ = io.Copy(io.Discard, io.LimitReader(src, 1<<20))
	}
	switch rerr := src.Err(); {
	case errors.Is(rerr, errSecondHeader):
		return failure.New(codes.InvalidArgument, failure.BackupUploadHeaderMissing, "an upload carries one header")
	case rerr != nil:
		return rerr
	case err != nil:
		return err
	}
	return stream.SendAndClose(&backupv1.UploadCheckpointResponse{
		Checkpoint: CheckpointToProto(r.Checkpoint, r.Manifest), Stamp: r.Stamp,
	})
}

func selector(id, md string) checkpoint.Selector {
	return checkpoint.Selector{CheckpointID: id, ManifestDigest: md}
}

// DownloadCheckpoint streams the checkpoint record, then its archive.
func (s *Server) DownloadCheckpoint(req *backupv1.DownloadCheckpointRequest, stream grpc.ServerStreamingServer[backupv1.DownloadCheckpointResponse]) error {
	ctx := stream.Context()
	c, err := s.Svc.Lookup(ctx, selector(req.GetCheckpointId(), req.GetManifestDigest()))
	if err != nil {
		return err
	}
	m, _ := manifest.ParseManifest(c.Manifest)
	if err := stream.Send(&backupv1.DownloadCheckpointResponse{Part: &backupv1.DownloadCheckpointResponse_Checkpoint{
		Checkpoint: CheckpointToProto(c, m)}}); err != nil {
		return err
	}
	return s.Svc.Download(ctx, c, ChunkSize, func(b []byte) error {
		return stream.Send(&backupv1.DownloadCheckpointResponse{Part: &backupv1.DownloadCheckpointResponse_Chunk{Chunk: b}})
	})
}

// VerifyBackup verifies a stored checkpoint (quick or deep).
func (s *Server) VerifyBackup(ctx context.Context, req *backupv1.VerifyBackupRequest) (*backupv1.VerifyBackupResponse, error) {
	c, err := s.Svc.Lookup(ctx, selector(req.GetCheckpointId(), req.GetManifestDigest()))
	if err != nil {
		return nil, err
	}
	mode := checkpoint.Quick
	if req.GetMode() == backupv1.VerifyMode_VERIFY_MODE_DEEP {
		mode = checkpoint.Deep
	}
	var exp *manifest.Expectation
	if req.GetExpectedExecution() != nil || req.GetExpectedRunnerInstanceId() != "" {
		exp = &manifest.Expectation{Execution: ExecutionFromProto(req.GetExpectedExecution()), RunnerInstanceID: req.GetExpectedRunnerInstanceId()}
	}
	res, err := s.Svc.Verify(ctx, c, mode, exp)
	if err != nil {
		return nil, err
	}
	out := &backupv1.VerifyBackupResponse{
		Valid: res.Valid, Reason: res.Reason, Detail: res.Detail, Mode: req.GetMode(), BytesVerified: res.Bytes,
		Checkpoint: CheckpointToProto(c, res.Manifest),
	}
	for _, d := range res.Directories {
		out.Directories = append(out.Directories, &backupv1.DirectoryCheck{
			Name: d.Name, ExpectedSha256: d.ExpectedSHA256, ActualSha256: d.ActualSHA256,
			ExpectedBytes: d.ExpectedBytes, ActualBytes: d.ActualBytes, Ok: d.OK,
		})
	}
	return out, nil
}

// VerifyStamp verifies a stamp for a lease against its stored backup.
func (s *Server) VerifyStamp(ctx context.Context, req *backupv1.VerifyStampRequest) (*backupv1.VerifyStampResponse, error) {
	ok, reason, err := s.Svc.VerifyStamp(ctx, req.GetStamp(), req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	return &backupv1.VerifyStampResponse{Valid: ok, Reason: reason}, nil
}

// VerifyProviderPack verifies a provider pack below an allowed root.
func (s *Server) VerifyProviderPack(_ context.Context, req *backupv1.VerifyProviderPackRequest) (*backupv1.VerifyProviderPackResponse, error) {
	root, err := s.packRoot(req.GetPackRoot())
	if err != nil {
		return nil, err
	}
	out := &backupv1.VerifyProviderPackResponse{PackRoot: root}
	m, err := providerpack.Read(root, providerpack.Options{Platform: req.GetPlatform(), Architecture: req.GetArchitecture()})
	if err != nil {
		out.Reason, out.Message = string(failure.CodeOf(err)), err.Error()
		if out.Reason == "" {
			out.Reason = failure.RunnerRemoteProviderArtifactIncompatible
		}
		return out, nil
	}
	out.Valid = true
	out.ManifestDigest, out.DistDigest, out.BridgeDigest = m.Digest, m.DistDigest, m.BridgeDigest
	out.RunnerSourceRevision, out.Pins = m.RunnerSourceRevision, m.Pins
	return out, nil
}

func (s *Server) packRoot(req string) (string, error) {
	if req == "" {
		for _, r := range s.PackRoots {
			if fi, err := os.Lstat(filepath.Join(r, providerpack.FileName)); err == nil && fi.Mode().IsRegular() {
				return r, nil
			}
		}
		return "", failure.New(codes.NotFound, failure.RunnerRemoteProviderArtifactIncompatible,
			"no provider pack is installed (looked in %s)", strings.Join(s.PackRoots, ", "))
	}
	if !filepath.IsAbs(req) || filepath.Clean(req) != req {
		return "", failure.New(codes.InvalidArgument, failure.BackupProviderPackRootNotAllowed, "pack root %q is not a clean absolute path", req)
	}
	for _, r := range s.PackRoots {
		if req == r || strings.HasPrefix(req, strings.TrimSuffix(r, "/")+"/") {
			return req, nil
		}
	}
	return "", failure.New(codes.PermissionDenied, failure.BackupProviderPackRootNotAllowed, "pack root %q is not below an allowed provider pack root", req)
}

// ExecutionFromProto converts an execution identity.
func ExecutionFromProto(e *backupv1.ExecutionIdentity) manifest.Execution {
	return manifest.Execution{
		CompanyID: e.GetCompanyId(), AgentID: e.GetAgentId(), IssueID: e.GetIssueId(),
		NormalizedSessionID: e.GetNormalizedSessionId(), DriverKind: e.GetDriverKind(),
		Workspace: manifest.Workspace{Cwd: e.GetWorkspace().GetCwd(), RepoURL: e.GetWorkspace().GetRepoUrl(),
			RepoRef: e.GetWorkspace().GetRepoRef(), BranchName: e.GetWorkspace().GetBranchName()},
		Provider: e.GetProvider().AsMap(),
	}
}

// SessionIdentityFromProto converts a provider session identity.
func SessionIdentityFromProto(p *backupv1.ProviderSessionIdentity) manifest.SessionIdentity {
	out := manifest.SessionIdentity{ProviderSessionID: p.GetProviderSessionId(), ProviderBackendSessionID: p.GetProviderBackendSessionId()}
	if p.GetProviderSessionIdentity() != nil {
		out.ProviderSessionIdentity = p.GetProviderSessionIdentity().AsMap()
	}
	return out
}

func structOf(m map[string]any) *structpb.Struct {
	if m == nil {
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil
	}
	return s
}

// CheckpointToProto renders a stored checkpoint (m may be nil when the
// stored manifest no longer parses).
func CheckpointToProto(c *store.Checkpoint, m *manifest.Manifest) *backupv1.Checkpoint {
	out := &backupv1.Checkpoint{
		CheckpointId: c.ID, ManifestDigest: c.ManifestDigest, ManifestJson: c.Manifest,
		CreatedAt: timestamppb.New(c.CreatedAt),
	}
	if m == nil {
		return out
	}
	pm := &backupv1.Manifest{
		Schema: m.Schema, CheckpointId: m.CheckpointID, SessionScope: m.SessionScope,
		NormalizedSessionId: m.NormalizedSessionID, RunnerInstanceId: m.RunnerInstanceID,
		ProviderKind: m.ProviderKind, DriverKind: m.DriverKind,
		ProviderSessionIdentity: &backupv1.ProviderSessionIdentity{
			ProviderSessionId:        m.ProviderSessionIdentity.ProviderSessionID,
			ProviderBackendSessionId: m.ProviderSessionIdentity.ProviderBackendSessionID,
			ProviderSessionIdentity:  structOf(m.ProviderSessionIdentity.ProviderSessionIdentity),
		},
		SourceLeaseId: m.SourceLeaseID, EnvironmentFingerprint: m.EnvironmentFingerprint,
		RunnerContractVersion: int32(m.RunnerContractVersion),
		Execution: &backupv1.ExecutionIdentity{
			CompanyId: m.Identity.CompanyID, AgentId: m.Identity.AgentID, IssueId: m.Identity.IssueID,
			NormalizedSessionId: m.Identity.NormalizedSessionID, DriverKind: m.Identity.DriverKind,
			Workspace: &backupv1.Workspace{Cwd: m.Identity.Workspace.Cwd, RepoUrl: m.Identity.Workspace.RepoURL,
				RepoRef: m.Identity.Workspace.RepoRef, BranchName: m.Identity.Workspace.BranchName},
			Provider: structOf(m.Identity.Provider),
		},
	}
	if t, err := time.Parse(time.RFC3339Nano, m.CompletedAt); err == nil {
		pm.CompletedAt = timestamppb.New(t)
	}
	for _, d := range m.Directories {
		pm.Directories = append(pm.Directories, &backupv1.DirectoryDigest{Name: d.Name, Sha256: d.SHA256, Bytes: d.Bytes})
	}
	if a := m.Archive; a != nil {
		pm.Archive = &backupv1.ArchiveInfo{Sha256: a.SHA256, Bytes: a.Bytes, ExpandedBytes: a.ExpandedBytes, Entries: int32(a.Entries)}
	}
	out.Manifest = pm
	return out
}

// DeleteCheckpoints deletes stored checkpoints and their archives (SPEC L1).
// Over mTLS only executors may: a gateway uploads and restores, it never
// decides what is deleted.
func (s *Server) DeleteCheckpoints(ctx context.Context, req *backupv1.DeleteCheckpointsRequest) (*backupv1.DeleteCheckpointsResponse, error) {
	if roles := grpcx.PeerRoles(ctx); len(roles) > 0 && !slices.Contains(roles, identity.Executor) {
		return nil, failure.New(codes.PermissionDenied, failure.CallerNotAuthorized, "only executors delete checkpoints")
	}
	n, bytes, err := s.Svc.Delete(ctx, req.GetCheckpointIds(), req.GetSessionScopes())
	if err != nil {
		return nil, err
	}
	return &backupv1.DeleteCheckpointsResponse{Deleted: n, ArchiveBytes: bytes}, nil
}
