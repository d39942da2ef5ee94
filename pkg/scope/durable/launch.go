package durable

import (
	"context"
	"maps"
	"path/filepath"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/scope"
)

// Environment variables the plan sets; a configured value never wins over
// the server's.
const (
	EnvWorkspaceCwd     = provenv.WorkspaceVar
	EnvHome             = "HOME"
	EnvCodexHome        = "CODEX_HOME"
	EnvProviderPackPath = "TETHER_PROVIDER_PACK_PATH"
)

// ACPXRuntimeSubdir is the ACPX runtime directory inside a scoped root.
var ACPXRuntimeSubdir = filepath.Join("runtime", "tether-runner", "acpx")

// Target says where the runner runs.
type Target struct {
	// Remote is true for a runner in a remote sandbox.
	Remote bool
	// RemoteWorkspacePath is the workspace directory inside the sandbox; it
	// is the remote provider's containment root.
	RemoteWorkspacePath string
	// ProviderPackPath is the build-owned provider pack staged into remote
	// sandboxes (TETHER_PROVIDER_PACK_PATH); required for remote OpenCode and
	// ACPX.
	ProviderPackPath string
}

// CheckProviderArtifacts refuses, before any backend or runner work, a remote
// OpenCode or ACPX run without a provider pack.
func CheckProviderArtifacts(providerKind string, t Target) error {
	if t.Remote && t.ProviderPackPath == "" && (providerKind == provenv.KindOpenCode || providerKind == provenv.KindACPX) {
		return failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible,
			"configure %s: remote %s needs the build-owned provider pack", EnvProviderPackPath, providerKind)
	}
	return nil
}

// PRPIdentity is the identity the runner transport is bound to.
type PRPIdentity struct {
	Identity
	TurnID string
	ItemID string
}

// LaunchPlan is what a runner backend is constructed from.
type LaunchPlan struct {
	// StateDirectory is the scoped root (runnerd's --state-dir).
	StateDirectory string
	Identity       PRPIdentity
	// WorkspaceCwd is the provider's containment root for both the backend
	// and the session: the execution workspace, or the remote workspace path.
	WorkspaceCwd string
	// Environment is the runner environment: the configured one with the
	// server's workspace (and, remote, HOME and CODEX_HOME) forced.
	Environment map[string]string

	Provider               string
	Model                  string
	ApprovalPolicy         string
	Sandbox                string
	OpenCodePermissionMode string
	ACPXAgent              string
	ACPXPermissionMode     string
	// ACPXRuntimeDirectory is an isolated per-scope runtime directory,
	// <root>/runtime/tether-runner/acpx; empty for other providers.
	ACPXRuntimeDirectory string
	ProviderPackPath     string
}

// LaunchRequest is the input of PlanLaunch.
type LaunchRequest struct {
	RunID  string
	Params scope.Params
	Target Target
	// Environment is the configured runner environment (not trusted for the
	// workspace variables).
	Environment map[string]string
	// RunnerInstanceID and EnvironmentLeaseID are used when the root has no
	// durable binding; the lease falls back to the execution workspace id,
	// then to a name derived from the root.
	RunnerInstanceID   string
	EnvironmentLeaseID string
}

