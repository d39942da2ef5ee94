// Package durable is the authority over a session scope's durable state root
// (SPEC E13): which run may resume a root, verification of a prior run's
// settled ownership, quarantine of roots whose ownership cannot be proven,
// atomic migration of the legacy root layouts, the per-scope supervisor claim,
// tool authority epochs and the launch plan a runner backend is built from.
//
// Layout under the state base (one directory per scope, named by
// scope.Key.RootName()):
//
//	<base>/<root>/control-plane/control-plane-state.json   identity authority
//	<base>/<root>/runner/runner-state.json                  runnerd's state
//	<base>/quarantine/<root>.<reason>.<unix ms>.<pid>.<random>/
//
// The scoped root is runnerd's --state-dir. Nothing here ever follows, moves
// or deletes through a symlinked root.
package durable

import (
	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/runnerstate"

	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/safefs"
)

// Schemas of the identity documents.
const (
	ControlPlaneSchema = "tether.runner.durable.control-plane-state.v1"
	RunnerStateSchema  = runnerstate.StateSchema
)

// Layout names.
const (
	ControlPlaneDir  = "control-plane"
	ControlPlaneFile = "control-plane-state.json"
	RunnerDir        = runnerstate.Dir
	RunnerStateFile  = runnerstate.StateFile
	QuarantineDir    = "quarantine"
)

// MaxIdentityBytes bounds how much of an identity document is read.
const MaxIdentityBytes = 64 << 20

// Identity is the durable identity a root is bound to.
type Identity struct {
	RunID               string `json:"runId"`
	NormalizedSessionID string `json:"normalizedSessionId"`
	RunnerInstanceID    string `json:"runnerInstanceId"`
	EnvironmentLeaseID  string `json:"environmentLeaseId"`
}

// Complete reports whether every field is set.
func (id Identity) Complete() bool {
	return id.RunID != "" && id.NormalizedSessionID != "" && id.RunnerInstanceID != "" && id.EnvironmentLeaseID != ""
}

// ControlPlaneState is the part of control-plane-state.json this package
// reads and writes; other top-level fields are preserved on rewrite.
type ControlPlaneState struct {
	Schema   string    `json:"schema"`
	Identity *Identity `json:"identity"`
	// AttachSeq is the runner's controller seq when the identity was
	// bound: a run.attach the runner journals above it binds its run
	// (see bound.go). Absent (0) in documents written before it existed.
	AttachSeq uint64 `json:"attachSeq,omitempty"`
}

// RunnerLifecycle is what runner/runner-state.json proves about the runner.
type RunnerLifecycle string

const (
	// RunnerAbsent: no runner state yet (no runner dir, or an empty one).
	RunnerAbsent RunnerLifecycle = "absent"
	// RunnerSuspended: the runner durably suspended; the only settled,
	// resumable owner.
	RunnerSuspended RunnerLifecycle = "suspended"
	// RunnerNotSuspended: a known lifecycle other than suspended.
	RunnerNotSuspended RunnerLifecycle = "not_suspended"
	// RunnerIndeterminate: unsafe directory, unreadable, unknown schema,
	// unknown lifecycle or an identity that differs from the control plane's.
	RunnerIndeterminate RunnerLifecycle = "indeterminate"
)

// KnownLifecycles are the lifecycle values runnerd writes.
var KnownLifecycles = map[string]bool{
	runnerstate.LifecycleConnecting: true, runnerstate.LifecycleReady: true, runnerstate.LifecycleBackpressure: true,
	runnerstate.LifecycleDraining: true, runnerstate.LifecycleSuspended: true, runnerstate.LifecycleStopped: true,
	runnerstate.LifecycleRevoked: true, runnerstate.LifecycleRecoverableFailure: true, runnerstate.LifecycleUnrecoverable: true,
}

// identityRead is the outcome of reading the control-plane identity.
type identityRead struct {
	id        *Identity // nil: indeterminate
	reason    string    // why indeterminate
	attachSeq uint64
}

// ReadControlPlaneIdentity returns the identity root is bound to: its
// control-plane state's, with the run of a later run.attach its runner
// journaled (bound.go), or nil with the reason it is indeterminate
// (missing, symlinked, malformed, unknown schema, no identity). An oversized
// document is an error (runner_durable_identity_too_large); other read
// errors count as indeterminate.
func ReadControlPlaneIdentity(root string) (*Identity, string, error) {
	id, _, reason, err := ReadBinding(root)
	return id, reason, err
}

