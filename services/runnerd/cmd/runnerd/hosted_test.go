package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"
)

// TestP4_RunnerdDrivesItsHostedProviderOverTheHostsSocketWithoutAShim:
// runnerd talks to its provider host over the host's socket itself; no
// `runnerd provider-shim` process sits between them (each provider line
// crossed it, one more process hop each way on the warm turn's path). The
// turn runs and the provider is the host's child, as before.
func TestP4_RunnerdDrivesItsHostedProviderOverTheHostsSocketWithoutAShim(t *testing.T) {
	t.Parallel()
	runnerd, fake, g, url, stateDir, ws, callLog := newBinRunnerd(t, "fake-codex-app-server")
	proc := startRunnerd(t, runnerd, g, url, "--state-dir", stateDir, "--workspace", ws, "--provider-command", fake,
		"--provider-arg", "app-server", "--provider-arg", "--delta-delay-ms=25", "--provider-arg", "--call-log="+callLog)
	c := newFrameCollector(t, g)
	c.send("c1", "run.attach", map[string]any{"input": inputMap(t, &prpv1.Provider{Kind: "codex", Model: "gpt-fake"})})
	c.send("c2", "turn.start", map[string]any{"text": "tell me a long story with many many words so that the reply streams for a while"})
	c.collect(func() bool { return c.count("item.delta") >= 3 }, "deltas")

	info, err := provhost.ReadInfo(filepath.Join(stateDir, "runner"))
	require.NoError(t, err)
	require.True(t, info.ProviderAlive())
	children := childCommands(t, proc.cmd.Process.Pid)
	for _, cmdline := range children {
		require.NotContains(t, cmdline, "provider-shim", "runnerd's children: %q", children)
	}
	require.NotContains(t, children, strconv.Itoa(info.ProviderPID), "the provider is the host's child")
	c.collect(func() bool { return c.count("run.terminal") >= 1 }, "run.terminal")
}

// childCommands maps the pids of pid's child processes to their command
// lines.
func childCommands(t *testing.T, pid int) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[e.Name()] = strings.ReplaceAll(string(cl), "\x00", " ")
	}
	return out
}
