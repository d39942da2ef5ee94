package codex

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/tether-run/tether/pkg/failure"
)

// ConfigTOML is what the caller chooses in codex's config.toml; everything
// else WriteConfig writes is fixed to the offline-safe values.
type ConfigTOML struct {
	// Model is the default model name (required).
	Model string
	// ProviderID is the [model_providers.<id>] key (default "tether").
	ProviderID string
	// ProviderName is the provider's display name (default "tether model provider").
	ProviderName string
	// BaseURL is the Responses API base, e.g. http://127.0.0.1:18080/v1 (required).
	BaseURL string
	// EnvKey names the environment variable holding the API key; empty sends
	// no Authorization header.
	EnvKey string
	// ApprovalPolicy (default "never") and SandboxMode (default "read-only").
	ApprovalPolicy string
	SandboxMode    string
	// StreamIdleTimeoutMS (default 30000).
	StreamIdleTimeoutMS int
}

var (
	bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// WriteConfig writes codexHome/config.toml (mode 0600, atomically) with the
// offline-safe settings: no plugin sync, bounded connection retries, no shell
// snapshots, model commands inherit only the core environment, analytics,
// feedback and OTEL off, update checks and web search off, and one custom
// Responses-API provider at c.BaseURL. codexHome is created (0700) if needed.
func WriteConfig(codexHome string, c ConfigTOML) error {
	if codexHome == "" {
		return errorf(failure.ProviderConfigInvalid, "empty codex home")
	}
	if c.ProviderID == "" {
		c.ProviderID = "tether"
	}
	if c.ProviderName == "" {
		c.ProviderName = "tether model provider"
	}
	if c.ApprovalPolicy == "" {
		c.ApprovalPolicy = "never"
	}
	if c.SandboxMode == "" {
		c.SandboxMode = "read-only"
	}
	if c.StreamIdleTimeoutMS <= 0 {
		c.StreamIdleTimeoutMS = 30000
	}
	switch {
	case c.Model == "":
		return errorf(failure.ProviderConfigInvalid, "model is required")
	case !bareKey.MatchString(c.ProviderID):
		return errorf(failure.ProviderConfigInvalid, "provider id %q must match [A-Za-z0-9_-]+", c.ProviderID)
	case c.EnvKey != "" && !envName.MatchString(c.EnvKey):
		return errorf(failure.ProviderConfigInvalid, "env key %q is not a variable name", c.EnvKey)
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errorf(failure.ProviderConfigInvalid, "base url must be an absolute http(s) URL")
	}
	content := renderConfigTOML(c)

	if err := os.MkdirAll(codexHome, 0o700); err != nil {
		return fmt.Errorf("codex: create codex home: %w", err)
	}
	tmp, err := os.CreateTemp(codexHome, ".config.toml.tmp-*")
	if err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	tmpName := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			_ = tmp.Close()
			_ = os.Remove(tmpName)
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	if _, err := tmp.WriteString(content); err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	if err := os.Rename(tmpName, filepath.Join(codexHome, "config.toml")); err != nil {
		return fmt.Errorf("codex: write config: %w", err)
	}
	ok = true
	if d, err := os.Open(codexHome); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

func renderConfigTOML(c ConfigTOML) string {
	var b strings.Builder
	kv := func(k string, v any) {
		switch x := v.(type) {
		case string:
			fmt.Fprintf(&b, "%s = %s\n", k, tomlString(x))
		case bool:
			fmt.Fprintf(&b, "%s = %t\n", k, x)
		case int:
			fmt.Fprintf(&b, "%s = %d\n", k, x)
		}
	}
	b.WriteString("# Written by tether runnerd. Offline-safe settings; regenerated on every start.\n")
	kv("model", c.Model)
	kv("model_provider", c.ProviderID)
	kv("approval_policy", c.ApprovalPolicy)
	kv("sandbox_mode", c.SandboxMode)
	kv("check_for_update_on_startup", false)
	kv("web_search", "disabled")

	b.WriteString("\n[analytics]\n")
	kv("enabled", false)
	b.WriteString("\n[feedback]\n")
	kv("enabled", false)
	b.WriteString("\n[otel]\n")
	kv("exporter", "none")
	kv("trace_exporter", "none")
	kv("metrics_exporter", "none")

	fmt.Fprintf(&b, "\n[model_providers.%s]\n", c.ProviderID)
	kv("name", c.ProviderName)
	kv("base_url", c.BaseURL)
	kv("wire_api", "responses")
	if c.EnvKey != "" {
		kv("env_key", c.EnvKey)
	}
	kv("request_max_retries", 0)
	kv("stream_max_retries", 0)
	kv("stream_idle_timeout_ms", c.StreamIdleTimeoutMS)

	b.WriteString("\n[features]\n")
	for _, f := range []string{
		"plugins", "remote_plugin", "apps", "tool_suggest", "image_generation",
		"browser_use", "computer_use", "in_app_updates", "goals",
		"unbounded_connection_retries", "shell_snapshot",
	} {
		kv(f, false)
	}
	b.WriteString("\n[agents]\n")
	kv("enabled", false)
	// The model's plan tool: its calls are the plan updates (SPEC E3).
	b.WriteString("\n[tools.update_plan]\n")
	kv("enabled", true)
	b.WriteString("\n[shell_environment_policy]\n")
	kv("inherit", "core")
	return b.String()
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 || r == 0x7f {
				b.WriteString(`\u` + leftPad(strconv.FormatInt(int64(r), 16), 4))
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}
