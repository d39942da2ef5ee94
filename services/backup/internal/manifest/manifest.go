package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

// ManifestSchema names the manifest layout.
const ManifestSchema = "tether.harness-backup.v1"

// RunnerContractVersion is the runner binary contract the manifest's layout
// belongs to (see SPEC G2).
const RunnerContractVersion = 2

// MaxManifestBytes bounds a manifest's JSON.
const MaxManifestBytes = 64 << 10

// TimeLayout renders completedAt (UTC, milliseconds).
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Workspace is the workspace identity of an execution.
type Workspace struct {
	Cwd        string `json:"cwd"`
	RepoURL    string `json:"repoUrl"`
	RepoRef    string `json:"repoRef"`
	BranchName string `json:"branchName"`
}

// Execution is what a backup belongs to and who asks for it.
type Execution struct {
	CompanyID string
	AgentID   string
	IssueID   string
	// RunID and ExecutionWorkspaceID identify the asking run; they are not
	// part of the backup's identity (a continuation run verifies it).
	RunID                string
	ExecutionWorkspaceID string
	NormalizedSessionID  string
	DriverKind           string
	Workspace            Workspace
	// Provider is the whole provider object (kind, agent, model, ...).
	Provider map[string]any
	// InteractionResponses are the ids of the governed interaction responses
	// this execution carries (see TransitionAllowed).
	InteractionResponses []string
}

// ProviderKind is Provider["kind"].
func (e Execution) ProviderKind() string {
	k, _ := e.Provider["kind"].(string)
	return k
}

// Identity is the part of an execution a backup is bound to; its canonical
// hash is the environment fingerprint.
type Identity struct {
	CompanyID           string         `json:"companyId"`
	AgentID             string         `json:"agentId"`
	IssueID             string         `json:"issueId"`
	NormalizedSessionID string         `json:"normalizedSessionId"`
	Workspace           Workspace      `json:"workspace"`
	Provider            map[string]any `json:"provider"`
	DriverKind          string         `json:"driverKind"`
}

// Identity returns the execution's backup identity.
func (e Execution) Identity() Identity {
	p := e.Provider
	if p == nil {
		p = map[string]any{}
	}
	return Identity{
		CompanyID: e.CompanyID, AgentID: e.AgentID, IssueID: e.IssueID,
		NormalizedSessionID: e.NormalizedSessionID, Workspace: e.Workspace, Provider: p, DriverKind: e.DriverKind,
	}
}

// Fingerprint is the environment fingerprint: "sha256:" + hex of the
// identity's canonical JSON.
func (id Identity) Fingerprint() (string, error) { return digest.CanonicalHash(id) }

// SessionIdentity names the provider-side session a backup holds.
type SessionIdentity struct {
	ProviderSessionID        string         `json:"providerSessionId"`
	ProviderBackendSessionID string         `json:"providerBackendSessionId"`
	ProviderSessionIdentity  map[string]any `json:"providerSessionIdentity"`
}

// Present reports whether any of the three fields is set.
func (s SessionIdentity) Present() bool {
	return s.ProviderSessionID != "" || s.ProviderBackendSessionID != "" || s.ProviderSessionIdentity != nil
}

// DirectoryDigest is one directory of a manifest.
type DirectoryDigest struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
}

// ArchiveInfo describes the stored archive of a checkpoint.
type ArchiveInfo struct {
	SHA256        string `json:"sha256"`
	Bytes         int64  `json:"bytes"`
	ExpandedBytes int64  `json:"expandedBytes"`
	Entries       int    `json:"entries"`
}

// Manifest records a harness backup. Its digest (Digest) is the canonical
// JSON hash of the whole manifest.
type Manifest struct {
	Schema                  string            `json:"schema"`
	CheckpointID            string            `json:"checkpointId,omitempty"`
	SessionScope            string            `json:"sessionScope,omitempty"`
	NormalizedSessionID     string            `json:"normalizedSessionId"`
	RunnerInstanceID        string            `json:"runnerInstanceId"`
	ProviderKind            string            `json:"providerKind"`
	DriverKind              string            `json:"driverKind"`
	ProviderSessionIdentity SessionIdentity   `json:"providerSessionIdentity"`
	SourceLeaseID           string            `json:"sourceProviderLeaseId"`
	Identity                Identity          `json:"identity"`
	EnvironmentFingerprint  string            `json:"environmentFingerprint"`
	RunnerContractVersion   int               `json:"runnerContractVersion"`
	Directories             []DirectoryDigest `json:"directories"`
	Archive                 *ArchiveInfo      `json:"archive,omitempty"`
	CompletedAt             string            `json:"completedAt"`
}

// Digest returns "sha256:" + hex of the manifest's canonical JSON.
func (m *Manifest) Digest() (string, error) { return digest.CanonicalHash(m) }

// CanonicalJSON returns the manifest's canonical JSON (what Digest hashes).
func (m *Manifest) CanonicalJSON() ([]byte, error) { return digest.Canonical(m) }

