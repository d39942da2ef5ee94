// Package scope derives a session's scope key: the digest that names a
// runner's durable state root and the warm-session registry entry. Two runs
// share a scope only when company, agent, workspace identity, provider (driver
// kind and pinned identity) and normalized session id all match; run and issue
// ids are never part of it (SPEC E10, E13; DESIGN §5).
//
// The package also names the legacy root layouts that are migrated into the
// full scope (sha256 of the session id alone, sha256 of the JSON array
// [company, session]) and computes the warm configuration digest: the pinned
// configuration whose change closes an idle warm session.
package scope

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/prp"
)

// Schema versions the key's layout.
const Schema = "tether.session-scope.v2"

// ConfigSchema versions the warm configuration digest's layout.
const ConfigSchema = "tether.session-config.v1"

// DefaultIdleTimeout is a warm session's idle timeout when none is given.
const DefaultIdleTimeout = 10 * time.Minute

// Workspace kinds.
const (
	// WorkspaceManaged: the run works in a managed execution workspace; its
	// id is the identity.
	WorkspaceManaged = "managed"
	// WorkspaceTransient: a projectless run (no execution workspace, or the
	// run-id placeholder); the working directory and repository are the
	// identity.
	WorkspaceTransient = "transient"
)

// Lifecycle modes as they appear in Params and the config digest.
const (
	LifecyclePerTurn = "per_turn"
	LifecycleWarm    = "warm"
)

// Key is the canonical scope of a session. Its digest is computed over the
// canonical JSON (keys sorted, no whitespace) of this structure.
type Key struct {
	Schema              string    `json:"schema"`
	CompanyID           string    `json:"companyId"`
	AgentID             string    `json:"agentId"`
	Workspace           Workspace `json:"workspace"`
	Provider            Provider  `json:"provider"`
	NormalizedSessionID string    `json:"normalizedSessionId"`
}

// Workspace is the workspace identity of a scope.
type Workspace struct {
	Kind                 string `json:"kind"`
	ExecutionWorkspaceID string `json:"executionWorkspaceId,omitempty"`
	Cwd                  string `json:"cwd,omitempty"`
	RepoURL              string `json:"repoUrl,omitempty"`
	Ref                  string `json:"ref,omitempty"`
	Branch               string `json:"branch,omitempty"`
}

// Provider is the provider part of the scope: the driver kind and the pinned
// provider identity.
type Provider struct {
	DriverKind string           `json:"driverKind"`
	Identity   ProviderIdentity `json:"identity"`
}

// ProviderIdentity pins the provider profile. Model, approval policy and
// permission mode are deliberately not part of it: changing them rotates the
// warm session through the config digest (E10) instead of opening a new
// durable root.
type ProviderIdentity struct {
	Kind string `json:"kind"`
	// Agent is the ACPX agent (claude | codex); empty for other kinds.
	Agent string `json:"agent,omitempty"`
	// Profile is the pinned provider profile (e.g. the ACPX agent profile
	// version or digest); empty when the provider has none.
	Profile string `json:"profile,omitempty"`
}

// ProviderConfig is the whole provider configuration of a run.
type ProviderConfig struct {
	Kind           string `json:"kind"`
	Model          string `json:"model,omitempty"`
	ApprovalPolicy string `json:"approvalPolicy,omitempty"`
	Sandbox        string `json:"sandbox,omitempty"`
	PermissionMode string `json:"permissionMode,omitempty"`
	Agent          string `json:"agent,omitempty"`
	Profile        string `json:"profile,omitempty"`
}

// Lifecycle is a session's lifecycle policy.
type Lifecycle struct {
	Mode        string        `json:"mode"`
	IdleTimeout time.Duration `json:"-"`
}

// EffectiveIdleTimeout is IdleTimeout, or DefaultIdleTimeout when unset.
func (l Lifecycle) EffectiveIdleTimeout() time.Duration {
	if l.IdleTimeout > 0 {
		return l.IdleTimeout
	}
	return DefaultIdleTimeout
}

// Warm reports whether the lifecycle keeps the provider session between runs.
func (l Lifecycle) Warm() bool { return l.Mode == LifecycleWarm }

// Params is everything the scope key and the warm config digest are derived
// from. ParamsOf fills it from an execution input; callers may set fields the
// wire input does not carry (Provider.Profile, ExecutionMode).
type Params struct {
	RunID                string
	CompanyID            string
	AgentID              string
	IssueID              string
	ExecutionWorkspaceID string
	Cwd                  string
	RepoURL              string
	Ref                  string
	Branch               string
	NormalizedSessionID  string
	DriverKind           string
	Provider             ProviderConfig
	Lifecycle            Lifecycle
	// ExecutionMode defaults to "default".
	ExecutionMode        string
	RuntimeContextDigest string
}

