// Package checkpoint is the backup verifier's service domain: it receives a
// checkpoint archive, checks it while it streams, digests the profile
// directories, stores a canonical archive in the blob store and the manifest
// in PostgreSQL, issues the lease-bound stamp, and verifies, serves and
// re-checks what it stored.
package checkpoint

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/services/backup/internal/manifest"
	"github.com/tether-run/tether/services/backup/internal/stamp"
	"github.com/tether-run/tether/services/backup/internal/store"
)

// Service implements the verifier's operations.
type Service struct {
	// Bucket holds the archives.
	Bucket *blob.Bucket
	// Store holds the metadata; nil disables uploads, downloads and backup
	// verification (failure.BackupMetadataDisabled).
	Store *store.Store
	// Key signs stamps.
	Key []byte
	// Limits bound uploaded archives; zero fields take the defaults.
	Limits archive.Limits
	// StagingDir receives upload staging directories (default os.TempDir);
	// see PrepareStaging.
	StagingDir string
	// Metrics, when set, count what the logs report (staging trees that
	// could not be removed).
	Metrics *Metrics
	// Now defaults to time.Now.
	Now func() time.Time
	// Log defaults to slog.Default.
	Log *slog.Logger
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

func (s *Service) enabled() error {
	if s.Store == nil || s.Bucket == nil {
		return failure.New(codes.FailedPrecondition, failure.BackupMetadataDisabled,
			"this backup verifier runs without a database (-database-url): checkpoints are disabled")
	}
	return nil
}

// Header describes an upload.
type Header struct {
	SessionScope            string
	RunnerInstanceID        string
	LeaseID                 string
	Execution               manifest.Execution
	ProviderSessionIdentity manifest.SessionIdentity
	Directories             []string
	// CompletedAt defaults to the time the upload is received.
	CompletedAt time.Time
}

// Receipt is the result of an upload.
type Receipt struct {
	Checkpoint *store.Checkpoint
	Manifest   *manifest.Manifest
	Stamp      *backupv1.Stamp
}

var scopeRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// CheckHeader validates an upload header against the provider's persistence
// profile before any byte of the archive is read.
func CheckHeader(h Header) (manifest.Profile, error) {
	if !scopeRE.MatchString(h.SessionScope) {
		return manifest.Profile{}, failure.New(codes.InvalidArgument, failure.RunnerHarnessBackupScopeInvalid, "session scope %q is not a scope digest", h.SessionScope)
	}
	if h.LeaseID == "" {
		return manifest.Profile{}, failure.New(codes.InvalidArgument, failure.RunnerHarnessBackupLeaseMissing, "a checkpoint needs the lease it was taken under")
	}
	prof, err := manifest.ResolveProfile(h.Execution.ProviderKind())
	if err != nil {
		return prof, err
	}
	if h.Execution.DriverKind != prof.DriverKind {
		return prof, failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch,
			"driver kind %q does not drive provider %q (want %s)", h.Execution.DriverKind, prof.ProviderKind, prof.DriverKind)
	}
	if !prof.SameNames(h.Directories) {
		return prof, failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch,
			"directories %v are not the %s persistence profile %v", h.Directories, prof.ProviderKind, prof.Names())
	}
	if !h.ProviderSessionIdentity.Present() {
		return prof, failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch, "the checkpoint has no provider session identity")
	}
	if h.RunnerInstanceID == "" || h.Execution.NormalizedSessionID == "" {
		return prof, failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch, "the checkpoint has no runner instance or session identity")
	}
	return prof, nil
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Upload checks the archive read from body while it streams (into a
// private staging directory, so memory stays bounded whatever its size),
// drops the profile's excluded entries, digests every profile directory,
// stores a canonical archive and the manifest, and issues the stamp. An
// unsafe archive is refused with its archive code and nothing is stored.
func (s *Service) Upload(ctx context.Context, h Header, body io.Reader) (*Receipt, error) {
	if err := s.enabled(); err != nil {
		return nil, err
	}
	prof, err := CheckHeader(h)
	if err != nil {
		return nil, err
	}
	staging, err := os.MkdirTemp(s.StagingDir, stagingPrefix)
	if err != nil {
		return nil, failure.Wrap(err, codes.Internal, failure.BackupStoreFailed, "creating staging directory: %v", err)
	}
	defer s.removeStaging(staging)
	tree := filepath.Join(staging, "tree")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return nil, failure.Wrap(err, codes.Internal, failure.BackupStoreFailed, "%v", err)
	}
	if _, err := archive.Extract(body, tree, archive.ExtractOptions{
		Limits: s.Limits, Top: prof.Names(), Exclude: prof.Exclusions(), ExcludeAnywhere: prof.ExclusionsAnywhere(),
	}); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	digests, err := digestAll(tree, prof.Names())
	if err != nil {
		return nil, err
	}
	id := newID()
	at := h.CompletedAt
	if at.IsZero() {
		at = s.now()
	}
	// Build the manifest once without the archive record to fail fast on
	// identity problems before anything is stored.
	in := manifest.BuildInput{
		Execution: h.Execution, RunnerInstanceID: h.RunnerInstanceID, ProviderSessionIdentity: h.ProviderSessionIdentity,
		SourceLeaseID: h.LeaseID, SessionScope: h.SessionScope, CheckpointID: id, CompletedAt: at,
	}
	if _, err := manifest.Build(in, digests.get); err != nil {
		return nil, err
	}

	key := fmt.Sprintf("checkpoints/%s/%s.tar", h.SessionScope, id)
	info, err := s.writeArchive(ctx, key, tree)
	if err != nil {
		return nil, err
	}
	stored := false
	defer func() {
		if !stored {
			if derr := s.Bucket.Delete(context.WithoutCancel(ctx), key); derr != nil {
				s.log().Warn("removing unrecorded archive", "key", key, "err", derr)
			}
		}
	}()
	in.Archive = info
	m, err := manifest.Build(in, digests.get)
	if err != nil {
		return nil, err
	}
	canon, err := m.CanonicalJSON()
	if err != nil {
		return nil, err
	}
	md := digest.Bytes(canon)
	st, err := stamp.Issue(s.Key, m, h.LeaseID)
	if err != nil {
		return nil, err
	}
	c := &store.Checkpoint{
		ID: id, SessionScope: h.SessionScope, NormalizedSessionID: m.NormalizedSessionID,
		RunnerInstanceID: m.RunnerInstanceID, SourceLeaseID: m.SourceLeaseID, ProviderKind: m.ProviderKind,
		DriverKind: m.DriverKind, Manifest: canon, ManifestDigest: md, BlobKey: key,
		ArchiveSHA256: info.SHA256, ArchiveBytes: info.Bytes, ExpandedBytes: info.ExpandedBytes, Entries: info.Entries,
		CompletedAt: at, DigestRules: int(archive.CurrentDigestRules),
	}
	if err := s.Store.Insert(ctx, c, h.LeaseID); err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "recording checkpoint: %v", err)
	}
	stored = true
	s.log().Info("checkpoint stored", "checkpoint_id", id, "session_scope", h.SessionScope,
		"archive_bytes", info.Bytes, "entries", info.Entries, "manifest_digest", md)
	return &Receipt{Checkpoint: c, Manifest: m, Stamp: st}, nil
}