// PlanLaunch builds the launch plan of a prepared root. A durable binding
// (exact run or verified prior run) supplies the runner instance id and
// environment lease id; the run id is always the current run's.
func PlanLaunch(p *Prepared, req LaunchRequest) (*LaunchPlan, error) {
	if err := CheckProviderArtifacts(req.Params.Provider.Kind, req.Target); err != nil {
		return nil, err
	}
	id := Identity{RunID: req.RunID, NormalizedSessionID: req.Params.SessionID(),
		RunnerInstanceID: req.RunnerInstanceID, EnvironmentLeaseID: req.EnvironmentLeaseID}
	if p.Binding != nil {
		id.RunnerInstanceID, id.EnvironmentLeaseID = p.Binding.RunnerInstanceID, p.Binding.EnvironmentLeaseID
	}
	if id.EnvironmentLeaseID == "" {
		id.EnvironmentLeaseID = req.Params.ExecutionWorkspaceID
	}
	if id.EnvironmentLeaseID == "" {
		id.EnvironmentLeaseID = "lease-" + filepath.Base(p.Root)[:16]
	}
	if id.RunnerInstanceID == "" {
		return nil, failure.New(codes.InvalidArgument, failure.RunnerStateIdentityMismatch, "a runner instance id is required for a fresh durable root")
	}
	cwd := req.Params.Cwd
	env := maps.Clone(req.Environment)
	if env == nil {
		env = map[string]string{}
	}
	if req.Target.Remote {
		cwd = req.Target.RemoteWorkspacePath
		env[EnvHome] = cwd
		env[EnvCodexHome] = filepath.Join(cwd, ".codex")
	}
	env[EnvWorkspaceCwd] = cwd
	pc := req.Params.Provider
	plan := &LaunchPlan{
		StateDirectory: p.Root,
		Identity:       PRPIdentity{Identity: id, TurnID: "turn-" + req.RunID, ItemID: "item-" + req.RunID},
		WorkspaceCwd:   cwd,
		Environment:    env,
		Provider:       pc.Kind,
		Model:          pc.Model,
		ApprovalPolicy: pc.ApprovalPolicy,
		Sandbox:        pc.Sandbox,
	}
	if req.Target.Remote {
		plan.ProviderPackPath = req.Target.ProviderPackPath
	}
	switch pc.Kind {
	case provenv.KindOpenCode:
		plan.OpenCodePermissionMode = pc.PermissionMode
	case provenv.KindACPX:
		plan.ACPXAgent, plan.ACPXPermissionMode = pc.Agent, pc.PermissionMode
		plan.ACPXRuntimeDirectory = filepath.Join(p.Root, ACPXRuntimeSubdir)
	}
	return plan, nil
}

// Authority ties the pieces together for one state base: the per-scope claim,
// root preparation, the control-plane binding, the tool authority epoch and
// the launch plan. One Authority per process and base.
type Authority struct {
	Base      string
	PriorRuns PriorRunLookup
	Claims    Claims
	Epochs    Epochs
}

// Session is an opened scope: the claim is held until Release.
type Session struct {
	Scope    scope.Key
	Prepared *Prepared
	Plan     *LaunchPlan
	Tools    *ToolAuthority
	release  func()
}

// Release frees the scope's claim (the tool epoch stays current until a later
// run takes the scope). It is idempotent.
func (s *Session) Release() { s.release() }

// Open prepares run LaunchRequest.RunID's scope before any backend exists: it
// refuses a remote OpenCode/ACPX run without provider pack, claims the scope
// (native_session_supervisor_busy when held), prepares the durable root,
// plans the launch, binds the control-plane identity to this run and begins
// a new tool authority epoch. On failure nothing stays claimed.
func (a *Authority) Open(ctx context.Context, req LaunchRequest) (*Session, error) {
	if err := CheckProviderArtifacts(req.Params.Provider.Kind, req.Target); err != nil {
		return nil, err
	}
	req.Params.RunID = req.RunID
	key := req.Params.Key()
	release, err := a.Claims.Acquire(key.RootName(), req.RunID)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	prep, err := Prepare(ctx, Request{Base: a.Base, Scope: key, RunID: req.RunID, PriorRuns: a.PriorRuns})
	if err != nil {
		return nil, err
	}
	plan, err := PlanLaunch(prep, req)
	if err != nil {
		return nil, err
	}
	if err := ensureBase(a.Base); err != nil {
		return nil, err
	}
	if err := Bind(prep.Root, plan.Identity.Identity); err != nil {
		return nil, err
	}
	tools := a.Epochs.Begin(key.RootName(), ToolBinding{
		CompanyID: req.Params.CompanyID, IssueID: req.Params.IssueID, RunID: req.RunID,
		AgentID: req.Params.AgentID, NormalizedSessionID: key.NormalizedSessionID,
	})
	ok = true
	return &Session{Scope: key, Prepared: prep, Plan: plan, Tools: tools, release: release}, nil
}
