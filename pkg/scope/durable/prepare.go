package durable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/scope"
)

// PriorRun is the database's record of the run a durable identity names. The
// executor supplies it; this package never reads the database.
type PriorRun struct {
	RunID string
	// Status is the stored run status (informational, for messages).
	Status string
	// Terminal is true when the run row is terminal (succeeded, failed,
	// cancelled): no controller can still drive it.
	Terminal bool
	// Scope is the full scope key of the run's persisted execution input;
	// nil when no input was persisted.
	Scope *scope.Key
	// Previous: this is the scope's previous run, the newest terminal run of
	// the same full scope (MarkPrevious).
	Previous bool
	// NeverServed: terminal, and no runner ever served the run: it failed
	// before it attached (e.g. while its gateway was lost, SPEC F7) and ran
	// no turn.
	NeverServed bool
}

// PriorRunLookup returns the record of runID, nil when there is none, or an
// error when the database cannot answer.
type PriorRunLookup func(ctx context.Context, runID string) (*PriorRun, error)

// PriorRunsOf is a lookup over fixed records (tests, or a caller that read
// the candidates already).
func PriorRunsOf(records ...PriorRun) PriorRunLookup {
	m := make(map[string]PriorRun, len(records))
	for _, r := range records {
		m[r.RunID] = r
	}
	return func(_ context.Context, runID string) (*PriorRun, error) {
		if r, ok := m[runID]; ok {
			return &r, nil
		}
		return nil, nil
	}
}

// Verification is the outcome of verifying a prior run's durable ownership.
type Verification string

const (
	// Verified: terminal in the database, same full scope, runner suspended.
	Verified Verification = "verified"
	// PriorActive: the run row is not terminal; a controller may still own it.
	PriorActive Verification = "active"
	// PriorUnavailable: the database could not answer.
	PriorUnavailable Verification = "unavailable"
	// PriorIndeterminate: no such run, or no persisted input.
	PriorIndeterminate Verification = "authority_indeterminate"
	// PriorScopeMismatch: the run's persisted input has another full scope.
	PriorScopeMismatch Verification = "scope_mismatch"
	// PriorTerminalIndeterminate: terminal and same scope, but the runner
	// state does not prove a suspended owner.
	PriorTerminalIndeterminate Verification = "terminal_state_indeterminate"
)

// VerifyPriorRun decides whether the durable identity id, left by another run
// of this session, may be continued by a run of want: its run row must be
// terminal, its persisted input must have the same full scope, and the runner
// state must be suspended.
func VerifyPriorRun(ctx context.Context, lookup PriorRunLookup, want scope.Key, id Identity, runner RunnerLifecycle) (Verification, string) {
	return verifyPriorRun(ctx, lookup, want, id, runner, false)
}

