package provenv

import (
	"testing"

	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

var (
	codex       = Provider{Kind: KindCodex}
	opencode    = Provider{Kind: KindOpenCode}
	acpxClaude  = Provider{Kind: KindACPX, Agent: AgentClaude}
	acpxCodex   = Provider{Kind: KindACPX, Agent: AgentCodex}
	seedHostEnv = map[string]string{
		"PATH":                      "/opt/homebrew/bin:/usr/bin",
		"HOME":                      "/Users/runner",
		"CODEX_HOME":                "/Users/runner/.codex",
		"PAPERCLIP_INTERNAL_SECRET": "must-not-leak",
	}
)

func TestE2_InheritsHostExecutableAndCredentialHomeContext(t *testing.T) {
	host := map[string]string{
		"PATH":                      "/opt/homebrew/bin:/usr/bin",
		"HOME":                      "/Users/runner",
		"CODEX_HOME":                "/Users/runner/.codex",
		"CLAUDE_CONFIG_DIR":         "/Users/runner/.claude",
		"XDG_DATA_HOME":             "/Users/runner/.local/share",
		"TMPDIR":                    "/tmp/runner",
		"USER":                      "", // empty values are not inherited
		"PAPERCLIP_INTERNAL_SECRET": "must-not-leak",
		"TETHER_DATABASE_URL":       "postgres://secret",
		"TETHER_RUNNER_BOOTSTRAP":   "ticket",
		"OPENAI_API_KEY":            "host-key-must-not-leak",
		"AWS_SECRET_ACCESS_KEY":     "must-not-leak",
	}
	tests := []struct {
		name     string
		provider Provider
		host     map[string]string
		want     map[string]string
	}{
		{"seed: codex", codex, seedHostEnv, map[string]string{
			"PATH":       "/opt/homebrew/bin:/usr/bin",
			"HOME":       "/Users/runner",
			"CODEX_HOME": "/Users/runner/.codex",
		}},
		{"codex drops host secrets and other providers' homes", codex, host, map[string]string{
			"PATH":          "/opt/homebrew/bin:/usr/bin",
			"HOME":          "/Users/runner",
			"CODEX_HOME":    "/Users/runner/.codex",
			"XDG_DATA_HOME": "/Users/runner/.local/share",
			"TMPDIR":        "/tmp/runner",
		}},
		{"acpx claude gets its own credential home", acpxClaude, host, map[string]string{
			"PATH":              "/opt/homebrew/bin:/usr/bin",
			"HOME":              "/Users/runner",
			"CLAUDE_CONFIG_DIR": "/Users/runner/.claude",
			"XDG_DATA_HOME":     "/Users/runner/.local/share",
			"TMPDIR":            "/tmp/runner",
		}},
		{"acpx codex", acpxCodex, host, map[string]string{
			"PATH":          "/opt/homebrew/bin:/usr/bin",
			"HOME":          "/Users/runner",
			"CODEX_HOME":    "/Users/runner/.codex",
			"XDG_DATA_HOME": "/Users/runner/.local/share",
			"TMPDIR":        "/tmp/runner",
		}},
		{"opencode", opencode, host, map[string]string{
			"PATH":          "/opt/homebrew/bin:/usr/bin",
			"HOME":          "/Users/runner",
			"XDG_DATA_HOME": "/Users/runner/.local/share",
			"TMPDIR":        "/tmp/runner",
		}},
		{"empty host", codex, nil, map[string]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := Build(Input{Provider: tc.provider, Configured: map[string]string{}, Host: tc.host})
			require.Equal(t, tc.want, env.Map())
			require.Empty(t, env.Dropped)
		})
	}
	t.Run("list form is sorted K=V", func(t *testing.T) {
		env := Build(Input{Provider: codex, Host: ParseEnviron([]string{
			"PATH=/opt/homebrew/bin:/usr/bin", "HOME=/Users/runner", "CODEX_HOME=/Users/runner/.codex",
			"PAPERCLIP_INTERNAL_SECRET=must-not-leak", "malformed", "=x",
		})})
		require.Equal(t, []string{
			"CODEX_HOME=/Users/runner/.codex",
			"HOME=/Users/runner",
			"PATH=/opt/homebrew/bin:/usr/bin",
		}, env.List())
		v, ok := env.Get("HOME")
		require.True(t, ok)
		require.Equal(t, "/Users/runner", v)
		_, ok = env.Get("PAPERCLIP_INTERNAL_SECRET")
		require.False(t, ok)
	})
}

