package manifest

import (
	"bytes"

	"github.com/tether-run/tether/pkg/digest"
)

// TransitionAllowed decides whether a backup whose provider session identity
// is current may stand in for previous. Identical identities (canonical
// JSON) are always allowed. A different one only for an ACPX execution that
// carries at least one governed interaction response, when both inner
// identities are ACPX records, the current one is of the execution's
// normalized session, normalizedSessionId, profileDigest, workspaceDigest,
// requestedModel, effectiveModel and permissionMode are equal strings on
// both, acpxRecordId, backendSessionId and agentSessionId are strings on
// both, and on each side the outer providerSessionId is the acpxRecordId and
// the outer providerBackendSessionId is the backendSessionId (so a backend
// session id not bound to the record is refused).
func TransitionAllowed(exec Execution, previous, current SessionIdentity) bool {
	pj, err1 := digest.Canonical(previous)
	cj, err2 := digest.Canonical(current)
	if err1 == nil && err2 == nil && bytes.Equal(pj, cj) {
		return true
	}
	if exec.ProviderKind() != "acpx" || len(exec.InteractionResponses) == 0 {
		return false
	}
	p, c := previous.ProviderSessionIdentity, current.ProviderSessionIdentity
	if str(p, "kind") != "acpx" || str(c, "kind") != "acpx" {
		return false
	}
	if s, ok := strOK(c, "normalizedSessionId"); !ok || s != exec.NormalizedSessionID {
		return false
	}
	for _, k := range []string{"normalizedSessionId", "profileDigest", "workspaceDigest", "requestedModel", "effectiveModel", "permissionMode"} {
		a, okA := strOK(p, k)
		b, okB := strOK(c, k)
		if !okA || !okB || a != b {
			return false
		}
	}
	for _, k := range []string{"acpxRecordId", "backendSessionId", "agentSessionId"} {
		if _, ok := strOK(p, k); !ok {
			return false
		}
		if _, ok := strOK(c, k); !ok {
			return false
		}
	}
	bound := func(s SessionIdentity) bool {
		return s.ProviderSessionID == str(s.ProviderSessionIdentity, "acpxRecordId") &&
			s.ProviderBackendSessionID == str(s.ProviderSessionIdentity, "backendSessionId")
	}
	return bound(previous) && bound(current)
}

func strOK(m map[string]any, k string) (string, bool) {
	s, ok := m[k].(string)
	return s, ok
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// Acquisition outcomes of a sandbox environment lease.
const (
	AcquisitionCreated     = "created"
	AcquisitionResumed     = "resumed"
	AcquisitionReplacement = "replacement"
)

// ShouldRestoreIntoSandbox reports whether a verified backup is restored
// into a sandbox: only into a freshly created one, when its lease is not
// reusable and a backup exists.
func ShouldRestoreIntoSandbox(acquisitionOutcome string, reusableLeaseConfigured, backupAvailable bool) bool {
	return acquisitionOutcome == AcquisitionCreated && !reusableLeaseConfigured && backupAvailable
}

// RestoreAction is what a runner start does with harness state.
type RestoreAction string

// Restore actions.
const (
	// UseInPlace: the sandbox's own harness state is complete; use it.
	UseInPlace RestoreAction = "use_in_place"
	// RestoreBackup: restore the verified backup, then check the restored
	// runner identity equals the manifest's.
	RestoreBackup RestoreAction = "restore_backup"
	// StartFresh: no state anywhere; a new provider session may start.
	StartFresh RestoreAction = "start_fresh"
)

// DecideRestore chooses between the sandbox's in-place harness state and a
// verified backup. A resumed sandbox must have complete state; a
// replacement sandbox restores the backup; a created sandbox restores it by
// ShouldRestoreIntoSandbox; otherwise complete in-place state is used, and
// incomplete state while a backup exists is failure.RunnerHarnessStateMismatch — a new
// provider session is never started silently when provider state may exist.
func DecideRestore(acquisitionOutcome string, reusableLeaseConfigured, inPlaceComplete, backupAvailable bool) (RestoreAction, error) {
	switch {
	case acquisitionOutcome == AcquisitionResumed:
		if !inPlaceComplete {
			return "", mismatch("a resumed sandbox has incomplete harness state")
		}
		return UseInPlace, nil
	case acquisitionOutcome == AcquisitionReplacement:
		if !backupAvailable {
			return "", mismatch("a replacement sandbox needs a verified backup and there is none")
		}
		return RestoreBackup, nil
	case ShouldRestoreIntoSandbox(acquisitionOutcome, reusableLeaseConfigured, backupAvailable):
		return RestoreBackup, nil
	case inPlaceComplete:
		return UseInPlace, nil
	case backupAvailable:
		return "", mismatch("harness state is incomplete while a backup exists")
	}
	return StartFresh, nil
}
