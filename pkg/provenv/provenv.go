// Package provenv builds the environment a provider child process starts
// with (SPEC E2).
//
// The provider never inherits the executor's environment. It gets:
//
//  1. From the host, only an allow-list: executable and user context (PATH,
//     HOME, USER, LOGNAME, SHELL, temporary directories, the XDG base
//     directories, and the Windows SystemRoot/PATHEXT) plus the provider's
//     credential-home variable (CODEX_HOME for codex and ACPX codex,
//     CLAUDE_CONFIG_DIR for ACPX claude). Host secrets and TETHER_*
//     internals never pass.
//  2. Over that, the agent's explicitly configured environment, which wins
//     over host defaults and may add provider credentials (OPENAI_API_KEY,
//     ...). A credential name that belongs only to other providers is
//     dropped: each provider receives its own credential names only.
//  3. Finally the server-assigned workspace, pinned in TETHER_WORKSPACE_CWD
//     and the compatibility name PAPERCLIP_WORKSPACE_CWD whatever the
//     configured environment says. For a remote runner the caller passes
//     the remote workspace path. Without an assigned workspace both names
//     are removed rather than trusted from configuration.
//
// The policy travels with the run: the executor puts [Policy] of a run's
// input (the allow-list of host names and the admitted configured
// variables) into its ExecutionInput.environment, and runnerd builds the
// provider's environment from it with [ForRun] — the one place a provider
// environment is made. Configured TETHER_* names are dropped too, and no
// TETHER_* or PAPERCLIP_* host variable is ever inherited, whatever a
// policy names.
//
// Build is a pure function: the host environment is an argument (see
// [ParseEnviron] for os.Environ output).
package provenv