// ParamsOf reads the parameters of run runID's execution input. runID may be
// empty when it is unknown (then only an empty execution workspace id marks a
// projectless run).
func ParamsOf(runID string, in *prpv1.ExecutionInput) Params {
	p := Params{
		RunID:                runID,
		CompanyID:            in.GetBinding().GetCompanyId(),
		AgentID:              in.GetBinding().GetAgentId(),
		IssueID:              in.GetBinding().GetIssueId(),
		ExecutionWorkspaceID: in.GetBinding().GetExecutionWorkspaceId(),
		Cwd:                  in.GetWorkspace().GetCwd(),
		RepoURL:              in.GetWorkspace().GetRepoUrl(),
		Ref:                  in.GetWorkspace().GetRef(),
		Branch:               in.GetWorkspace().GetBranch(),
		NormalizedSessionID:  in.GetSession().GetNormalizedSessionId(),
		DriverKind:           in.GetSession().GetDriverKind(),
		Provider: ProviderConfig{
			Kind:           in.GetProvider().GetKind(),
			Model:          in.GetProvider().GetModel(),
			ApprovalPolicy: in.GetProvider().GetApprovalPolicy(),
			Sandbox:        in.GetProvider().GetSandbox(),
			PermissionMode: in.GetProvider().GetPermissionMode(),
			Agent:          in.GetProvider().GetAgent(),
		},
		RuntimeContextDigest: in.GetRuntimeContextDigest(),
	}
	switch in.GetSession().GetLifecycle().GetMode() {
	case prpv1.LifecycleMode_LIFECYCLE_MODE_WARM:
		p.Lifecycle.Mode = LifecycleWarm
	case prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN:
		p.Lifecycle.Mode = LifecyclePerTurn
	}
	if d := in.GetSession().GetLifecycle().GetIdleTimeout(); d != nil {
		p.Lifecycle.IdleTimeout = d.AsDuration()
	}
	return p
}

// DefaultDriverKind is the driver of a provider kind when the input names
// none.
func DefaultDriverKind(providerKind string) string {
	switch providerKind {
	case provenv.KindCodex:
		return provenv.DriverCodexAppServer
	case provenv.KindOpenCode:
		return provenv.DriverOpenCodeServer
	case provenv.KindACPX:
		return provenv.DriverACPXRuntime
	}
	return providerKind
}

// SessionID is the normalized session id, or "session-<run id>" when the run
// names none.
func (p Params) SessionID() string {
	if p.NormalizedSessionID == "" && p.RunID != "" {
		return "session-" + p.RunID
	}
	return p.NormalizedSessionID
}

// Projectless reports whether the run has no managed execution workspace:
// none is given, or it is the run-id placeholder.
func (p Params) Projectless() bool {
	return p.ExecutionWorkspaceID == "" || p.ExecutionWorkspaceID == p.RunID
}

// WorkspaceIdentity is the scope's workspace identity.
func (p Params) WorkspaceIdentity() Workspace {
	if p.Projectless() {
		return Workspace{Kind: WorkspaceTransient, Cwd: p.Cwd, RepoURL: p.RepoURL, Ref: p.Ref, Branch: p.Branch}
	}
	return Workspace{Kind: WorkspaceManaged, ExecutionWorkspaceID: p.ExecutionWorkspaceID}
}

func (p Params) driverKind() string {
	if p.DriverKind != "" {
		return p.DriverKind
	}
	return DefaultDriverKind(p.Provider.Kind)
}

// Key returns the full scope key.
func (p Params) Key() Key {
	id := ProviderIdentity{Kind: p.Provider.Kind, Profile: p.Provider.Profile}
	if p.Provider.Kind == "acpx" {
		id.Agent = p.Provider.Agent
	}
	return Key{
		Schema:              Schema,
		CompanyID:           p.CompanyID,
		AgentID:             p.AgentID,
		Workspace:           p.WorkspaceIdentity(),
		Provider:            Provider{DriverKind: p.driverKind(), Identity: id},
		NormalizedSessionID: p.SessionID(),
	}
}