type digestSet map[string]digest.Result

func (d digestSet) get(name string) (digest.Result, error) {
	r, ok := d[name]
	if !ok {
		return digest.Result{}, fmt.Errorf("directory %s: %w", name, os.ErrNotExist)
	}
	return r, nil
}

// digestAll digests the profile directories of tree concurrently; a
// directory absent from the archive is simply missing from the set.
func digestAll(tree string, names []string) (digestSet, error) {
	out := digestSet{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for _, n := range names {
		wg.Go(func() {
			r, err := digest.BackupTree(filepath.Join(tree, n), digest.Options{Workers: 2})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, os.ErrNotExist):
			case err != nil:
				if firstErr == nil {
					firstErr = err
				}
			default:
				out[n] = r
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

func (s *Service) writeArchive(ctx context.Context, key, tree string) (*manifest.ArchiveInfo, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.Bucket.NewWriter(wctx, key, &blob.WriterOptions{ContentType: "application/x-tar"})
	if err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "opening blob %s: %v", key, err)
	}
	h := sha256.New()
	st, err := archive.WriteTree(io.MultiWriter(w, h), tree, archive.WriteOptions{})
	if err != nil {
		cancel()
		_ = w.Close()
		return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "writing archive: %v", err)
	}
	if err := w.Close(); err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "storing archive: %v", err)
	}
	return &manifest.ArchiveInfo{
		SHA256: digest.Prefix + hex.EncodeToString(h.Sum(nil)), Bytes: st.ArchiveBytes,
		ExpandedBytes: st.Bytes, Entries: st.Entries,
	}, nil
}