// ReadBinding is ReadControlPlaneIdentity that also says whether the
// binding rule applies to root (journaled: its runner state is the
// identity's, bound.go): then, and only then, the next run.attach that
// runner journals binds the scope to that command's run, with no write of
// the control plane. A gateway that saw its live runner journal and answer
// such a command knows the binding without reading it again (SPEC P4).
func ReadBinding(root string) (id *Identity, journaled bool, reason string, err error) {
	r, err := readControlPlane(root)
	if err != nil || r.id == nil {
		return r.id, false, r.reason, err
	}
	bound := *r.id
	if runner, _, err := ReadRunnerLifecycle(root, bound); err == nil && (runner == RunnerSuspended || runner == RunnerNotSuspended) {
		bound, journaled = boundIdentity(root, bound, r.attachSeq), true
	}
	return &bound, journaled, "", nil
}

func readControlPlane(root string) (identityRead, error) {
	dir := filepath.Join(root, ControlPlaneDir)
	if fi, err := os.Lstat(dir); err != nil {
		return identityRead{reason: "control-plane directory missing"}, nil
	} else if !realDir(fi) {
		return identityRead{reason: "control-plane is not a real directory"}, nil
	}
	raw, err := readBounded(filepath.Join(dir, ControlPlaneFile))
	if err != nil {
		if isTooLarge(err) {
			return identityRead{}, err
		}
		return identityRead{reason: "control-plane state unreadable: " + err.Error()}, nil
	}
	var doc ControlPlaneState
	if err := json.Unmarshal(raw, &doc); err != nil {
		return identityRead{reason: "control-plane state malformed"}, nil
	}
	if doc.Schema != ControlPlaneSchema {
		return identityRead{reason: fmt.Sprintf("control-plane schema %q is not %s", doc.Schema, ControlPlaneSchema)}, nil
	}
	if doc.Identity == nil {
		return identityRead{reason: "control-plane state has no identity"}, nil
	}
	return identityRead{id: doc.Identity, attachSeq: doc.AttachSeq}, nil
}

// runnerStateDoc accepts both runnerd's nested identity and the flat layout.
type runnerStateDoc struct {
	Schema    string `json:"schema"`
	Lifecycle string `json:"lifecycle"`
	Identity  *struct {
		RunID               string `json:"runId"`
		RunnerInstanceID    string `json:"runnerInstanceId"`
		EnvironmentLeaseID  string `json:"environmentLeaseId"`
		NormalizedSessionID string `json:"normalizedSessionId"`
	} `json:"identity"`
	RunID               string `json:"runId"`
	RunnerInstanceID    string `json:"runnerInstanceId"`
	EnvironmentLeaseID  string `json:"environmentLeaseId"`
	NormalizedSessionID string `json:"normalizedSessionId"`
}

