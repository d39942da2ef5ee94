package api_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob/fileblob"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/backup/internal/api"
	"github.com/tether-run/tether/services/backup/internal/checkpoint"
	"github.com/tether-run/tether/services/backup/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var migrator = pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName(store.GooseTable))

type env struct {
	client    backupv1.BackupVerifierClient
	dsn       string
	bucketDir string
	packRoot  string
}

func newEnv(t *testing.T, withDB bool, mutate func(*checkpoint.Service)) *env {
	t.Helper()
	e := &env{bucketDir: t.TempDir(), packRoot: t.TempDir()}
	svc := &checkpoint.Service{Key: []byte("test stamp key of thirty-two b!!"), StagingDir: t.TempDir(),
		Log: slog.New(slog.DiscardHandler)}
	if withDB {
		e.dsn = pgtest.NewDB(t, migrator)
		st, err := store.Open(context.Background(), e.dsn)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		bucket, err := fileblob.OpenBucket(e.bucketDir, nil)
		require.NoError(t, err)
		t.Cleanup(func() { bucket.Close() })
		svc.Store, svc.Bucket = st, bucket
	}
	if mutate != nil {
		mutate(svc)
	}
	srv, err := grpcx.New(grpcx.Config{Name: "backup-verifier", GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	backupv1.RegisterBackupVerifierServer(srv.GRPC(), &api.Server{Svc: svc, PackRoots: []string{e.packRoot}})
	require.NoError(t, srv.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	conn, err := grpcx.Dial(srv.Addr().String(), "")
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		cancel()
		<-done
	})
	e.client = backupv1.NewBackupVerifierClient(conn)
	return e
}

const scope = "5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c"

func execution() *backupv1.ExecutionIdentity {
	p, _ := structpb.NewStruct(map[string]any{"kind": "codex", "model": "gpt-5.6-sol", "approvalPolicy": "never"})
	return &backupv1.ExecutionIdentity{
		CompanyId: "company", AgentId: "agent", IssueId: "issue", NormalizedSessionId: "native-session",
		DriverKind: "codex_app_server", Provider: p,
		Workspace: &backupv1.Workspace{Cwd: "/workspace", RepoUrl: "https://example.test/repo.git", RepoRef: "main", BranchName: "tether/test"},
	}
}

func header(lease string) *backupv1.CheckpointHeader {
	return &backupv1.CheckpointHeader{
		SessionScope: scope, RunnerInstanceId: "runner-1", LeaseId: lease, Execution: execution(),
		ProviderSessionIdentity: &backupv1.ProviderSessionIdentity{ProviderSessionId: "thread-1", ProviderBackendSessionId: "session-1"},
		Directories:             []string{"runner", "codex-home"},
	}
}

func put(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, []byte(data), mode))
}

// harnessTree lays out a suspended session's runner state and codex home,
// credentials and scratch included.
func harnessTree(t *testing.T) string {
	root := t.TempDir()
	put(t, filepath.Join(root, "runner", "runner-state.json"), `{"lifecycle":"suspended"}`, 0o600)
	put(t, filepath.Join(root, "runner", "outbox", "0000000001.json"), `{"seq":1}`, 0o600)
	put(t, filepath.Join(root, "codex-home", "sessions", "2026", "thread.jsonl"), "thread-state\n", 0o600)
	put(t, filepath.Join(root, "codex-home", "history.jsonl"), strings.Repeat("history line\n", 20000), 0o644)
	put(t, filepath.Join(root, "codex-home", "auth.json"), "credential", 0o600)
	put(t, filepath.Join(root, "codex-home", "config.toml"), "bearer token", 0o600)
	put(t, filepath.Join(root, "codex-home", ".tmp", "scratch.bin"), "scratch", 0o600)
	return root
}

func tarOf(t *testing.T, root string) []byte {
	var b bytes.Buffer
	_, err := archive.WriteTree(&b, root, archive.WriteOptions{})
	require.NoError(t, err)
	return b.Bytes()
}