// verifyPriorRun is VerifyPriorRun; crashedIdle says the runner state is
// that of a runner that died idle (CrashedIdle), which counts as a settled
// owner when the run is the scope's previous run (SPEC R8): the database
// proves that run ended, the runner state proves no turn or command was in
// flight, and the identities match — resuming it loses nothing.
func verifyPriorRun(ctx context.Context, lookup PriorRunLookup, want scope.Key, id Identity, runner RunnerLifecycle, crashedIdle bool) (Verification, string) {
	if lookup == nil {
		return PriorIndeterminate, "no prior-run lookup configured"
	}
	rec, err := lookup(ctx, id.RunID)
	if err != nil {
		return PriorUnavailable, fmt.Sprintf("prior run %s could not be read: %v", id.RunID, err)
	}
	if rec == nil || rec.RunID != id.RunID {
		return PriorIndeterminate, fmt.Sprintf("prior run %s is unknown", id.RunID)
	}
	if !rec.Terminal {
		return PriorActive, fmt.Sprintf("prior run %s is still %s", id.RunID, orUnknown(rec.Status))
	}
	if rec.Scope == nil {
		return PriorIndeterminate, fmt.Sprintf("prior run %s has no persisted execution input", id.RunID)
	}
	if rec.Scope.RootName() != want.RootName() {
		return PriorScopeMismatch, fmt.Sprintf("prior run %s belongs to another full session scope", id.RunID)
	}
	if runner == RunnerNotSuspended && crashedIdle && rec.Previous {
		return Verified, ""
	}
	if runner != RunnerSuspended {
		return PriorTerminalIndeterminate, fmt.Sprintf("prior run %s is %s but its runner state is %s", id.RunID, orUnknown(rec.Status), runner)
	}
	return Verified, ""
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Source says where a prepared root's authority comes from.
type Source string

const (
	// SourceFresh: no durable state; the run starts a new runner identity.
	SourceFresh Source = "fresh"
	// SourceExactRun: the root belongs to this very run (a restart).
	SourceExactRun Source = "exact_run"
	// SourcePriorRun: the root belongs to a verified prior run of the same
	// full scope; this run continues its runner and lease.
	SourcePriorRun Source = "verified_prior_run"
)

// Request asks to prepare the scoped root of run RunID in scope Scope.
type Request struct {
	// Base is the state base directory (holds the scoped roots).
	Base  string
	Scope scope.Key
	RunID string
	// PriorRuns verifies another run's identity found on disk.
	PriorRuns PriorRunLookup
	// Now stamps quarantine names; time.Now when nil.
	Now func() time.Time
}

// Prepared is a root this run may use.
type Prepared struct {
	// Root is <base>/<scope root name>; it may not exist yet (fresh).
	Root   string
	Source Source
	// Binding is the durable identity found on disk (exact run or verified
	// prior run); nil when fresh. A continuation keeps its runner instance
	// id and environment lease id under its own run id.
	Binding *Identity
	// Runner is the runner state found (absent for a fresh root).
	Runner RunnerLifecycle
	// MigratedFrom is the legacy root renamed into Root, if any.
	MigratedFrom string
}

// Metadata keys on failures.
const (
	// MetaQuarantined is the path a root was quarantined to.
	MetaQuarantined = "quarantined"
	// MetaRoot is the root the failure is about.
	MetaRoot = "root"
)

// Prepare resolves which durable root run RunID may use, before any backend
// is constructed:
//
//   - An existing scoped root must be a real directory (a symlink is
//     runner_state_directory_unsafe, never followed, moved or deleted). Its
//     control-plane identity must be this session's; it is resumed for the
//     exact run (unless the runner state is indeterminate) or for a verified
//     prior run. A prior run still running (or an unavailable database) fails
//     with runner_state_identity_mismatch and leaves the root untouched; a
//     runner that crashed idle (CrashedIdle) counts as settled for the
//     scope's previous run (SPEC R8); any
//     other unproven ownership quarantines the root (.identity_mismatch. for
//     another session or scope, .identity_indeterminate. otherwise) and fails.
//     An entirely empty root holds no authority and counts as fresh; so
//     does a root whose first Bind was cut short (firstBindCut).
//   - Otherwise the legacy roots (company/session, then session only) are
//     renamed atomically into the scoped root when their identity is the exact
//     run or a verified prior run. A legacy root whose identity is missing or
//     of another run/session fails closed and stays in place; a legacy root of
//     a terminal same-scope prior run whose runner is not suspended is
//     quarantined.
//   - Otherwise the root is fresh.
func Prepare(ctx context.Context, req Request) (*Prepared, error) {
	if req.Base == "" || req.RunID == "" || req.Scope.NormalizedSessionID == "" {
		return nil, failure.New(codes.InvalidArgument, failure.RunnerStateIdentityMismatch, "state base, run id and session are required")
	}
	if req.Now == nil {
		req.Now = time.Now
	}
	base := filepath.Clean(req.Base)
	root := filepath.Join(base, req.Scope.RootName())
	fi, err := os.Lstat(root)
	switch {
	case err == nil:
		return prepareScoped(ctx, req, base, root, fi)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "inspecting %s: %v", root, err)
	}
	for _, name := range req.Scope.LegacyRootNames() {
		legacy := filepath.Join(base, name)
		if legacy == root {
			continue
		}
		lfi, err := os.Lstat(legacy)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "inspecting %s: %v", legacy, err)
		}
		return migrateLegacy(ctx, req, base, legacy, lfi, root)
	}
	return &Prepared{Root: root, Source: SourceFresh, Runner: RunnerAbsent}, nil
}