func TestE2_ConfiguredAgentEnvOverridesHostDefaults(t *testing.T) {
	host := map[string]string{"PATH": "/host/bin", "HOME": "/Users/runner"}
	tests := []struct {
		name        string
		provider    Provider
		configured  map[string]string
		want        map[string]string
		wantDropped []string
	}{
		{"seed: codex", codex,
			map[string]string{"PATH": "/agent/bin", "OPENAI_API_KEY": "configured-provider-key"},
			map[string]string{"PATH": "/agent/bin", "HOME": "/Users/runner", "OPENAI_API_KEY": "configured-provider-key"}, nil},
		{"codex does not receive a claude credential", codex,
			map[string]string{"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2", "CLAUDE_CODE_OAUTH_TOKEN": "k3"},
			map[string]string{"PATH": "/host/bin", "HOME": "/Users/runner", "OPENAI_API_KEY": "k1"},
			[]string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"}},
		{"acpx claude does not receive an OpenAI credential", acpxClaude,
			map[string]string{"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2"},
			map[string]string{"PATH": "/host/bin", "HOME": "/Users/runner", "ANTHROPIC_API_KEY": "k2"},
			[]string{"OPENAI_API_KEY"}},
		{"acpx codex gets the codex credentials", acpxCodex,
			map[string]string{"CODEX_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2"},
			map[string]string{"PATH": "/host/bin", "HOME": "/Users/runner", "CODEX_API_KEY": "k1"},
			[]string{"ANTHROPIC_API_KEY"}},
		{"opencode model-provider credentials", opencode,
			map[string]string{"OPENROUTER_API_KEY": "k1", "CODEX_API_KEY": "k2"},
			map[string]string{"PATH": "/host/bin", "HOME": "/Users/runner", "OPENROUTER_API_KEY": "k1"},
			[]string{"CODEX_API_KEY"}},
		{"other configured names pass; invalid names and values do not", codex,
			map[string]string{"HOME": "/agent/home", "GIT_AUTHOR_NAME": "Agent", "BAD-NAME": "x", "1X": "y", "NUL": "a\x00b"},
			map[string]string{"PATH": "/host/bin", "HOME": "/agent/home", "GIT_AUTHOR_NAME": "Agent"},
			[]string{"1X", "BAD-NAME", "NUL"}},
		{"configured empty value overrides", codex,
			map[string]string{"PATH": ""},
			map[string]string{"PATH": "", "HOME": "/Users/runner"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := Build(Input{Provider: tc.provider, Configured: tc.configured, Host: host})
			require.Equal(t, tc.want, env.Map())
			require.Equal(t, tc.wantDropped, env.Dropped)
		})
	}
}

func TestE2_PinsServerAssignedWorkspaceOverConfiguredInput(t *testing.T) {
	const (
		seedAssigned = "/Users/runner/.paperclip/instances/default/workspaces/agent-1"
		assigned     = "/Users/runner/.tether/instances/default/workspaces/agent-1"
	)
	tests := []struct {
		name       string
		configured map[string]string
		workspace  string
		want       map[string]string
	}{
		{"seed", map[string]string{LegacyWorkspaceVar: "/untrusted/configured-workspace"}, seedAssigned,
			map[string]string{"HOME": "/Users/runner", WorkspaceVar: seedAssigned, LegacyWorkspaceVar: seedAssigned}},
		{"tether name configured too", map[string]string{
			WorkspaceVar: "/untrusted/a", LegacyWorkspaceVar: "/untrusted/b",
		}, assigned, map[string]string{"HOME": "/Users/runner", WorkspaceVar: assigned, LegacyWorkspaceVar: assigned}},
		{"remote runner: the remote workspace path", map[string]string{WorkspaceVar: "/untrusted"},
			"/home/sandbox/tether/workspaces/agent-1",
			map[string]string{"HOME": "/Users/runner",
				WorkspaceVar: "/home/sandbox/tether/workspaces/agent-1", LegacyWorkspaceVar: "/home/sandbox/tether/workspaces/agent-1"}},
		{"no assigned workspace: configured values are not trusted", map[string]string{
			WorkspaceVar: "/untrusted/a", LegacyWorkspaceVar: "/untrusted/b",
		}, "  ", map[string]string{"HOME": "/Users/runner"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := Build(Input{
				Provider:   codex,
				Configured: tc.configured,
				Host:       map[string]string{"HOME": "/Users/runner", WorkspaceVar: "/host/leak"},
				Workspace:  tc.workspace,
			})
			require.Equal(t, tc.want, env.Map())
			require.Empty(t, env.Dropped)
		})
	}
}

// TestE2_PolicyCarriedInTheRunInputBuildsTheEnvironment: the executor's
// Policy of a run input, carried in its environment field, is what the
// runner's ForRun builds from; TETHER_* names never pass, configured or
// inherited, whatever a policy names.
func TestE2_PolicyCarriedInTheRunInputBuildsTheEnvironment(t *testing.T) {
	in := &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: KindCodex},
		Environment: &prpv1.ProviderEnvironment{
			Configured: map[string]string{
				"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2", "GIT_AUTHOR_NAME": "Agent",
				"TETHER_RUNNER_TICKET": "x", WorkspaceVar: "/untrusted",
			},
			Inherit: []string{"TETHER_DATABASE_URL"}, // a caller's list is replaced
		},
	}
	pol := Policy(in)
	require.Equal(t, HostAllowList(codex), pol.GetInherit())
	require.Equal(t, map[string]string{"OPENAI_API_KEY": "k1", "GIT_AUTHOR_NAME": "Agent"}, pol.GetConfigured())

	host := map[string]string{
		"PATH": "/bin", "HOME": "/state", "CODEX_HOME": "/state/codex-home",
		"TETHER_DATABASE_URL": "postgres://secret", "PAPERCLIP_INTERNAL_SECRET": "must-not-leak",
	}
	in.Environment = pol
	env := ForRun(in, host, "/ws")
	require.Equal(t, map[string]string{
		"PATH": "/bin", "HOME": "/state", "CODEX_HOME": "/state/codex-home",
		"OPENAI_API_KEY": "k1", "GIT_AUTHOR_NAME": "Agent",
		WorkspaceVar: "/ws", LegacyWorkspaceVar: "/ws",
	}, env.Map())

	// A policy naming internals inherits none of them.
	in.Environment = &prpv1.ProviderEnvironment{Inherit: []string{"PATH", "TETHER_DATABASE_URL", "PAPERCLIP_INTERNAL_SECRET"}}
	require.Equal(t, map[string]string{"PATH": "/bin", WorkspaceVar: "/ws", LegacyWorkspaceVar: "/ws"}, ForRun(in, host, "/ws").Map())

	// An input without a policy (an older executor) gets the provider's
	// default allow-list.
	in.Environment = nil
	require.Equal(t, map[string]string{
		"PATH": "/bin", "HOME": "/state", "CODEX_HOME": "/state/codex-home", WorkspaceVar: "/ws", LegacyWorkspaceVar: "/ws",
	}, ForRun(in, host, "/ws").Map())

	// ACPX: the agent selects the credentials.
	acpx := &prpv1.ExecutionInput{Provider: &prpv1.Provider{Kind: KindACPX, Agent: AgentClaude},
		Environment: &prpv1.ProviderEnvironment{Configured: map[string]string{"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2"}}}
	require.Equal(t, map[string]string{"ANTHROPIC_API_KEY": "k2"}, Policy(acpx).GetConfigured())
}