// ConfigDigest is the warm configuration digest, "sha256:<hex>" of the
// canonical JSON of {company, session, workspace identity, whole provider
// config (model, approval policy, sandbox, permission mode, agent, profile),
// driver kind, lifecycle, execution mode, runtime context digest}. Run and
// issue ids are not part of it.
func (p Params) ConfigDigest() string {
	mode := p.ExecutionMode
	if mode == "" {
		mode = "default"
	}
	var rc any
	if p.RuntimeContextDigest != "" {
		rc = p.RuntimeContextDigest
	}
	var idle any
	if p.Lifecycle.IdleTimeout > 0 {
		idle = p.Lifecycle.IdleTimeout.Milliseconds()
	}
	doc := map[string]any{
		"schema":               ConfigSchema,
		"companyId":            p.CompanyID,
		"normalizedSessionId":  p.SessionID(),
		"workspace":            p.WorkspaceIdentity(),
		"provider":             p.Provider,
		"driverKind":           p.driverKind(),
		"lifecycle":            map[string]any{"mode": p.Lifecycle.Mode, "idleTimeoutMs": idle},
		"executionMode":        mode,
		"runtimeContextDigest": rc,
	}
	return "sha256:" + hexSHA256(canonical(doc))
}

// FromInput builds the key of an execution input whose run id is unknown. A
// run without an execution workspace id is scoped to its working directory
// and repository (transient workspace).
func FromInput(in *prpv1.ExecutionInput) Key { return ParamsOf("", in).Key() }

// FromRun builds the key of run runID's input; an execution workspace id equal
// to the run id is the projectless placeholder and yields a transient
// workspace, so projectless continuations share their scope.
func FromRun(runID string, in *prpv1.ExecutionInput) Key { return ParamsOf(runID, in).Key() }

// Canonical is the key's canonical JSON (keys sorted, no whitespace, no HTML
// escaping).
func (k Key) Canonical() []byte { return canonical(k) }

// Digest is the lowercase hex sha256 of the key's canonical JSON. A key's
// digest is remembered (digests, up to maxDigests keys): every turn of a
// warm session computes its scope's, and the canonical JSON was ≈ 6 % of
// the executor's CPU per SubmitRun (SPEC P1).
func (k Key) Digest() string {
	digests.mu.Lock()
	d, ok := digests.m[k]
	digests.mu.Unlock()
	if ok {
		return d
	}
	d = hexSHA256(k.Canonical())
	digests.mu.Lock()
	if len(digests.m) >= maxDigests {
		clear(digests.m) // a bound, not an LRU: the sessions in use come back at once
	}
	digests.m[k] = d
	digests.mu.Unlock()
	return d
}

// maxDigests bounds the remembered digests (a key is a few hundred bytes).
const maxDigests = 4096

var digests = struct {
	mu sync.Mutex
	m  map[Key]string
}{m: make(map[Key]string)}

// RootName is the name of the key's durable state root (= Digest).
func (k Key) RootName() string { return k.Digest() }

// LegacyRootNames are the root names of the former layouts that may hold this
// scope's state, in migration order: company/session, then session only.
func (k Key) LegacyRootNames() []string {
	return []string{
		LegacyCompanySessionRootName(k.CompanyID, k.NormalizedSessionID),
		LegacySessionRootName(k.NormalizedSessionID),
	}
}

// Of is FromInput(in).Digest().
func Of(in *prpv1.ExecutionInput) string { return FromInput(in).Digest() }

// OfRun is FromRun(runID, in).Digest().
func OfRun(runID string, in *prpv1.ExecutionInput) string { return FromRun(runID, in).Digest() }

// LegacySessionRootName is the oldest root name: hex sha256 of the normalized
// session id alone.
func LegacySessionRootName(sessionID string) string { return hexSHA256([]byte(sessionID)) }

// LegacyCompanySessionRootName is the former company/session root name: hex
// sha256 of the JSON array [companyId, normalizedSessionId] (compact, no HTML
// escaping).
func LegacyCompanySessionRootName(companyID, sessionID string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode([]string{companyID, sessionID}); err != nil {
		panic(err) // strings only: cannot fail
	}
	return hexSHA256(bytes.TrimRight(buf.Bytes(), "\n"))
}

// IsRootName reports whether name has the shape of a root name: 64 lowercase
// hex digits.
func IsRootName(name string) bool {
	if len(name) != 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func canonical(v any) []byte {
	b, err := prp.CanonicalJSON(v)
	if err != nil {
		panic(err) // strings, numbers and maps only: cannot fail
	}
	return b
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
