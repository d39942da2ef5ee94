package scenario

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// Environment of the opt-in real codex suite (make test-codex).
const (
	// envCodexBin is the NATIVE codex binary
	// (node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex).
	envCodexBin = "TETHER_CODEX_BIN"
	// envStrace: "0" disables the connect() audit under strace; otherwise it
	// runs when strace is installed.
	envStrace = "TETHER_CODEX_STRACE"
)

// offlineConfigLines must all be in the generated config.toml (reference
// section 2): no plugin sync, bounded retries, no shell snapshots, core env.
var offlineConfigLines = []string{
	`model = "mock-model"`,
	`model_provider = "mock"`,
	`check_for_update_on_startup = false`,
	`web_search = "disabled"`,
	`[features]`,
	`plugins = false`,
	`remote_plugin = false`,
	`apps = false`,
	`unbounded_connection_retries = false`,
	`shell_snapshot = false`,
	`[shell_environment_policy]`,
	`inherit = "core"`,
	`request_max_retries = 0`,
	`stream_max_retries = 0`,
}

func TestR2_ScenarioSuiteAgainstRealCodex(t *testing.T) {
	bin := os.Getenv(envCodexBin)
	if bin == "" {
		t.Skip(envCodexBin + " is not set (make test-codex sets it)")
	}
	if strings.HasSuffix(filepath.Dir(bin), ".bin") {
		t.Fatalf("%s points at the npm shim %s; use the native binary", envCodexBin, bin)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s --version: %s", bin, out)
	t.Logf("codex: %s", strings.TrimSpace(string(out)))

	mock, err := mockmodel.Start("127.0.0.1:0")
	require.NoError(t, err)
	defer mock.Close()

	root := t.TempDir()
	codexHome := filepath.Join(root, "codex-home")
	home := filepath.Join(root, "home")
	workspace := filepath.Join(root, "workspace")
	require.NoError(t, os.MkdirAll(workspace, 0o755))
	require.NoError(t, os.MkdirAll(home, 0o700))
	// The full offline config, written before the first start.
	require.NoError(t, codex.WriteConfig(codexHome, codex.ConfigTOML{
		Model: "mock-model", ProviderID: "mock", ProviderName: "Mock Responses API", BaseURL: mock.BaseURL(),
		ApprovalPolicy: "on-request", SandboxMode: "workspace-write", // thread/start asks "untrusted" (not valid in config.toml in 0.169.0)
	}))
	cfgText, err := os.ReadFile(filepath.Join(codexHome, "config.toml"))
	require.NoError(t, err)
	for _, l := range append(offlineConfigLines, `base_url = "`+mock.BaseURL()+`"`) {
		require.Contains(t, string(cfgText), "\n"+l+"\n", "config.toml must contain %q", l)
	}
	require.True(t, strings.HasPrefix(mock.BaseURL(), "http://127.0.0.1:"), mock.BaseURL())

	strace := ""
	if os.Getenv(envStrace) != "0" {
		if p, err := exec.LookPath("strace"); err == nil {
			strace = p
		}
	}
	var nproc atomic.Int32
	var traces []string
	tg := target{
		name: "codex",
		config: func(t *testing.T) codex.Config {
			cmd, args := bin, []string{"app-server"}
			if strace != "" {
				trace := filepath.Join(root, fmt.Sprintf("connect-%d.strace", nproc.Add(1)))
				traces = append(traces, trace)
				cmd, args = strace, append([]string{"-f", "-qq", "-e", "trace=connect", "-o", trace, "--", bin}, args...)
			}
			return codex.Config{
				Command: cmd,
				Args:    args,
				Env: []string{
					"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "CODEX_HOME=" + codexHome, "RUST_LOG=warn",
					"CODEX_MANAGED_BY_NPM=1",
				},
				Dir:            workspace,
				CodexHome:      codexHome,
				Model:          "mock-model",
				ApprovalPolicy: "untrusted",
				Sandbox:        "workspace-write",
				DynamicTools:   []provider.DynamicTool{mockLookupTool},
				ToolHandler:    codex.StubToolHandler,
				StartupTimeout: 60 * time.Second,
				RequestTimeout: 60 * time.Second,
				Logger:         slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
			}
		},
		historyReused: func(t *testing.T, final string, earlier []string) {
			// The model request that produced final carried every earlier
			// prompt and its answer (codex resends the whole history).
			var hit *mockmodel.Request
			for _, r := range mock.Requests() {
				if r.LastUserText != "" && strings.Contains(final, r.LastUserText) {
					r := r
					hit = &r
				}
			}
			require.NotNil(t, hit, "no model request produced %q", final)
			for _, p := range earlier {
				assert.Contains(t, hit.InputTexts, "user: "+p, "history resent to the model")
				assert.Contains(t, hit.InputTexts, "assistant: ECHO: "+p)
			}
		},
		turnTimeout: 90 * time.Second,
		report: func(format string, args ...any) {
			t.Logf(format, args...)
			fmt.Printf("test-codex: "+format+"\n", args...)
		},
	}
	runSuite(t, tg, workspace)

	// Egress: every model request reached the mock, nothing else was asked
	// of it, and (under strace) codex connected to loopback only.
	reqs := mock.Requests()
	assert.Empty(t, mock.Unexpected(), "requests the mock does not serve")
	for _, r := range reqs {
		assert.Equal(t, "/v1/responses", r.Path)
	}
	tg.report("mock model: %d model requests, all POST /v1/responses on %s", len(reqs), mock.Addr())
	if strace == "" {
		tg.report("strace not used (not installed or %s=0); egress checked by config and mock only", envStrace)
		return
	}
	connects, bad, err := mockmodel.AuditConnects(traces)
	require.NoError(t, err)
	assert.Empty(t, bad, "non-loopback connect() attempts")
	tg.report("strace: %d connect() calls in %d provider processes, %d to non-loopback addresses", connects, len(traces), len(bad))
}

// tlogWriter sends driver logs (provider stderr at debug) to the test log.
type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
