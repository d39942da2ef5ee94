package codex

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

// parseSimpleTOML reads the flat "[table]" / "key = value" subset WriteConfig
// produces into table -> key -> raw value.
func parseSimpleTOML(t *testing.T, content string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{"": {}}
	table := ""
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			table = strings.Trim(line, "[]")
			require.NotContains(t, out, table, "table %s repeated", table)
			out[table] = map[string]string{}
		default:
			k, v, ok := strings.Cut(line, " = ")
			require.True(t, ok, line)
			require.NotContains(t, out[table], k, "key %s repeated", k)
			out[table][k] = v
		}
	}
	return out
}

func TestR2_WriteConfigOfflineSafe(t *testing.T) {
	t.Parallel()
	home := filepath.Join(t.TempDir(), "codex-home")
	require.NoError(t, WriteConfig(home, ConfigTOML{
		Model: "mock-model", ProviderID: "mock", BaseURL: "http://127.0.0.1:18080/v1", EnvKey: "MOCK_API_KEY",
	}))
	path := filepath.Join(home, "config.toml")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(home)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm())
	b, err := os.ReadFile(path)
	require.NoError(t, err)

	got := parseSimpleTOML(t, string(b))
	assert.Equal(t, map[string]map[string]string{
		"": {
			"model": `"mock-model"`, "model_provider": `"mock"`, "approval_policy": `"never"`,
			"sandbox_mode": `"read-only"`, "check_for_update_on_startup": "false", "web_search": `"disabled"`,
		},
		"analytics": {"enabled": "false"},
		"feedback":  {"enabled": "false"},
		"otel":      {"exporter": `"none"`, "trace_exporter": `"none"`, "metrics_exporter": `"none"`},
		"model_providers.mock": {
			"name": `"tether model provider"`, "base_url": `"http://127.0.0.1:18080/v1"`, "wire_api": `"responses"`,
			"env_key": `"MOCK_API_KEY"`, "request_max_retries": "0", "stream_max_retries": "0", "stream_idle_timeout_ms": "30000",
		},
		"features": {
			"plugins": "false", "remote_plugin": "false", "apps": "false", "tool_suggest": "false",
			"image_generation": "false", "browser_use": "false", "computer_use": "false", "in_app_updates": "false",
			"goals": "false", "unbounded_connection_retries": "false", "shell_snapshot": "false",
		},
		"agents":                   {"enabled": "false"},
		"tools.update_plan":        {"enabled": "true"},
		"shell_environment_policy": {"inherit": `"core"`},
	}, got)

	// Rewrite in place (atomic replace), no temp files left behind.
	require.NoError(t, WriteConfig(home, ConfigTOML{Model: `we"ird\model`, BaseURL: "https://proxy.internal/v1", ApprovalPolicy: "untrusted", SandboxMode: "workspace-write"}))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	got = parseSimpleTOML(t, string(b))
	assert.Equal(t, `"we\"ird\\model"`, got[""]["model"])
	assert.Equal(t, `"tether"`, got[""]["model_provider"])
	assert.Equal(t, `"untrusted"`, got[""]["approval_policy"])
	assert.Equal(t, `"workspace-write"`, got[""]["sandbox_mode"])
	assert.NotContains(t, got["model_providers.tether"], "env_key")
	entries, err := os.ReadDir(home)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "config.toml", entries[0].Name())
}

func TestR2_WriteConfigRejectsBadInput(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	ok := ConfigTOML{Model: "m", BaseURL: "http://127.0.0.1:1/v1"}
	for name, c := range map[string]ConfigTOML{
		"no model":     {BaseURL: ok.BaseURL},
		"no base url":  {Model: "m"},
		"relative url": {Model: "m", BaseURL: "/v1"},
		"bad scheme":   {Model: "m", BaseURL: "file:///etc/passwd"},
		"bad provider": {Model: "m", BaseURL: ok.BaseURL, ProviderID: "a.b]"},
		"bad env key":  {Model: "m", BaseURL: ok.BaseURL, EnvKey: "A=B"},
	} {
		assert.Equal(t, failure.ProviderConfigInvalid, CodeOf(WriteConfig(home, c)), name)
	}
	assert.Equal(t, failure.ProviderConfigInvalid, CodeOf(WriteConfig("", ok)))
	_, err := os.Stat(filepath.Join(home, "config.toml"))
	assert.True(t, os.IsNotExist(err))
	assert.Equal(t, `"a\u0001\tb"`, tomlString("a\x01\tb"))
}