// Directory returns the named directory's record.
func (m *Manifest) Directory(name string) (DirectoryDigest, bool) {
	for _, d := range m.Directories {
		if d.Name == name {
			return d, true
		}
	}
	return DirectoryDigest{}, false
}

// TotalBytes sums the directories' bytes.
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, d := range m.Directories {
		n += d.Bytes
	}
	return n
}

// BuildInput is what a manifest is built from.
type BuildInput struct {
	Execution               Execution
	RunnerInstanceID        string
	ProviderSessionIdentity SessionIdentity
	SourceLeaseID           string
	SessionScope            string
	CheckpointID            string
	Archive                 *ArchiveInfo
	// CompletedAt defaults to now.
	CompletedAt time.Time
}

// DigestFunc returns the backup tree digest of a profile directory; an
// error wrapping fs.ErrNotExist means the directory is missing.
type DigestFunc func(name string) (digest.Result, error)

func mismatch(format string, args ...any) error {
	return failure.New(codes.FailedPrecondition, failure.RunnerHarnessStateMismatch, format, args...)
}

// Build builds the manifest of a backup whose directories digest yields. It
// fails with failure.RunnerHarnessStateMismatch when the provider session identity is
// missing (all three fields empty) or a profile directory is missing;
// directories are listed in profile order.
func Build(in BuildInput, digests DigestFunc) (*Manifest, error) {
	prof, err := ResolveProfile(in.Execution.ProviderKind())
	if err != nil {
		return nil, err
	}
	if in.Execution.DriverKind != "" && in.Execution.DriverKind != prof.DriverKind {
		return nil, mismatch("driver kind %q does not drive provider %q", in.Execution.DriverKind, prof.ProviderKind)
	}
	if !in.ProviderSessionIdentity.Present() {
		return nil, mismatch("the backup has no provider session identity")
	}
	if in.RunnerInstanceID == "" {
		return nil, mismatch("the backup has no runner instance id")
	}
	id := in.Execution.Identity()
	id.DriverKind = prof.DriverKind
	fp, err := id.Fingerprint()
	if err != nil {
		return nil, failure.Wrap(err, codes.InvalidArgument, failure.RunnerHarnessStateMismatch, "execution identity: %v", err)
	}
	at := in.CompletedAt
	if at.IsZero() {
		at = time.Now()
	}
	m := &Manifest{
		Schema: ManifestSchema, CheckpointID: in.CheckpointID, SessionScope: in.SessionScope,
		NormalizedSessionID: in.Execution.NormalizedSessionID, RunnerInstanceID: in.RunnerInstanceID,
		ProviderKind: prof.ProviderKind, DriverKind: prof.DriverKind,
		ProviderSessionIdentity: in.ProviderSessionIdentity, SourceLeaseID: in.SourceLeaseID,
		Identity: id, EnvironmentFingerprint: fp, RunnerContractVersion: RunnerContractVersion,
		Archive: in.Archive, CompletedAt: at.UTC().Format(TimeLayout),
	}
	for _, d := range prof.Directories {
		r, err := digests(d.Name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, mismatch("backup directory %s is missing", d.Name)
			}
			return nil, err
		}
		m.Directories = append(m.Directories, DirectoryDigest{Name: d.Name, SHA256: r.Digest, Bytes: r.Bytes})
	}
	return m, nil
}

// BuildFromRoot builds the manifest of the backup directories below root
// (root/<name> for each profile directory).
func BuildFromRoot(root string, in BuildInput) (*Manifest, error) {
	return Build(in, RootDigests(root))
}

// RootDigests digests root/<name> with digest.BackupTree.
func RootDigests(root string) DigestFunc {
	return func(name string) (digest.Result, error) { return digest.BackupTree(filepath.Join(root, name)) }
}

var dirNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// ParseManifest parses a manifest strictly: at most MaxManifestBytes, one
// JSON object without repeated or unknown keys, this schema and contract
// version, 1..4 directories with unique known names and well-formed digests,
// a parseable completion time. Anything else is failure.RunnerHarnessBackupManifestInvalid.
func ParseManifest(data []byte) (*Manifest, error) {
	bad := func(format string, args ...any) error {
		return failure.New(codes.InvalidArgument, failure.RunnerHarnessBackupManifestInvalid, format, args...)
	}
	if len(data) > MaxManifestBytes {
		return nil, bad("manifest is larger than %d bytes", MaxManifestBytes)
	}
	if _, err := digest.ParseJSON(data); err != nil {
		return nil, bad("manifest is not valid JSON: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, bad("manifest does not parse: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("trailing data after the manifest")
	}
	switch {
	case m.Schema != ManifestSchema:
		return nil, bad("unknown manifest schema %q", m.Schema)
	case m.RunnerContractVersion != RunnerContractVersion:
		return nil, bad("runner contract version %d, want %d", m.RunnerContractVersion, RunnerContractVersion)
	case len(m.Directories) < 1 || len(m.Directories) > len(AllDirectories):
		return nil, bad("manifest lists %d directories", len(m.Directories))
	case !digest.Valid(m.EnvironmentFingerprint):
		return nil, bad("malformed environment fingerprint")
	}
	if _, err := time.Parse(time.RFC3339Nano, m.CompletedAt); err != nil {
		return nil, bad("malformed completedAt %q", m.CompletedAt)
	}
	seen := map[string]bool{}
	for _, d := range m.Directories {
		if !dirNameRE.MatchString(d.Name) || !slices.Contains(AllDirectories, d.Name) || seen[d.Name] {
			return nil, bad("bad or repeated directory name %q", d.Name)
		}
		seen[d.Name] = true
		if !digest.Valid(d.SHA256) || d.Bytes < 0 {
			return nil, bad("malformed digest of directory %s", d.Name)
		}
	}
	if fp, err := m.Identity.Fingerprint(); err != nil || fp != m.EnvironmentFingerprint {
		return nil, bad("environment fingerprint does not match the identity")
	}
	if _, err := m.Digest(); err != nil {
		return nil, bad("manifest has no canonical form: %v", err)
	}
	if m.Archive != nil && (!digest.Valid(m.Archive.SHA256) || m.Archive.Bytes < 0 || m.Archive.Entries < 0 || m.Archive.ExpandedBytes < 0) {
		return nil, bad("malformed archive record")
	}
	return &m, nil
}

// Expectation is what a backup must belong to.
type Expectation struct {
	Execution        Execution
	RunnerInstanceID string
}

// MatchesIdentity reports whether the manifest belongs to the expected
// execution: same schema, normalized session, runner instance, provider and
// driver kind, environment fingerprint (so run and execution-workspace ids
// may differ: a continuation run matches), contract version, a provider
// session identity, and exactly the profile's directory names.
func (m *Manifest) MatchesIdentity(exp Expectation) bool {
	prof, err := ResolveProfile(exp.Execution.ProviderKind())
	if err != nil {
		return false
	}
	id := exp.Execution.Identity()
	id.DriverKind = prof.DriverKind
	fp, err := id.Fingerprint()
	if err != nil {
		return false
	}
	names := make([]string, len(m.Directories))
	for i, d := range m.Directories {
		names[i] = d.Name
	}
	return m.Schema == ManifestSchema &&
		m.NormalizedSessionID == exp.Execution.NormalizedSessionID &&
		m.RunnerInstanceID == exp.RunnerInstanceID &&
		m.ProviderKind == prof.ProviderKind &&
		m.DriverKind == prof.DriverKind &&
		(exp.Execution.DriverKind == "" || exp.Execution.DriverKind == prof.DriverKind) &&
		m.EnvironmentFingerprint == fp &&
		m.RunnerContractVersion == RunnerContractVersion &&
		m.ProviderSessionIdentity.Present() &&
		prof.SameNames(names)
}

// DirectoriesMatch reports whether every directory of the manifest has
// exactly its recorded digest and size now. An error from digests (a
// missing directory, a symlink, ...) is a mismatch.
func (m *Manifest) DirectoriesMatch(digests DigestFunc) bool {
	for _, d := range m.Directories {
		r, err := digests(d.Name)
		if err != nil || r.Digest != d.SHA256 || r.Bytes != d.Bytes {
			return false
		}
	}
	return len(m.Directories) > 0
}

// Verified is an accepted backup.
type Verified struct {
	Root     string
	Manifest *Manifest
	Bytes    int64
}

// Candidates are the backup roots below a session root, newest first.
var Candidates = []string{filepath.Join("failover-backups", "current"), filepath.Join("failover-backups", "previous")}

// VerifyRoot looks for a backup of the expected execution below sessionRoot
// (failover-backups/current, then previous: manifest.json plus one
// directory per profile entry) and returns the first one whose manifest
// parses, matches the identity and whose every directory digest and size
// matches. It returns nil — not an error — when there is none: any changed
// byte makes a backup unacceptable.
func VerifyRoot(sessionRoot string, exp Expectation) *Verified {
	for _, c := range Candidates {
		root := filepath.Join(sessionRoot, c)
		m, err := ReadManifestFile(filepath.Join(root, "manifest.json"))
		if err != nil || !m.MatchesIdentity(exp) || !m.DirectoriesMatch(RootDigests(root)) {
			continue
		}
		return &Verified{Root: root, Manifest: m, Bytes: m.TotalBytes()}
	}
	return nil
}

// ReadManifestFile reads and parses a manifest file (a regular file, not a
// symlink, at most MaxManifestBytes).
func ReadManifestFile(path string) (*Manifest, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > MaxManifestBytes {
		return nil, fmt.Errorf("%s is not a regular manifest file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseManifest(data)
}

// WriteManifestFile writes m as JSON to path (0600, via a temporary file
// and rename).
func WriteManifestFile(path string, m *Manifest) error {
	data, err := m.CanonicalJSON()
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