import (
	"slices"
	"strings"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Workspace variable names. Both always carry the server-assigned
// workspace; PAPERCLIP_WORKSPACE_CWD is kept for compatibility.
const (
	WorkspaceVar       = "TETHER_WORKSPACE_CWD"
	LegacyWorkspaceVar = "PAPERCLIP_WORKSPACE_CWD"
)

// Provider kinds and ACPX agents (execution input provider.kind / agent).
const (
	KindCodex    = "codex"
	KindOpenCode = "opencode"
	KindACPX     = "acpx"

	AgentClaude = "claude"
	AgentCodex  = "codex"
)

// Driver kinds, as recorded on the session (the default driver of each
// provider kind).
const (
	DriverCodexAppServer = "codex_app_server"
	DriverOpenCodeServer = "opencode_server"
	DriverACPXRuntime    = "acpx_runtime"
)

// Provider identifies the process the environment is for.
type Provider struct {
	Kind  string // codex | opencode | acpx
	Agent string // ACPX agent: claude | codex; empty otherwise
}

// Input is everything Build needs.
type Input struct {
	Provider Provider
	// Configured is the agent's explicitly configured environment.
	Configured map[string]string
	// Host is the executor host's environment.
	Host map[string]string
	// Workspace is the server-assigned workspace as the provider sees it:
	// for a remote runner, the remote workspace path. Blank: none assigned.
	Workspace string
	// Inherit names the host variables to inherit; nil means
	// [HostAllowList] of the provider.
	Inherit []string
}

// Env is a provider child environment.
type Env struct {
	vars map[string]string
	// Dropped lists configured names that were refused (other providers'
	// credentials, invalid names or values), sorted, for diagnostics. It
	// never holds values.
	Dropped []string
}

// hostBase is inherited from the host for every provider.
var hostBase = []string{
	"PATH", "HOME", "USER", "LOGNAME", "SHELL",
	"TMPDIR", "TEMP", "TMP",
	"XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
	"SystemRoot", "PATHEXT",
}

// CredentialHomeVars returns the host variables that locate a provider's
// own credential store and are therefore inherited for it.
func CredentialHomeVars(p Provider) []string {
	switch {
	case p.Kind == KindCodex, p.Kind == KindACPX && p.Agent == AgentCodex:
		return []string{"CODEX_HOME"}
	case p.Kind == KindACPX && p.Agent == AgentClaude:
		return []string{"CLAUDE_CONFIG_DIR"}
	}
	// OpenCode keeps its credentials under the XDG data directory, which
	// is already part of the base allow-list.
	return nil
}

// credentialOwners maps a provider credential variable to the providers
// that may receive it from configuration.
var credentialOwners = map[string][]Provider{
	"OPENAI_API_KEY":               {{Kind: KindCodex}, {Kind: KindACPX, Agent: AgentCodex}, {Kind: KindOpenCode}},
	"CODEX_API_KEY":                {{Kind: KindCodex}, {Kind: KindACPX, Agent: AgentCodex}},
	"ANTHROPIC_API_KEY":            {{Kind: KindACPX, Agent: AgentClaude}, {Kind: KindOpenCode}},
	"ANTHROPIC_AUTH_TOKEN":         {{Kind: KindACPX, Agent: AgentClaude}},
	"CLAUDE_CODE_OAUTH_TOKEN":      {{Kind: KindACPX, Agent: AgentClaude}},
	"OPENROUTER_API_KEY":           {{Kind: KindOpenCode}},
	"GEMINI_API_KEY":               {{Kind: KindOpenCode}},
	"GOOGLE_GENERATIVE_AI_API_KEY": {{Kind: KindOpenCode}},
	"GROQ_API_KEY":                 {{Kind: KindOpenCode}},
	"XAI_API_KEY":                  {{Kind: KindOpenCode}},
}

// CredentialAllowed reports whether configured variable name may reach
// provider p. Names that are not known provider credentials are allowed.
func CredentialAllowed(p Provider, name string) bool {
	owners, known := credentialOwners[name]
	if !known {
		return true
	}
	return slices.Contains(owners, p)
}

// HostAllowList is the host variables provider p inherits: the base
// executable and user context plus its credential home.
func HostAllowList(p Provider) []string {
	return append(slices.Clone(hostBase), CredentialHomeVars(p)...)
}

// ProviderOf is the provider an execution input names.
func ProviderOf(in *prpv1.ExecutionInput) Provider {
	p := Provider{Kind: in.GetProvider().GetKind()}
	if p.Kind == KindACPX {
		p.Agent = in.GetProvider().GetAgent()
	}
	return p
}

// Policy is the executor's environment policy for run input in: the host
// allow-list of its provider and the configured variables it admits (the
// caller's in.environment.configured). The workspace names are left out:
// the runner pins them.
func Policy(in *prpv1.ExecutionInput) *prpv1.ProviderEnvironment {
	p := ProviderOf(in)
	vars, _ := admit(p, in.GetEnvironment().GetConfigured())
	pol := &prpv1.ProviderEnvironment{Inherit: HostAllowList(p)}
	if len(vars) > 0 {
		pol.Configured = vars
	}
	return pol
}

// ForRun builds the environment of run input in's provider from the policy
// it carries (see [Policy]): host is the runner's provider host context and
// workspace the assigned workspace as the provider sees it.
func ForRun(in *prpv1.ExecutionInput, host map[string]string, workspace string) Env {
	pol := in.GetEnvironment()
	return Build(Input{
		Provider: ProviderOf(in), Configured: pol.GetConfigured(), Host: host, Workspace: workspace,
		Inherit: pol.GetInherit(),
	})
}

// Build returns the provider child environment for in.
func Build(in Input) Env {
	vars := map[string]string{}
	inherit := in.Inherit
	if inherit == nil {
		inherit = HostAllowList(in.Provider)
	}
	for _, k := range inherit {
		if reservedHostName(k) {
			continue
		}
		if v, ok := in.Host[k]; ok && v != "" && validValue(v) {
			vars[k] = v
		}
	}
	configured, dropped := admit(in.Provider, in.Configured)
	for k, v := range configured {
		vars[k] = v
	}
	if ws := strings.TrimSpace(in.Workspace); ws != "" && validValue(ws) {
		vars[WorkspaceVar] = ws
		vars[LegacyWorkspaceVar] = ws
	}
	return Env{vars: vars, Dropped: dropped}
}

// admit returns the configured variables provider p may receive and the
// sorted names it may not. The workspace names are neither: they are never
// trusted from configuration.
func admit(p Provider, configured map[string]string) (map[string]string, []string) {
	vars := map[string]string{}
	var dropped []string
	for k, v := range configured {
		switch {
		case k == WorkspaceVar || k == LegacyWorkspaceVar:
		case !validName(k) || !validValue(v) || !CredentialAllowed(p, k) || strings.HasPrefix(k, "TETHER_"):
			dropped = append(dropped, k)
		default:
			vars[k] = v
		}
	}
	slices.Sort(dropped)
	return vars, dropped
}

// reservedHostName reports host variables that are tether's (or the
// control plane's) internals and are never inherited.
func reservedHostName(k string) bool {
	return strings.HasPrefix(k, "TETHER_") || strings.HasPrefix(k, "PAPERCLIP_")
}

// Map returns a copy of the environment as a map.
func (e Env) Map() map[string]string {
	out := make(map[string]string, len(e.vars))
	for k, v := range e.vars {
		out[k] = v
	}
	return out
}

// List returns the environment as "KEY=VALUE" strings sorted by key, the
// form exec.Cmd.Env takes.
func (e Env) List() []string {
	keys := make([]string, 0, len(e.vars))
	for k := range e.vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + e.vars[k]
	}
	return out
}

// Get returns one variable.
func (e Env) Get(key string) (string, bool) {
	v, ok := e.vars[key]
	return v, ok
}

// ParseEnviron turns os.Environ-style "KEY=VALUE" entries into a map. Later
// entries win; entries without '=' or with an empty key are skipped.
func ParseEnviron(environ []string) map[string]string {
	out := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		out[k] = v
	}
	return out
}

// validName accepts portable environment names: a letter or underscore,
// then letters, digits or underscores.
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func validValue(v string) bool { return !strings.ContainsRune(v, 0) }
