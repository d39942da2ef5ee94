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
// Build is a pure function: the host environment is an argument (see
// [ParseEnviron] for os.Environ output).
package provenv

import (
	"slices"
	"strings"
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

// Build returns the provider child environment for in.
func Build(in Input) Env {
	vars := map[string]string{}
	inherit := append(slices.Clone(hostBase), CredentialHomeVars(in.Provider)...)
	for _, k := range inherit {
		if v, ok := in.Host[k]; ok && v != "" && validValue(v) {
			vars[k] = v
		}
	}
	var dropped []string
	for k, v := range in.Configured {
		switch {
		case k == WorkspaceVar || k == LegacyWorkspaceVar:
			// Never trusted from configuration; pinned below.
		case !validName(k) || !validValue(v) || !CredentialAllowed(in.Provider, k):
			dropped = append(dropped, k)
		default:
			vars[k] = v
		}
	}
	if ws := strings.TrimSpace(in.Workspace); ws != "" && validValue(ws) {
		vars[WorkspaceVar] = ws
		vars[LegacyWorkspaceVar] = ws
	}
	slices.Sort(dropped)
	return Env{vars: vars, Dropped: dropped}
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