// Selector names a checkpoint by id or by manifest digest.
type Selector struct {
	CheckpointID   string
	ManifestDigest string
}

// Lookup returns a stored checkpoint (failure.BackupCheckpointNotFound when unknown).
func (s *Service) Lookup(ctx context.Context, sel Selector) (*store.Checkpoint, error) {
	if err := s.enabled(); err != nil {
		return nil, err
	}
	var c *store.Checkpoint
	var err error
	if sel.CheckpointID != "" {
		c, err = s.Store.Get(ctx, sel.CheckpointID)
	} else {
		c, err = s.Store.GetByManifestDigest(ctx, sel.ManifestDigest)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, failure.New(codes.NotFound, failure.BackupCheckpointNotFound, "no checkpoint %s%s", sel.CheckpointID, sel.ManifestDigest)
	}
	if err != nil {
		return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "%v", err)
	}
	return c, nil
}

// Download sends the checkpoint's stored archive in chunks of at most
// chunkSize bytes. The archive's digest and size are checked while it
// streams; a mismatch ends the download with DataLoss failure.BackupArchiveCorrupt
// after the chunks already sent (which the caller must discard).
func (s *Service) Download(ctx context.Context, c *store.Checkpoint, chunkSize int, send func([]byte) error) error {
	r, err := s.Bucket.NewReader(ctx, c.BlobKey, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return failure.New(codes.DataLoss, failure.BackupArchiveMissing, "the archive of checkpoint %s is missing", c.ID)
		}
		return failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "%v", err)
	}
	defer r.Close()
	h := sha256.New()
	buf := make([]byte, chunkSize)
	var total int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			total += int64(n)
			if total > c.ArchiveBytes {
				return failure.New(codes.DataLoss, failure.BackupArchiveCorrupt, "the archive of checkpoint %s is larger than recorded", c.ID)
			}
			if serr := send(buf[:n]); serr != nil {
				return serr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "reading archive: %v", err)
		}
	}
	if got := digest.Prefix + hex.EncodeToString(h.Sum(nil)); got != c.ArchiveSHA256 || total != c.ArchiveBytes {
		return failure.New(codes.DataLoss, failure.BackupArchiveCorrupt, "the archive of checkpoint %s does not match its digest", c.ID)
	}
	return nil
}

// Mode of a verification.
type Mode int

// Modes.
const (
	Quick Mode = iota + 1
	Deep
)

// DirectoryCheck is one directory's verification.
type DirectoryCheck struct {
	Name                         string
	ExpectedSHA256, ActualSHA256 string
	ExpectedBytes, ActualBytes   int64
	OK                           bool
}

// Result is a verification's answer.
type Result struct {
	Valid       bool
	Reason      string
	Detail      string
	Checkpoint  *store.Checkpoint
	Manifest    *manifest.Manifest
	Bytes       int64
	Directories []DirectoryCheck
}

func invalid(r *Result, reason, format string, args ...any) *Result {
	r.Valid, r.Reason, r.Detail = false, reason, fmt.Sprintf(format, args...)
	return r
}