func mismatch(root, format string, args ...any) *failure.Error {
	e := failure.New(codes.FailedPrecondition, failure.RunnerStateIdentityMismatch, format, args...)
	e.Metadata = map[string]string{MetaRoot: root}
	return e
}

func unsafeRoot(root string) *failure.Error {
	e := failure.New(codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe,
		"durable state root %s is a symlink or not a directory; it is left untouched", root)
	e.Metadata = map[string]string{MetaRoot: root}
	return e
}

// quarantineAndFail moves root aside and returns the mismatch error naming
// where it went (or the quarantine's own failure).
func quarantineAndFail(req Request, base, root string, reason QuarantineReason, why string) error {
	dest, err := Quarantine(base, root, reason, req.Now())
	if err != nil {
		return err
	}
	e := mismatch(root, "%s; the durable state was quarantined to %s and nothing was started", why, dest)
	e.Metadata[MetaQuarantined] = dest
	return e
}

func prepareScoped(ctx context.Context, req Request, base, root string, fi fs.FileInfo) (*Prepared, error) {
	if !realDir(fi) {
		return nil, unsafeRoot(root)
	}
	if empty, err := dirEmpty(root); err != nil {
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "reading %s: %v", root, err)
	} else if empty {
		return &Prepared{Root: root, Source: SourceFresh, Runner: RunnerAbsent}, nil
	}
	if cut, err := firstBindCut(root); err != nil {
		return nil, err
	} else if cut {
		return &Prepared{Root: root, Source: SourceFresh, Runner: RunnerAbsent}, nil
	}
	cp, err := readControlPlane(root)
	if err != nil {
		return nil, err
	}
	if cp.id == nil {
		return nil, quarantineAndFail(req, base, root, IdentityIndeterminate, cp.reason)
	}
	id := *cp.id
	if id.NormalizedSessionID != req.Scope.NormalizedSessionID {
		return nil, quarantineAndFail(req, base, root, IdentityMismatch,
			fmt.Sprintf("durable identity belongs to session %q, not %q", id.NormalizedSessionID, req.Scope.NormalizedSessionID))
	}
	if !id.Complete() {
		return nil, quarantineAndFail(req, base, root, IdentityIndeterminate, "durable identity is incomplete")
	}
	runner, why, err := ReadRunnerLifecycle(root, id)
	if err != nil {
		return nil, err
	}
	if runner == RunnerSuspended || runner == RunnerNotSuspended {
		// The runner of this identity may have journaled a later run's
		// run.attach (a warm run on a live runner, bound.go).
		id = boundIdentity(root, id, cp.attachSeq)
	}
	if id.RunID == req.RunID {
		if runner == RunnerIndeterminate {
			return nil, quarantineAndFail(req, base, root, IdentityIndeterminate, why)
		}
		return &Prepared{Root: root, Source: SourceExactRun, Binding: &id, Runner: runner}, nil
	}
	v, why := verifyPriorRun(ctx, req.PriorRuns, req.Scope, id, runner, runner == RunnerNotSuspended && CrashedIdle(root, id.RunID))
	switch v {
	case Verified:
		return &Prepared{Root: root, Source: SourcePriorRun, Binding: &id, Runner: runner}, nil
	case PriorActive:
		return nil, mismatch(root, "%s; its durable state is left untouched", why)
	case PriorUnavailable:
		e := mismatch(root, "%s; its durable state is left untouched", why)
		e.GRPC = codes.Unavailable
		return nil, e
	case PriorScopeMismatch:
		return nil, quarantineAndFail(req, base, root, IdentityMismatch, why)
	default:
		return nil, quarantineAndFail(req, base, root, IdentityIndeterminate, why)
	}
}

