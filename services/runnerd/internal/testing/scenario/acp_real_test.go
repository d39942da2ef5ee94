package scenario

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/acp"
	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// envACPModules is the node_modules directory holding the pinned
// @agentclientprotocol/codex-acp and claude-agent-acp (make test-providers
// installs them into .cache/acp).
const envACPModules = "TETHER_ACP_MODULES"

// TestR11_ScenarioSuiteAgainstRealACPAgents runs the ACP suite against the
// real codex-acp (codex underneath, on the mock Responses API) and
// claude-agent-acp (Claude Code underneath, on the mock Messages API),
// offline: every model request reaches the loopback mock, and under strace
// no process of the agent connects anywhere else.
func TestR11_ScenarioSuiteAgainstRealACPAgents(t *testing.T) {
	modules := os.Getenv(envACPModules)
	if modules == "" {
		t.Skip(envACPModules + " is not set (make test-providers sets it)")
	}
	node, err := exec.LookPath("node")
	require.NoError(t, err)
	nodeVersion, _ := exec.Command(node, "--version").Output()
	strace := ""
	if os.Getenv(envStrace) != "0" {
		if p, err := exec.LookPath("strace"); err == nil {
			strace = p
		}
	}
	agents := []struct{ agent, pkg, entry string }{
		{acp.AgentCodex, "@agentclientprotocol/codex-acp", "dist/index.js"},
		{acp.AgentClaude, "@agentclientprotocol/claude-agent-acp", "dist/index.js"},
	}
	for _, a := range agents {
		t.Run(a.agent, func(t *testing.T) {
			report := fmtReport(t)
			pkgDir := filepath.Join(modules, a.pkg)
			version := packageVersion(t, pkgDir)
			report("%s %s (node %s)", a.pkg, version, strings.TrimSpace(string(nodeVersion)))
			mock, err := mockmodel.Start("127.0.0.1:0")
			require.NoError(t, err)
			defer mock.Close()
			var (
				mu     sync.Mutex
				traces []string
			)
			command := func(root string) (string, []string) {
				args := []string{filepath.Join(pkgDir, a.entry)}
				if strace == "" {
					return node, args
				}
				mu.Lock()
				defer mu.Unlock()
				trace := filepath.Join(root, fmt.Sprintf("connect-%d.strace", len(traces)+1))
				traces = append(traces, trace)
				return strace, append([]string{"-f", "-qq", "-e", "trace=connect", "-o", trace, "--", node}, args...)
			}
			root := t.TempDir()
			tg := acpTarget{
				name: a.pkg + "@" + version, agent: a.agent,
				config: func(t *testing.T, acpxDir, workspace, mode string) acp.Config {
					cmd, args := command(root)
					// The profile is the agent's, not strace's (whose
					// trace file differs per process).
					profile := acp.ProfileDigest(a.agent, node, []string{filepath.Join(pkgDir, a.entry)})
					return acp.Config{Command: cmd, Args: args, ProfileDigest: profile, Env: realACPEnv(t, a.agent, acpxDir, mock, filepath.Dir(node)),
						Dir: workspace, StateDir: acpxDir, Agent: a.agent, PermissionMode: mode,
						StartupTimeout: 120 * time.Second, RequestTimeout: 120 * time.Second,
						Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))}
				},
				shellPrompt: "run the command [shell]", slowPrompt: "take your time [slow]", toolOutput: "hello-from-mock-shell",
				declineEndsTurn: a.agent == acp.AgentCodex,
				historyReused: func(t *testing.T, _ *acpProc, final string, earlier []string) {
					mockSawHistory(t, mock, final, earlier)
				},
				turnTimeout: 180 * time.Second,
				report:      report,
			}
			if a.agent == acp.AgentCodex {
				tg.shellPrompt = "run the command [escalate]"
			}
			runACPSuite(t, tg, root)

			reqs := mock.Requests()
			assert.Empty(t, mock.Unexpected(), "requests the mock does not serve")
			report("%s: mock model served %d model requests on %s; unexpected: %v", tg.name, len(reqs), mock.Addr(), mock.Unexpected())
			if strace == "" {
				report("%s: strace not used; egress checked by the mock only", tg.name)
				return
			}
			connects, bad, err := mockmodel.AuditConnects(traces)
			require.NoError(t, err)
			assert.Empty(t, bad, "non-loopback connect() attempts")
			report("%s: strace: %d connect() calls in %d agent process trees, %d to non-loopback addresses", tg.name, connects, len(traces), len(bad))
		})
	}
}

func packageVersion(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	require.NoError(t, err)
	var p struct {
		Version string `json:"version"`
	}
	require.NoError(t, json.Unmarshal(b, &p))
	return p.Version
}

// realACPEnv is the offline environment of a real agent (reference
// opencode-acpx.md §2), its homes under acpxDir.
func realACPEnv(t *testing.T, agent, acpxDir string, mock *mockmodel.Server, nodeDir string) []string {
	t.Helper()
	home := filepath.Join(acpxDir, "home")
	require.NoError(t, os.MkdirAll(home, 0o700))
	env := []string{"PATH=" + nodeDir + ":/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "NO_BROWSER=1"}
	if agent == acp.AgentCodex {
		codexHome := filepath.Join(acpxDir, "codex-home")
		if _, err := os.Stat(filepath.Join(codexHome, "config.toml")); err != nil {
			require.NoError(t, codex.WriteConfig(codexHome, codex.ConfigTOML{
				Model: "mock-model", ProviderID: "mock", ProviderName: "Mock Responses API", BaseURL: mock.BaseURL(),
				EnvKey: "MOCK_API_KEY", ApprovalPolicy: "on-request", SandboxMode: "workspace-write",
			}))
		}
		return append(env, "CODEX_HOME="+codexHome, "MOCK_API_KEY=mock-key", "APP_SERVER_LOGS="+filepath.Join(acpxDir, "logs"))
	}
	return append(env, "CLAUDE_CONFIG_DIR="+filepath.Join(acpxDir, "claude"),
		"ANTHROPIC_BASE_URL="+mock.AnthropicBaseURL(), "ANTHROPIC_API_KEY=mock-key",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"DISABLE_ERROR_REPORTING=1", "DISABLE_BUG_COMMAND=1", "IS_SANDBOX=1",
		"CLAUDE_AGENT_LOGS="+filepath.Join(acpxDir, "logs"))
}

// mockSawHistory: the model request that answered final carried the earlier
// prompts.
func mockSawHistory(t *testing.T, mock *mockmodel.Server, final string, earlier []string) {
	t.Helper()
	var hit *mockmodel.Request
	for _, r := range mock.Requests() {
		if r.LastUserText != "" && strings.Contains(final, r.LastUserText) {
			r := r
			hit = &r
		}
	}
	require.NotNil(t, hit, "no model request produced %q", final)
	joined := strings.Join(hit.InputTexts, "\n")
	for _, p := range earlier {
		assert.Contains(t, joined, p, "history resent to the model")
	}
}