// Verify checks a stored checkpoint. Quick: the stored manifest hashes to
// its digest and parses, its directories are its provider's profile, it
// matches exp when given (a continuation run of the same session does),
// and the stored archive has its recorded size. Deep: all of that, then
// every byte of the archive is read again: its digest and every directory's
// tree digest must equal the record. Any difference is an invalid Result,
// not an error.
func (s *Service) Verify(ctx context.Context, c *store.Checkpoint, mode Mode, exp *manifest.Expectation) (*Result, error) {
	res := &Result{Checkpoint: c}
	if digest.Bytes(c.Manifest) != c.ManifestDigest {
		return invalid(res, failure.BackupManifestMismatch, "the stored manifest does not hash to its digest"), nil
	}
	m, err := manifest.ParseManifest(c.Manifest)
	if err != nil {
		return invalid(res, failure.BackupManifestMismatch, "%v", err), nil
	}
	res.Manifest = m
	if d, err := m.Digest(); err != nil || d != c.ManifestDigest {
		return invalid(res, failure.BackupManifestMismatch, "the stored manifest is not canonical"), nil
	}
	prof, err := manifest.ResolveProfile(m.ProviderKind)
	names := make([]string, len(m.Directories))
	for i, d := range m.Directories {
		names[i] = d.Name
	}
	if err != nil || !prof.SameNames(names) || m.Archive == nil || m.CheckpointID != c.ID ||
		m.Archive.SHA256 != c.ArchiveSHA256 || m.Archive.Bytes != c.ArchiveBytes {
		return invalid(res, failure.BackupManifestMismatch, "the manifest does not describe this checkpoint"), nil
	}
	if exp != nil && !m.MatchesIdentity(*exp) {
		return invalid(res, failure.BackupIdentityMismatch, "the backup belongs to another session, runner or environment"), nil
	}
	for _, d := range m.Directories {
		res.Directories = append(res.Directories, DirectoryCheck{Name: d.Name, ExpectedSHA256: d.SHA256, ExpectedBytes: d.Bytes})
	}
	if mode == Quick {
		attrs, err := s.Bucket.Attributes(ctx, c.BlobKey)
		if gcerrors.Code(err) == gcerrors.NotFound {
			return invalid(res, failure.BackupArchiveMissing, "the archive is missing"), nil
		}
		if err != nil {
			return nil, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "%v", err)
		}
		if attrs.Size != c.ArchiveBytes {
			return invalid(res, failure.BackupArchiveCorrupt, "the archive holds %d bytes, recorded %d", attrs.Size, c.ArchiveBytes), nil
		}
		res.Valid = true
		return res, nil
	}
	got, n, reason, detail, err := s.rehashUnderItsRules(ctx, c, m)
	res.Bytes = n
	if err != nil {
		return nil, err
	}
	if got == nil {
		return invalid(res, reason, "%s", detail), nil
	}
	ok := true
	for i := range res.Directories {
		d := &res.Directories[i]
		r := got[d.Name]
		d.ActualSHA256, d.ActualBytes = r.Digest, r.Bytes
		d.OK = r.Digest == d.ExpectedSHA256 && r.Bytes == d.ExpectedBytes
		ok = ok && d.OK
	}
	if !ok || len(got) != len(res.Directories) {
		return invalid(res, failure.BackupDigestMismatch, "a directory of the archive no longer matches its digest"), nil
	}
	if reason != "" {
		return invalid(res, reason, "%s", detail), nil
	}
	res.Valid = true
	return res, nil
}

type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// rehashUnderItsRules rehashes c's archive under the digest rules it was
// made with (SPEC L5). A checkpoint stored before rules were recorded is
// rehashed under the current rules and, when its directories do not match
// m under them, once more under the older rules; rules that match are
// recorded for the next verification.
func (s *Service) rehashUnderItsRules(ctx context.Context, c *store.Checkpoint, m *manifest.Manifest) (got map[string]digest.Result, n int64, reason, detail string, err error) {
	rules := archive.DigestRules(c.DigestRules)
	if c.DigestRules == 0 {
		rules = archive.CurrentDigestRules
	}
	got, n, reason, detail, err = s.rehash(ctx, c, rules)
	if c.DigestRules != 0 || err != nil || got == nil || matchesManifest(m, got) {
		return got, n, reason, detail, err
	}
	older, on, oreason, odetail, oerr := s.rehash(ctx, c, archive.DigestRulesRawDirModes)
	if oerr != nil || older == nil || !matchesManifest(m, older) {
		return got, n, reason, detail, err
	}
	if rerr := s.Store.RecordDigestRules(ctx, c.ID, int(archive.DigestRulesRawDirModes)); rerr != nil {
		s.log().Warn("recording a checkpoint's digest rules", "checkpoint_id", c.ID, "err", rerr)
	}
	s.log().Info("checkpoint verified under older digest rules", "checkpoint_id", c.ID,
		"digest_rules", archive.DigestRulesRawDirModes.String())
	return older, on, oreason, odetail, nil
}

// matchesManifest: every directory m records has its digest and size in got.
func matchesManifest(m *manifest.Manifest, got map[string]digest.Result) bool {
	if m == nil || len(got) != len(m.Directories) {
		return false
	}
	for _, d := range m.Directories {
		r, ok := got[d.Name]
		if !ok || r.Digest != d.SHA256 || r.Bytes != d.Bytes {
			return false
		}
	}
	return true
}