// firstBindCut reports whether root holds nothing but what a first Bind cut
// short left (the gateway died while it prepared the control plane aside,
// before renaming it into place): temporary control-plane directories and
// nothing else. Such a root never bound a run and no runner ever wrote to
// it, so it holds no authority: the leftovers are removed and the root
// counts as fresh. Anything else is read as usual (a control-plane
// directory without its document stays indeterminate).
func firstBindCut(root string) (bool, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return false, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "reading %s: %v", root, err)
	}
	for _, e := range entries {
		if e.Type() != fs.ModeDir || !strings.HasPrefix(e.Name(), bindTempPrefix) {
			return false, nil
		}
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return false, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "removing %s: %v", e.Name(), err)
		}
	}
	return len(entries) > 0, nil
}

func migrateLegacy(ctx context.Context, req Request, base, legacy string, fi fs.FileInfo, root string) (*Prepared, error) {
	if !realDir(fi) {
		return nil, unsafeRoot(legacy)
	}
	cp, err := readControlPlane(legacy)
	if err != nil {
		return nil, err
	}
	if cp.id == nil {
		return nil, mismatch(legacy, "legacy durable state has no provable identity (%s); it may belong to another scope and is left in place", cp.reason)
	}
	id := *cp.id
	if id.NormalizedSessionID != req.Scope.NormalizedSessionID || !id.Complete() {
		return nil, mismatch(legacy, "legacy durable state belongs to another session identity; it is left in place")
	}
	runner, why, err := ReadRunnerLifecycle(legacy, id)
	if err != nil {
		return nil, err
	}
	src := SourceExactRun
	if id.RunID == req.RunID {
		if runner == RunnerIndeterminate {
			return nil, quarantineAndFail(req, base, legacy, IdentityIndeterminate, why)
		}
	} else {
		v, why := VerifyPriorRun(ctx, req.PriorRuns, req.Scope, id, runner)
		switch v {
		case Verified:
			src = SourcePriorRun
		case PriorTerminalIndeterminate:
			return nil, quarantineAndFail(req, base, legacy, IdentityIndeterminate, why)
		case PriorUnavailable:
			e := mismatch(legacy, "%s; the legacy durable state is left in place", why)
			e.GRPC = codes.Unavailable
			return nil, e
		default:
			return nil, mismatch(legacy, "legacy durable state is owned by run %s (%s); it is left in place", id.RunID, why)
		}
	}
	if err := os.Rename(legacy, root); err != nil {
		// Lost a race: accept only the same authority in the scoped root.
		if fi, lerr := os.Lstat(root); lerr == nil && realDir(fi) {
			if cp2, _ := readControlPlane(root); cp2.id != nil && *cp2.id == id {
				if r2, _, _ := ReadRunnerLifecycle(root, id); r2 != RunnerIndeterminate && (src == SourceExactRun || r2 == RunnerSuspended) {
					return &Prepared{Root: root, Source: src, Binding: &id, Runner: r2}, nil
				}
			}
			return nil, mismatch(root, "the scoped root appeared with another authority while migrating %s", legacy)
		}
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "migrating %s to %s: %v", legacy, root, err)
	}
	if err := syncDir(base); err != nil {
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "syncing %s: %v", base, err)
	}
	return &Prepared{Root: root, Source: src, Binding: &id, Runner: runner, MigratedFrom: legacy}, nil
}

// QuarantineReason names why a root was quarantined.
type QuarantineReason string

const (
	IdentityIndeterminate QuarantineReason = "identity_indeterminate"
	IdentityMismatch      QuarantineReason = "identity_mismatch"
)