// ReadRunnerLifecycle classifies root's runner state against the control
// plane's identity. The runner's instance, lease and session must equal id's.
// The run id is not compared: runnerd binds its state to (runner, lease,
// session) and learns the run only when one attaches, so after a verified
// continuation has bound the control plane to its own run the runner state
// legitimately still names the earlier one. An oversized document is an
// error.
func ReadRunnerLifecycle(root string, id Identity) (RunnerLifecycle, string, error) {
	dir := filepath.Join(root, RunnerDir)
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return RunnerAbsent, "", nil
	}
	if err != nil {
		return RunnerIndeterminate, "runner directory unreadable: " + err.Error(), nil
	}
	if !realDir(fi) {
		return RunnerIndeterminate, "runner is not a real directory", nil
	}
	file := filepath.Join(dir, RunnerStateFile)
	if _, err := os.Lstat(file); errors.Is(err, fs.ErrNotExist) {
		if empty, err := dirEmpty(dir); err == nil && empty {
			return RunnerAbsent, "", nil
		}
		return RunnerIndeterminate, "runner state missing from a non-empty runner directory", nil
	}
	raw, err := readBounded(file)
	if err != nil {
		if isTooLarge(err) {
			return "", "", err
		}
		return RunnerIndeterminate, "runner state unreadable: " + err.Error(), nil
	}
	var doc runnerStateDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return RunnerIndeterminate, "runner state malformed", nil
	}
	if doc.Schema != RunnerStateSchema {
		return RunnerIndeterminate, fmt.Sprintf("runner state schema %q is not %s", doc.Schema, RunnerStateSchema), nil
	}
	if !KnownLifecycles[doc.Lifecycle] {
		return RunnerIndeterminate, fmt.Sprintf("unknown runner lifecycle %q", doc.Lifecycle), nil
	}
	got := Identity{RunID: doc.RunID, RunnerInstanceID: doc.RunnerInstanceID,
		EnvironmentLeaseID: doc.EnvironmentLeaseID, NormalizedSessionID: doc.NormalizedSessionID}
	if n := doc.Identity; n != nil {
		got = Identity{RunID: first(n.RunID, got.RunID), RunnerInstanceID: first(n.RunnerInstanceID, got.RunnerInstanceID),
			EnvironmentLeaseID:  first(n.EnvironmentLeaseID, got.EnvironmentLeaseID),
			NormalizedSessionID: first(n.NormalizedSessionID, got.NormalizedSessionID)}
	}
	if got.RunnerInstanceID != id.RunnerInstanceID || got.EnvironmentLeaseID != id.EnvironmentLeaseID ||
		got.NormalizedSessionID != id.NormalizedSessionID {
		return RunnerIndeterminate, "runner state identity differs from the control-plane identity", nil
	}
	if doc.Lifecycle == runnerstate.LifecycleSuspended {
		return RunnerSuspended, "", nil
	}
	return RunnerNotSuspended, "runner lifecycle " + doc.Lifecycle, nil
}

// CrashedIdle reports whether root's runner state is that of a runner that
// died between turns (SPEC R8): lifecycle ready or connecting (a runner
// that stopped on purpose records suspended, stopped, …), no active turn
// and no command whose outcome was not yet recorded other than one of
// runID — the control plane's run, which the caller checks is terminal in
// the database: its turn ended, and runnerd died before it saved the state
// that says so (it settles such a turn or command from its journal and the
// provider's thread when it restarts) — and the recorded runnerd process
// is gone. The document is read with its intent log applied, as runnerd
// reads it. Anything unreadable is not idle.
func CrashedIdle(root, runID string) bool {
	raw, err := readBounded(filepath.Join(root, RunnerDir, RunnerStateFile))
	if err != nil {
		return false
	}
	var doc runnerstate.State
	if json.Unmarshal(raw, &doc) != nil {
		return false
	}
	if doc.Lifecycle != runnerstate.LifecycleReady && doc.Lifecycle != runnerstate.LifecycleConnecting {
		return false
	}
	// The intent log holds what the document does not yet: commands in
	// flight, and the outcomes of the warm path's commands (the turn they
	// started) until a saved document covers them.
	if log, err := readBounded(filepath.Join(root, RunnerDir, runnerstate.IntentLogFile)); err == nil {
		for _, in := range doc.ApplyIntentLog(log) {
			if in.RunID == "" || in.RunID != runID {
				return false
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if t := doc.ActiveTurn; t != nil && (t.RunID == "" || t.RunID != runID) {
		return false
	}
	for _, c := range doc.ProcessedCommands {
		if c != nil && c.Status == runnerstate.StatusPending && (c.RunID == "" || c.RunID != runID) {
			return false
		}
	}
	if p := doc.RunnerProcess; p != nil && procid.Alive(p.PID, p.StartTicks, p.BootID) {
		return false
	}
	return true
}

// Bind writes id as root's control-plane identity: root and control-plane
// are created 0700 (a symlink at either fails closed), the document is
// replaced atomically (exclusive temp sibling, fsync, rename, fsync of the
// directory) with mode 0600, and top-level fields other than schema and
// identity of an existing document are preserved. A root's first Bind
// writes the whole control-plane directory aside (bindTempPrefix) and
// renames it into place, so a crash never leaves a control-plane directory
// without its document (which would make the root indeterminate).
//
// The document records the runner's controller seq journaled so far
// (AttachSeq): run.attach commands journaled before it no longer bind.
func Bind(root string, id Identity) error { return BindAfter(root, id, 0) }

// BindAfter is Bind for a scope whose live runner may still journal
// commands the gateway sent up to controller seq sent.
func BindAfter(root string, id Identity, sent uint64) error {
	if !id.Complete() {
		return failure.New(codes.InvalidArgument, failure.RunnerStateIdentityMismatch, "incomplete durable identity %+v", id)
	}
	if err := privateDir(root); err != nil {
		return err
	}
	dir := filepath.Join(root, ControlPlaneDir)
	seq := max(journalSeq(root), sent)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return bindFirst(root, dir, id, seq)
	}
	if err := privateDir(dir); err != nil {
		return err
	}
	doc := map[string]json.RawMessage{}
	if raw, err := readBounded(filepath.Join(dir, ControlPlaneFile)); err == nil {
		_ = json.Unmarshal(raw, &doc) // a malformed document is replaced whole
		if doc == nil {
			doc = map[string]json.RawMessage{}
		}
	}
	doc["schema"], _ = json.Marshal(ControlPlaneSchema)
	doc["identity"], _ = json.Marshal(id)
	doc["attachSeq"], _ = json.Marshal(seq)
	b, err := json.Marshal(doc)
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "encoding control-plane state: %v", err)
	}
	if err := writeFileAtomic(dir, ControlPlaneFile, b); err != nil {
		if failure.CodeOf(err) == failure.RunnerStateDirectoryUnsafe {
			return err
		}
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "writing control-plane state: %v", err)
	}
	return nil
}