func upload(ctx context.Context, c backupv1.BackupVerifierClient, h *backupv1.CheckpointHeader, data []byte) (*backupv1.UploadCheckpointResponse, error) {
	stream, err := c.UploadCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&backupv1.UploadCheckpointRequest{Part: &backupv1.UploadCheckpointRequest_Header{Header: h}}); err != nil {
		return stream.CloseAndRecv()
	}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		if err := stream.Send(&backupv1.UploadCheckpointRequest{Part: &backupv1.UploadCheckpointRequest_Chunk{Chunk: data[:n]}}); err != nil {
			break // the server refused: CloseAndRecv has its status
		}
		data = data[n:]
	}
	return stream.CloseAndRecv()
}

func download(ctx context.Context, t *testing.T, c backupv1.BackupVerifierClient, id string) (*backupv1.Checkpoint, []byte, error) {
	stream, err := c.DownloadCheckpoint(ctx, &backupv1.DownloadCheckpointRequest{Selector: &backupv1.DownloadCheckpointRequest_CheckpointId{CheckpointId: id}})
	require.NoError(t, err)
	var cp *backupv1.Checkpoint
	var buf bytes.Buffer
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return cp, buf.Bytes(), nil
		}
		if err != nil {
			return cp, buf.Bytes(), err
		}
		if msg.GetCheckpoint() != nil {
			cp = msg.GetCheckpoint()
		}
		buf.Write(msg.GetChunk())
	}
}

func verify(ctx context.Context, t *testing.T, c backupv1.BackupVerifierClient, id string, mode backupv1.VerifyMode) *backupv1.VerifyBackupResponse {
	t.Helper()
	res, err := c.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: id}, Mode: mode})
	require.NoError(t, err)
	return res
}

func requireCode(t *testing.T, err error, grpcCode codes.Code, code string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, grpcCode, st.Code(), "%v", err)
	require.True(t, strings.HasPrefix(st.Message(), code+": "), "message %q does not start with %s", st.Message(), code)
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	require.Equal(t, code, reason)
}

