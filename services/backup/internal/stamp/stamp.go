// Package stamp issues and verifies backup stamps. A stamp binds a manifest
// digest, the session scope, the normalized session, the runner instance,
// the checkpoint, the source lease and the completion time to the one lease
// it is authorised for, signed with the verifier's HMAC key. It verifies
// only for that lease, only with that key, and — through VerifyBackup —
// only while the manifest it names is unchanged and every directory digest
// of the backup still matches.
package stamp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"regexp"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/services/backup/internal/manifest"
)

// Schema names the stamp layout.
const Schema = "tether.backup-stamp.v2"

const domain = "tether-backup-stamp-v2"

var scopeRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func mac(key []byte, s *backupv1.Stamp) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(domain))
	h.Write([]byte{0})
	var n [8]byte
	for _, f := range []string{
		s.GetSchema(), s.GetManifestDigest(), s.GetSessionScope(), s.GetNormalizedSessionId(),
		s.GetRunnerInstanceId(), s.GetCheckpointId(), s.GetSourceLeaseId(), s.GetLeaseId(),
		s.GetCompletedAt().AsTime().UTC().Format("2006-01-02T15:04:05.000000000Z"),
	} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// Sign fills in the stamp's signature.
func Sign(key []byte, s *backupv1.Stamp) {
	s.Signature = hex.EncodeToString(mac(key, s))
}

// Issue signs a stamp for the manifest, authorised for authorizedLease
// (failure.RunnerHarnessBackupLeaseMissing when empty). The manifest must carry a session scope
// (failure.RunnerHarnessBackupScopeInvalid otherwise).
func Issue(key []byte, m *manifest.Manifest, authorizedLease string) (*backupv1.Stamp, error) {
	if authorizedLease == "" {
		return nil, failure.New(codes.InvalidArgument, failure.RunnerHarnessBackupLeaseMissing, "a backup stamp needs the lease it is authorised for")
	}
	if !scopeRE.MatchString(m.SessionScope) {
		return nil, failure.New(codes.InvalidArgument, failure.RunnerHarnessBackupScopeInvalid, "session scope %q is not a scope digest", m.SessionScope)
	}
	d, err := m.Digest()
	if err != nil {
		return nil, err
	}
	at, err := time.Parse(time.RFC3339Nano, m.CompletedAt)
	if err != nil {
		return nil, failure.Wrap(err, codes.InvalidArgument, failure.RunnerHarnessBackupManifestInvalid, "completedAt: %v", err)
	}
	s := &backupv1.Stamp{
		Schema: Schema, ManifestDigest: d, SessionScope: m.SessionScope, NormalizedSessionId: m.NormalizedSessionID,
		RunnerInstanceId: m.RunnerInstanceID, CheckpointId: m.CheckpointID, SourceLeaseId: m.SourceLeaseID,
		LeaseId: authorizedLease, CompletedAt: timestamppb.New(at),
	}
	Sign(key, s)
	return s, nil
}

// Verify reports whether the stamp is complete, signed with key, and
// authorised for leaseID; reason names the first check that failed. It does
// not look at the backup (see VerifyBackup).
func Verify(key []byte, s *backupv1.Stamp, leaseID string) (ok bool, reason string) {
	if s.GetSchema() != Schema || s.GetManifestDigest() == "" || !scopeRE.MatchString(s.GetSessionScope()) ||
		s.GetRunnerInstanceId() == "" || s.GetLeaseId() == "" || s.GetCompletedAt() == nil || leaseID == "" {
		return false, failure.BackupStampIncomplete
	}
	sig, err := hex.DecodeString(s.GetSignature())
	if err != nil || !hmac.Equal(sig, mac(key, s)) {
		return false, failure.BackupStampSignatureInvalid
	}
	if s.GetLeaseId() != leaseID {
		return false, failure.BackupStampLeaseMismatch
	}
	return true, ""
}

// VerifyBackup is Verify, then checks the backup the stamp names: m is the
// stored manifest found by the stamp's manifest digest (nil when there is
// none), current yields the backup's directory digests as they are now.
// The manifest must hash to the stamp's digest and carry the stamp's scope,
// session, runner, checkpoint, source lease and completion time, and every
// directory must still have its recorded digest and size.
func VerifyBackup(key []byte, s *backupv1.Stamp, leaseID string, m *manifest.Manifest, current manifest.DigestFunc) (bool, string) {
	if ok, reason := Verify(key, s, leaseID); !ok {
		return false, reason
	}
	if m == nil {
		return false, failure.BackupStampCheckpointMissing
	}
	d, err := m.Digest()
	at, terr := time.Parse(time.RFC3339Nano, m.CompletedAt)
	if err != nil || terr != nil || d != s.GetManifestDigest() || m.SessionScope != s.GetSessionScope() ||
		m.NormalizedSessionID != s.GetNormalizedSessionId() || m.RunnerInstanceID != s.GetRunnerInstanceId() ||
		m.CheckpointID != s.GetCheckpointId() || m.SourceLeaseID != s.GetSourceLeaseId() ||
		!at.Equal(s.GetCompletedAt().AsTime()) {
		return false, failure.BackupStampManifestMismatch
	}
	if !m.DirectoriesMatch(current) {
		return false, failure.BackupDigestMismatch
	}
	return true, ""
}