// bindTempPrefix begins the name of the directory a first Bind prepares
// before renaming it to control-plane (firstBindCut removes a leftover).
const bindTempPrefix = "." + ControlPlaneDir + ".tmp-"

// bindFirst creates root's control plane holding id: written and synced in
// a private temporary directory, then renamed into place.
func bindFirst(root, dir string, id Identity, seq uint64) error {
	b, err := json.Marshal(ControlPlaneState{Schema: ControlPlaneSchema, Identity: &id, AttachSeq: seq})
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "encoding control-plane state: %v", err)
	}
	tmp, err := os.MkdirTemp(root, bindTempPrefix)
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "creating the control plane in %s: %v", root, err)
	}
	if err := writeFileAtomic(tmp, ControlPlaneFile, b); err != nil {
		_ = os.RemoveAll(tmp)
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "writing control-plane state: %v", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "binding the control plane of %s: %v", root, err)
	}
	if err := syncDir(root); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "syncing %s: %v", root, err)
	}
	return nil
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func realDir(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSymlink == 0 && fi.IsDir() }

func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

type tooLargeError struct{ path string }

func (e tooLargeError) Error() string { return e.path + " exceeds the identity size bound" }

func isTooLarge(err error) bool {
	var fe *failure.Error
	return errors.As(err, &fe) && fe.Code == failure.RunnerDurableIdentityTooLarge
}

// readBounded reads a regular file without following a final symlink, up to
// MaxIdentityBytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxIdentityBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxIdentityBytes {
		return nil, failure.Wrap(tooLargeError{path}, codes.FailedPrecondition, failure.RunnerDurableIdentityTooLarge,
			"%s is larger than %d bytes", path, MaxIdentityBytes)
	}
	return b, nil
}

// ensureBase creates the state base (and parents) 0700 when missing and fails
// closed when it is a symlink or not a directory.
func ensureBase(base string) error {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "creating %s: %v", base, err)
	}
	return privateDir(base)
}

// privateDir creates dir 0700 when missing and fails closed when it is a
// symlink or not a directory.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "creating %s: %v", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "inspecting %s: %v", dir, err)
	}
	if !realDir(fi) {
		return failure.New(codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe, "%s is a symlink or not a directory", dir)
	}
	return nil
}

// writeFileAtomic replaces dir/name (0600) atomically without following a
// link at dir or at name: a runner that swapped the control-plane
// directory for a link between the gateway's check and its write makes the
// write fail (SPEC T7).
func writeFileAtomic(dir, name string, data []byte) error {
	err := safefs.WriteFileAt(filepath.Dir(dir), filepath.Base(dir), name, data, 0o600)
	if safefs.IsLink(err) {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe, "%v", err)
	}
	return err
}

func syncDir(dir string) error { return atomicfile.SyncDir(dir) }