func countRows(t *testing.T, dsn string) int {
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM backup.checkpoints`).Scan(&n))
	return n
}

func blobFiles(t *testing.T, dir string) []string {
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	}))
	return out
}

func TestB3_ServiceUploadVerifyDownloadRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src := harnessTree(t)
	data := tarOf(t, src)

	receipt, err := upload(ctx, e.client, header("sandbox-1"), data)
	require.NoError(t, err)
	cp, st := receipt.GetCheckpoint(), receipt.GetStamp()
	m := cp.GetManifest()
	require.Equal(t, digest.Bytes(cp.GetManifestJson()), cp.GetManifestDigest())
	require.Equal(t, "sandbox-1", m.GetSourceLeaseId())
	require.Equal(t, "codex", m.GetProviderKind())
	require.Equal(t, "codex_app_server", m.GetDriverKind())
	require.Len(t, m.GetDirectories(), 2)
	require.Equal(t, "runner", m.GetDirectories()[0].GetName())
	require.Equal(t, "codex-home", m.GetDirectories()[1].GetName())
	require.Equal(t, "sandbox-1", st.GetLeaseId())
	require.Equal(t, cp.GetManifestDigest(), st.GetManifestDigest())
	require.Equal(t, scope, st.GetSessionScope())
	var parsed map[string]any
	require.NoError(t, json.Unmarshal(cp.GetManifestJson(), &parsed))
	require.Equal(t, "tether.harness-backup.v1", parsed["schema"])

	// The recorded digest of each directory is the tree digest of the source
	// without the excluded entries (credentials and scratch never stored).
	runnerDigest, err := digest.BackupTree(filepath.Join(src, "runner"))
	require.NoError(t, err)
	require.Equal(t, runnerDigest.Digest, m.GetDirectories()[0].GetSha256())
	for _, gone := range []string{"auth.json", "config.toml", ".tmp"} {
		require.NoError(t, os.RemoveAll(filepath.Join(src, "codex-home", gone)))
	}
	homeDigest, err := digest.BackupTree(filepath.Join(src, "codex-home"))
	require.NoError(t, err)
	require.Equal(t, homeDigest.Digest, m.GetDirectories()[1].GetSha256())
	require.Equal(t, homeDigest.Bytes, m.GetDirectories()[1].GetBytes())

	quick := verify(ctx, t, e.client, cp.GetCheckpointId(), backupv1.VerifyMode_VERIFY_MODE_QUICK)
	require.True(t, quick.GetValid(), quick.GetDetail())
	deep := verify(ctx, t, e.client, cp.GetCheckpointId(), backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.True(t, deep.GetValid(), deep.GetDetail())
	require.Equal(t, m.GetArchive().GetBytes(), deep.GetBytesVerified())
	require.Len(t, deep.GetDirectories(), 2)
	for _, d := range deep.GetDirectories() {
		require.True(t, d.GetOk())
		require.Equal(t, d.GetExpectedSha256(), d.GetActualSha256())
	}

	// By manifest digest too, and with the expected identity: a
	// continuation of the same session (the identity holds no run id)
	// verifies; another runner instance does not.
	byDigest, err := e.client.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_ManifestDigest{ManifestDigest: cp.GetManifestDigest()},
		Mode:     backupv1.VerifyMode_VERIFY_MODE_DEEP, ExpectedExecution: execution(), ExpectedRunnerInstanceId: "runner-1",
	})
	require.NoError(t, err)
	require.True(t, byDigest.GetValid(), byDigest.GetDetail())
	other, err := e.client.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: cp.GetCheckpointId()},
		Mode:     backupv1.VerifyMode_VERIFY_MODE_QUICK, ExpectedExecution: execution(), ExpectedRunnerInstanceId: "runner-2",
	})
	require.NoError(t, err)
	require.False(t, other.GetValid())
	require.Equal(t, failure.BackupIdentityMismatch, other.GetReason())

	// Stamps: valid for the lease they were issued for only.
	ok, err := e.client.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: st, LeaseId: "sandbox-1"})
	require.NoError(t, err)
	require.True(t, ok.GetValid(), ok.GetReason())
	ok, err = e.client.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: st, LeaseId: "sandbox-2"})
	require.NoError(t, err)
	require.False(t, ok.GetValid())
	require.Equal(t, "backup_stamp_lease_mismatch", ok.GetReason())

	// Download and restore into a durable target.
	got, archiveBytes, err := download(ctx, t, e.client, cp.GetCheckpointId())
	require.NoError(t, err)
	require.Equal(t, cp.GetManifestDigest(), got.GetManifestDigest())
	sum := sha256.Sum256(archiveBytes)
	require.Equal(t, m.GetArchive().GetSha256(), "sha256:"+hex.EncodeToString(sum[:]))
	restoreParent := t.TempDir()
	target := filepath.Join(restoreParent, "session")
	put(t, filepath.Join(target, "stale"), "old", 0o600)
	_, err = archive.Restore(bytes.NewReader(archiveBytes), target, archive.RestoreOptions{})
	require.NoError(t, err)
	for _, d := range m.GetDirectories() {
		r, err := digest.BackupTree(filepath.Join(target, d.GetName()))
		require.NoError(t, err)
		require.Equal(t, d.GetSha256(), r.Digest, d.GetName())
	}
	require.NoFileExists(t, filepath.Join(target, "codex-home", "auth.json"))
	require.NoFileExists(t, filepath.Join(target, "stale"))

	// Not found is an error with its code.
	_, err = e.client.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: "nope"}, Mode: backupv1.VerifyMode_VERIFY_MODE_QUICK})
	requireCode(t, err, codes.NotFound, failure.BackupCheckpointNotFound)
}

// flipByte changes one byte of needle's first occurrence in the stored archive.
func flipByte(t *testing.T, path string, needle string) {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	i := bytes.Index(b, []byte(needle))
	require.GreaterOrEqual(t, i, 0)
	b[i] ^= 0x20
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

func storedArchive(t *testing.T, e *env) string {
	var tars []string
	for _, f := range blobFiles(t, e.bucketDir) {
		if strings.HasSuffix(f, ".tar") {
			tars = append(tars, f)
		}
	}
	require.Len(t, tars, 1)
	return tars[0]
}

func TestB3_ServiceTamperedStoredByteFailsDeepVerifyNotError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	receipt, err := upload(ctx, e.client, header("sandbox-1"), tarOf(t, harnessTree(t)))
	require.NoError(t, err)
	id := receipt.GetCheckpoint().GetCheckpointId()
	flipByte(t, storedArchive(t, e), "thread-state")

	quick := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_QUICK)
	require.True(t, quick.GetValid(), "quick mode checks sizes only")
	deep := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_DEEP)
	require.False(t, deep.GetValid())
	require.Equal(t, failure.BackupDigestMismatch, deep.GetReason())
	var bad []string
	for _, d := range deep.GetDirectories() {
		if !d.GetOk() {
			bad = append(bad, d.GetName())
		}
	}
	require.Equal(t, []string{"codex-home"}, bad)

	ok, err := e.client.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: receipt.GetStamp(), LeaseId: "sandbox-1"})
	require.NoError(t, err)
	require.False(t, ok.GetValid())
	require.Equal(t, "backup_digest_mismatch", ok.GetReason())

	_, _, err = download(ctx, t, e.client, id)
	requireCode(t, err, codes.DataLoss, failure.BackupArchiveCorrupt)

	// A removed archive: quick and deep say so, without an error.
	require.NoError(t, os.Remove(storedArchive(t, e)))
	gone := verify(ctx, t, e.client, id, backupv1.VerifyMode_VERIFY_MODE_QUICK)
	require.False(t, gone.GetValid())
	require.Equal(t, failure.BackupArchiveMissing, gone.GetReason())
	ok, err = e.client.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: receipt.GetStamp(), LeaseId: "sandbox-1"})
	require.NoError(t, err)
	require.Equal(t, failure.BackupArchiveMissing, ok.GetReason())
}

func rawTar(t *testing.T, hdrs ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		require.NoError(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size)))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

func TestB4_ServiceRefusesUnsafeArchiveWithItsCodeAndStoresNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, func(s *checkpoint.Service) { s.Limits = archive.Limits{MaxEntries: 50} })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := func(n string) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o700} }
	file := func(n string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o600, Size: size}
	}
	many := []*tar.Header{dir("runner/"), dir("codex-home/")}
	for i := range 60 {
		many = append(many, file("runner/f"+strings.Repeat("x", i), 1))
	}
	cases := map[string]struct {
		data []byte
		code string
	}{
		"symlink": {rawTar(t, dir("runner/"), dir("codex-home/"),
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "codex-home/host-secret", Linkname: "/etc/passwd", Mode: 0o777}), failure.RunnerRemoteCheckpointArchiveUnsafeEntry},
		"hard link": {rawTar(t, dir("runner/"), file("runner/a", 1),
			&tar.Header{Typeflag: tar.TypeLink, Name: "runner/b", Linkname: "runner/a"}), failure.RunnerRemoteCheckpointArchiveUnsafeEntry},
		"fifo":      {rawTar(t, dir("runner/"), &tar.Header{Typeflag: tar.TypeFifo, Name: "runner/p", Mode: 0o600}), failure.RunnerRemoteCheckpointArchiveUnsafeEntry},
		"dotdot":    {rawTar(t, dir("runner/"), file("runner/../../escape", 1)), failure.RunnerRemoteCheckpointArchiveUnsafePath},
		"absolute":  {rawTar(t, file("/runner/x", 1)), failure.RunnerRemoteCheckpointArchiveUnsafePath},
		"setuid":    {rawTar(t, dir("runner/"), &tar.Header{Typeflag: tar.TypeReg, Name: "runner/s", Mode: 0o4755, Size: 1}), failure.RunnerRemoteCheckpointArchiveUnsafeMode},
		"duplicate": {rawTar(t, dir("runner/"), file("runner/a", 1), file("runner/a", 2)), failure.RunnerRemoteCheckpointArchiveDuplicateEntry},
		"entries":   {rawTar(t, many...), failure.RunnerRemoteCheckpointArchiveTooManyEntries},
		"layout":    {rawTar(t, dir("runner/"), dir("opencode/")), failure.RunnerRemoteCheckpointArchiveInvalid},
		"garbage":   {bytes.Repeat([]byte("garbage!"), 200), failure.RunnerRemoteCheckpointArchiveInvalid},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := upload(ctx, e.client, header("sandbox-1"), c.data)
			grpcCode := codes.InvalidArgument
			if c.code == failure.RunnerRemoteCheckpointArchiveTooManyEntries {
				grpcCode = codes.ResourceExhausted
			}
			requireCode(t, err, grpcCode, c.code)
			require.Zero(t, countRows(t, e.dsn))
			require.Empty(t, blobFiles(t, e.bucketDir))
		})
	}

	// A gzip archive is accepted; one larger than the archive limit is
	// refused while it streams.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(tarOf(t, harnessTree(t)))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	receipt, err := upload(ctx, e.client, header("sandbox-1"), gz.Bytes())
	require.NoError(t, err)
	require.Len(t, receipt.GetCheckpoint().GetManifest().GetDirectories(), 2)
	require.Equal(t, 1, countRows(t, e.dsn))
	small := newEnv(t, true, func(s *checkpoint.Service) { s.Limits = archive.Limits{MaxArchiveBytes: 64 << 10} })
	_, err = upload(ctx, small.client, header("sandbox-1"), tarOf(t, harnessTree(t)))
	requireCode(t, err, codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveTooLarge)
	require.Zero(t, countRows(t, small.dsn))
	require.Empty(t, blobFiles(t, small.bucketDir))

	// A complete archive missing a profile directory is a state mismatch.
	_, err = upload(ctx, e.client, header("sandbox-1"), rawTar(t, dir("runner/"), file("runner/a", 1)))
	requireCode(t, err, codes.FailedPrecondition, "runner_harness_state_mismatch")
	require.Equal(t, 1, countRows(t, e.dsn))
}

func TestB2_ServiceRefusesHeaderNotMatchingTheProfile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := tarOf(t, harnessTree(t))

	h := header("sandbox-1")
	h.Directories = []string{"runner"}
	_, err := upload(ctx, e.client, h, data)
	requireCode(t, err, codes.FailedPrecondition, "runner_harness_state_mismatch")

	h = header("sandbox-1")
	h.ProviderSessionIdentity = &backupv1.ProviderSessionIdentity{}
	_, err = upload(ctx, e.client, h, data)
	requireCode(t, err, codes.FailedPrecondition, "runner_harness_state_mismatch")

	h = header("sandbox-1")
	h.Execution.DriverKind = "acpx_runtime"
	_, err = upload(ctx, e.client, h, data)
	requireCode(t, err, codes.FailedPrecondition, "runner_harness_state_mismatch")

	h = header("sandbox-1")
	h.SessionScope = "not-a-scope"
	_, err = upload(ctx, e.client, h, data)
	requireCode(t, err, codes.InvalidArgument, failure.InvalidRequest)

	stream, err := e.client.UploadCheckpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&backupv1.UploadCheckpointRequest{Part: &backupv1.UploadCheckpointRequest_Chunk{Chunk: data[:512]}}))
	_, err = stream.CloseAndRecv()
	requireCode(t, err, codes.InvalidArgument, failure.BackupUploadHeaderMissing)
	require.Zero(t, countRows(t, e.dsn))
}

func TestWithoutDatabaseCheckpointsAreDisabled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := upload(ctx, e.client, header("sandbox-1"), tarOf(t, harnessTree(t)))
	requireCode(t, err, codes.FailedPrecondition, failure.BackupMetadataDisabled)
	_, err = e.client.VerifyBackup(ctx, &backupv1.VerifyBackupRequest{
		Selector: &backupv1.VerifyBackupRequest_CheckpointId{CheckpointId: "x"}, Mode: backupv1.VerifyMode_VERIFY_MODE_DEEP})
	requireCode(t, err, codes.FailedPrecondition, failure.BackupMetadataDisabled)
	res, err := e.client.VerifyStamp(ctx, &backupv1.VerifyStampRequest{Stamp: &backupv1.Stamp{LeaseId: "l"}, LeaseId: "l"})
	require.NoError(t, err)
	require.False(t, res.GetValid())
	require.Equal(t, "backup_stamp_incomplete", res.GetReason())
}

// writePack lays out a minimal, fully digested provider pack.
func writePack(t *testing.T, root string) {
	files := map[string]string{
		"dist/cli/opencode-app-server-proxy.cjs":    "proxy\n",
		"dist/cli/acpx-runtime-sidecar.cjs":         "sidecar\n",
		"node_modules/node/bin/node":                "node\n",
		"pnpm-lock.yaml":                            "lock\n",
		"node_modules/.bin/opencode":                "#!/bin/sh\n",
		"node_modules/opencode-ai/bin/opencode.exe": "exe\n",
	}
	arts := map[string]any{}
	names := map[string]string{
		"nodeCommand": "node_modules/node/bin/node", "productionLock": "pnpm-lock.yaml",
		"opencodeCommand": "node_modules/.bin/opencode", "opencodeExecutable": "node_modules/opencode-ai/bin/opencode.exe",
		"opencodeProxy": "dist/cli/opencode-app-server-proxy.cjs", "acpxSidecar": "dist/cli/acpx-runtime-sidecar.cjs",
	}
	for rel, data := range files {
		put(t, filepath.Join(root, rel), data, 0o644)
	}
	for name, rel := range names {
		arts[name] = map[string]any{"path": rel, "sha256": digest.String(files[rel])}
	}
	dist, err := digest.PackTree(filepath.Join(root, "dist"))
	require.NoError(t, err)
	payload := map[string]any{
		"pins": map[string]any{"nodeMinimum": "24.11.0", "codex": "0.148.0", "opencode": "1.18.17",
			"acpx": "0.13.1", "claudeAcp": "0.70.0", "codexAcp": "1.6.2"},
		"target":               map[string]any{"platform": "linux", "architecture": "x64"},
		"runnerSourceRevision": strings.Repeat("a", 40),
		"distDigest":           dist,
		"bridgeDigest":         digest.String(digest.String("proxy\n") + "\n" + digest.String("sidecar\n") + "\n" + dist),
		"acpxProfileDigests": map[string]any{
			"claude": "sha256:9d73d1f0f121fb96cc8badb28c22d5bff02d8582eb2e40360a81c189e1b9422a",
			"codex":  "sha256:94049b3e3c3aee87de62703786e4fa81d031d7bd979f99bdf516d84f28791a79",
		},
		"artifacts": arts,
	}
	d, err := digest.CanonicalHash(payload)
	require.NoError(t, err)
	b, err := json.Marshal(map[string]any{"schema": "tether-runner/remote-provider-pack/v1", "digest": d, "payload": payload})
	require.NoError(t, err)
	put(t, filepath.Join(root, "provider-pack.json"), string(b), 0o644)
}

func TestB1_ServiceVerifiesProviderPack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.client.VerifyProviderPack(ctx, &backupv1.VerifyProviderPackRequest{})
	require.Equal(t, codes.NotFound, status.Code(err))

	writePack(t, e.packRoot)
	res, err := e.client.VerifyProviderPack(ctx, &backupv1.VerifyProviderPackRequest{})
	require.NoError(t, err)
	require.True(t, res.GetValid(), res.GetMessage())
	require.Equal(t, "1.18.17", res.GetPins()["opencode"])
	require.True(t, digest.Valid(res.GetManifestDigest()))

	put(t, filepath.Join(e.packRoot, "dist", "cli", "opencode-app-server-proxy.cjs"), "tampered\n", 0o644)
	res, err = e.client.VerifyProviderPack(ctx, &backupv1.VerifyProviderPackRequest{PackRoot: e.packRoot, Platform: "linux"})
	require.NoError(t, err)
	require.False(t, res.GetValid())
	require.Equal(t, "runner_remote_provider_artifact_incompatible", res.GetReason())
	require.Equal(t, "runner_remote_provider_artifact_incompatible: OpenCode proxy digest mismatch", res.GetMessage())

	_, err = e.client.VerifyProviderPack(ctx, &backupv1.VerifyProviderPackRequest{PackRoot: t.TempDir()})
	requireCode(t, err, codes.PermissionDenied, failure.BackupProviderPackRootNotAllowed)
	_, err = e.client.VerifyProviderPack(ctx, &backupv1.VerifyProviderPackRequest{PackRoot: e.packRoot + "/../x"})
	requireCode(t, err, codes.InvalidArgument, failure.BackupProviderPackRootNotAllowed)
}

var _ grpc.ClientConnInterface = (*grpc.ClientConn)(nil)
