// Package stamp signs and verifies backup stamps: a stamp binds a manifest
// digest, session scope, runner instance and completion time to one
// environment lease. It verifies only for that lease and only with the
// verifier's key.
package stamp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
)

// Reasons a stamp does not verify.
const (
	ReasonLeaseMismatch = "backup_stamp_lease_mismatch"
	ReasonBadSignature  = "backup_stamp_signature_invalid"
	ReasonIncomplete    = "backup_stamp_incomplete"
)

const domain = "tether-backup-stamp-v1"

func mac(key []byte, s *backupv1.Stamp) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(domain))
	h.Write([]byte{0})
	var n [8]byte
	for _, f := range []string{
		s.GetManifestDigest(), s.GetSessionScope(), s.GetRunnerInstanceId(), s.GetLeaseId(),
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

// Verify reports whether the stamp is complete, signed with key, and bound to
// leaseID; reason names the first check that failed.
func Verify(key []byte, s *backupv1.Stamp, leaseID string) (ok bool, reason string) {
	if s.GetManifestDigest() == "" || s.GetSessionScope() == "" || s.GetRunnerInstanceId() == "" ||
		s.GetLeaseId() == "" || s.GetCompletedAt() == nil {
		return false, ReasonIncomplete
	}
	sig, err := hex.DecodeString(s.GetSignature())
	if err != nil || !hmac.Equal(sig, mac(key, s)) {
		return false, ReasonBadSignature
	}
	if s.GetLeaseId() != leaseID {
		return false, ReasonLeaseMismatch
	}
	return true, ""
}
