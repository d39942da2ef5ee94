package scenario

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// fakeBinary returns cmd/fake-codex-app-server (built once per test run
// unless make test prebuilt it).
func fakeBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the fake codex app-server")
	}
	bin, err := testbin.Path("github.com/tether-run/tether/services/runnerd/tools/fake-codex-app-server")
	require.NoError(t, err)
	return bin
}

// mockLookupTool is the dynamic tool every suite thread declares.
var mockLookupTool = provider.DynamicTool{
	Type: "function", Name: "mock_lookup", Description: "Look up a value by key in the host application.",
	InputSchema: json.RawMessage(`{"additionalProperties":false,"properties":{"key":{"type":"string"}},"required":["key"],"type":"object"}`),
}

var earlierRe = regexp.MustCompile(`\(turn (\d+), (\d+) earlier messages\)`)

func TestR3_ScenarioSuiteAgainstFake(t *testing.T) {
	bin := fakeBinary(t)
	root := t.TempDir()
	codexHome := filepath.Join(root, "codex-home")
	workspace := filepath.Join(root, "workspace")
	require.NoError(t, os.MkdirAll(workspace, 0o755))
	callLog := filepath.Join(root, "calls.log")
	tg := target{
		name: "fake",
		config: func(t *testing.T) codex.Config {
			return codex.Config{
				Command: bin,
				Args: []string{"app-server", "--state-file-in-codex-home", "--durable-turn-ids", "--record-process-start",
					"--call-log", callLog, "--delta-delay-ms", "1", "--slow-delta-delay-ms", "100"},
				Env:            []string{"CODEX_HOME=" + codexHome, "HOME=" + root},
				Dir:            workspace,
				CodexHome:      codexHome,
				Model:          "mock-model",
				ApprovalPolicy: "untrusted",
				Sandbox:        "workspace-write",
				DynamicTools:   []provider.DynamicTool{mockLookupTool},
				ToolHandler:    codex.StubToolHandler,
				StartupTimeout: 20 * time.Second,
				RequestTimeout: 20 * time.Second,
			}
		},
		historyReused: func(t *testing.T, final string, earlier []string) {
			m := earlierRe.FindStringSubmatch(final)
			require.NotNil(t, m, final)
			n, _ := strconv.Atoi(m[2])
			assert.GreaterOrEqual(t, n, 2*len(earlier), "the fake saw the earlier messages: %s", final)
		},
		turnTimeout: 20 * time.Second,
		report:      t.Logf,
	}
	runSuite(t, tg, workspace)

	data, err := os.ReadFile(callLog)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	count := func(s string) int {
		n := 0
		for _, l := range lines {
			if l == s {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 2, count("process-start"), "one process, then one after the kill")
	assert.Equal(t, 1, count("thread/start"))
	assert.Equal(t, 1, count("thread/resume"))
	assert.Equal(t, 12, count("turn/start"), "each turn started exactly once")
	assert.Equal(t, 1, count("turn/steer"))
	assert.Equal(t, 1, count("turn/interrupt"))
	assert.Equal(t, 1, count("approval-response:accept"))
	assert.Equal(t, 1, count("approval-response:decline"))
	assert.Equal(t, 1, count("user-input-response:color=red"))
	assert.Equal(t, 1, count("tool-response:lookup(alpha) = 42"))
}