// rehash reads the stored archive completely and returns each directory's
// digest (nil when the archive cannot be digested) and whether the archive
// still has its recorded digest and size; reason and detail say why not.
func (s *Service) rehash(ctx context.Context, c *store.Checkpoint, rules archive.DigestRules) (got map[string]digest.Result, n int64, reason, detail string, err error) {
	r, err := s.Bucket.NewReader(ctx, c.BlobKey, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, 0, failure.BackupArchiveMissing, "the archive is missing", nil
	}
	if err != nil {
		return nil, 0, "", "", failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "%v", err)
	}
	defer r.Close()
	hr := &hashingReader{r: r, h: sha256.New()}
	lim := archive.Limits{MaxArchiveBytes: max(c.ArchiveBytes, 1), MaxExpandedBytes: max(c.ExpandedBytes, 1), MaxEntries: max(c.Entries, 1)}
	got, _, derr := archive.DigestTarWith(hr, lim, rules)
	if _, err := io.Copy(io.Discard, io.LimitReader(hr, c.ArchiveBytes+1-hr.n)); err != nil {
		if ctx.Err() != nil {
			return nil, hr.n, "", "", ctx.Err()
		}
		return nil, hr.n, "", "", failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "reading archive: %v", err)
	}
	if derr != nil {
		return nil, hr.n, failure.BackupArchiveCorrupt, derr.Error(), nil
	}
	if sum := digest.Prefix + hex.EncodeToString(hr.h.Sum(nil)); sum != c.ArchiveSHA256 || hr.n != c.ArchiveBytes {
		return got, hr.n, failure.BackupArchiveCorrupt, "the archive does not match its recorded digest", nil
	}
	return got, hr.n, "", "", nil
}

// VerifyStamp checks a stamp for leaseID: its signature and lease binding,
// then the checkpoint it names, whose archive is re-hashed in full: every
// directory digest must still match.
func (s *Service) VerifyStamp(ctx context.Context, st *backupv1.Stamp, leaseID string) (bool, string, error) {
	if ok, reason := stamp.Verify(s.Key, st, leaseID); !ok {
		return false, reason, nil
	}
	if err := s.enabled(); err != nil {
		return false, failure.BackupMetadataDisabled, nil
	}
	c, err := s.Lookup(ctx, Selector{ManifestDigest: st.GetManifestDigest()})
	if failure.CodeOf(err) == failure.BackupCheckpointNotFound {
		ok, reason := stamp.VerifyBackup(s.Key, st, leaseID, nil, nil)
		return ok, reason, nil
	}
	if err != nil {
		return false, "", err
	}
	m, err := manifest.ParseManifest(c.Manifest)
	if err != nil || digest.Bytes(c.Manifest) != c.ManifestDigest {
		return false, failure.BackupStampManifestMismatch, nil
	}
	got, _, archiveReason, _, err := s.rehashUnderItsRules(ctx, c, m)
	if err != nil {
		return false, "", err
	}
	ok, reason := stamp.VerifyBackup(s.Key, st, leaseID, m, digestSet(got).get)
	if !ok && reason == failure.BackupDigestMismatch && got == nil && archiveReason != "" {
		return false, archiveReason, nil // missing or undigestable archive
	}
	if ok && archiveReason != "" {
		// Directory digests match but the archive bytes differ (e.g. in
		// metadata the digest does not cover): not the stored backup.
		return false, archiveReason, nil
	}
	return ok, reason, nil
}

// Delete deletes the checkpoints named by id and every checkpoint of the
// named session scopes (SPEC L1): each archive first, then its record, so a
// deletion cut short leaves a record whose archive is gone (verification
// says backup_archive_missing) and asking again finishes it; never an
// archive without a record, which nothing would delete. It returns how
// many records and archive bytes went.
func (s *Service) Delete(ctx context.Context, ids, scopes []string) (deleted, archiveBytes int64, err error) {
	if err := s.enabled(); err != nil {
		return 0, 0, err
	}
	doomed, err := s.Store.Doomed(ctx, ids, scopes)
	if err != nil {
		return 0, 0, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "listing checkpoints to delete")
	}
	for _, d := range doomed {
		if err := s.Bucket.Delete(ctx, d.BlobKey); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return deleted, archiveBytes, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "deleting the archive of checkpoint %s", d.ID)
		}
		gone, err := s.Store.Delete(ctx, d.ID)
		if err != nil {
			return deleted, archiveBytes, failure.Wrap(err, codes.Unavailable, failure.BackupStoreFailed, "deleting checkpoint %s", d.ID)
		}
		if gone {
			deleted++
			archiveBytes += d.ArchiveBytes
		}
	}
	if deleted > 0 {
		s.log().Info("checkpoints deleted", "checkpoints", deleted, "archive_bytes", archiveBytes)
	}
	return deleted, archiveBytes, nil
}