// CodexHomeDir is the provider home inside a scope root.
const CodexHomeDir = "codex-home"

// LaunchOnlyCodexHomeEntries are the entries of a provider home that belong
// to a launch, not to the session: scratch space, credentials and the
// launch configuration. They never travel in a backup and are removed before
// a root is quarantined.
var LaunchOnlyCodexHomeEntries = []string{"tmp", ".tmp", "auth.json", "config.toml"}

// ProviderTemplateDir is where, in a scope root, the gateway puts a pinned
// provider's company home template for runnerd (launch-only: never backed
// up, removed before a root is quarantined).
const ProviderTemplateDir = "provider-template"

// scrubLaunchOnly removes the launch-only entries of root's provider home
// and its provider template directory (a symlinked entry is removed
// itself, never its target; a provider home that is not a real directory
// is left alone).
func scrubLaunchOnly(root string) error {
	if err := os.RemoveAll(filepath.Join(root, ProviderTemplateDir)); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "removing %s from %s: %v", ProviderTemplateDir, root, err)
	}
	home := filepath.Join(root, CodexHomeDir)
	if fi, err := os.Lstat(home); err != nil || !realDir(fi) {
		return nil
	}
	for _, e := range LaunchOnlyCodexHomeEntries {
		if err := os.RemoveAll(filepath.Join(home, e)); err != nil {
			return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "removing %s from %s: %v", e, home, err)
		}
	}
	return nil
}

// Quarantine renames root (a real directory directly under base, named like
// a root) to <base>/quarantine/<name>.<reason>.<unix ms>.<pid>.<random> and
// returns the new path, after removing the launch-only entries of its
// provider home (credentials do not linger in quarantine). Anything else — a
// symlink, a path outside base, a symlinked quarantine directory — is
// runner_state_directory_unsafe and is left untouched.
func Quarantine(base, root string, reason QuarantineReason, now time.Time) (string, error) {
	base = filepath.Clean(base)
	name := filepath.Base(root)
	if filepath.Dir(filepath.Clean(root)) != base || !scope.IsRootName(name) {
		return "", unsafeRoot(root)
	}
	if fi, err := os.Lstat(root); err != nil || !realDir(fi) {
		return "", unsafeRoot(root)
	}
	if err := scrubLaunchOnly(root); err != nil {
		return "", err
	}
	qdir := filepath.Join(base, QuarantineDir)
	if err := privateDir(qdir); err != nil {
		return "", err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	dest := filepath.Join(qdir, fmt.Sprintf("%s.%s.%d.%d.%s", name, reason, now.UnixMilli(), os.Getpid(), hex.EncodeToString(rnd[:])))
	if err := os.Rename(root, dest); err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "quarantining %s: %v", root, err)
	}
	if err := syncDir(qdir); err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "syncing %s: %v", qdir, err)
	}
	if err := syncDir(base); err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "syncing %s: %v", base, err)
	}
	return dest, nil
}

// OpenCodeHomeDir is the OpenCode server's home inside a scope root.
const OpenCodeHomeDir = "opencode"

// ACPXHomeDir is the ACPX agents' directory in a scope root: the ACP
// driver's state and the agent's homes (SPEC B2, R11).
const ACPXHomeDir = "acpx"

// ACPXCredentialNames never travel from any depth of acpx/: codex's
// auth.json and launch config.toml (acpx/codex-home, copied from the
// profile's home template at launch) and Claude Code's .credentials.json.
var ACPXCredentialNames = []string{"auth.json", "config.toml", ".credentials.json"}

// LaunchOnlyOpenCodeEntries are the entries of the OpenCode home that
// belong to a launch (the operator's config with its provider keys, the
// seeded config directory, cache, the live server's password, tether's
// rewritten config, the server log); they never travel in a backup.
var LaunchOnlyOpenCodeEntries = []string{"config", "cache", "server.json", "tether.json", "serve.log"}
