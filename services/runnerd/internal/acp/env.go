package acp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-run/tether/pkg/atomicfile"
)

// Homes are the agent's directories inside its acpx directory (the scope
// root's acpx/, SPEC B2): every file an agent keeps — codex's rollouts,
// Claude Code's transcripts, the driver's state — lives there, so that a
// checkpoint of acpx/ restores a loadable session.
func Homes(acpxDir, agent string) map[string]string {
	h := map[string]string{"HOME": filepath.Join(acpxDir, "home")}
	switch agent {
	case AgentCodex:
		h["CODEX_HOME"] = filepath.Join(acpxDir, "codex-home")
	case AgentClaude:
		h["CLAUDE_CONFIG_DIR"] = filepath.Join(acpxDir, "claude")
	}
	return h
}

// offlineSwitches turn off what an agent would fetch or report on its own
// (reference opencode-acpx.md §2); set unless the environment sets them.
var offlineSwitches = map[string][]string{
	AgentCodex: {"NO_BROWSER=1"},
	AgentClaude: {"NO_BROWSER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1",
		"DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_BUG_COMMAND=1"},
}

// Environment is the agent's environment: env (the allow-listed one, SPEC
// E2) with the host context pointed at Homes (HOME and the agent's own
// credential-home variable; another agent's is removed), the offline
// switches, and for Claude Code run as root IS_SANDBOX=1 (the CLI refuses
// to start as root otherwise). root reports whether the process runs as
// root.
func Environment(env []string, acpxDir, agent string, root bool) []string {
	homes := Homes(acpxDir, agent)
	out := make([]string, 0, len(env)+len(homes)+8)
	seen := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "CODEX_HOME" || k == "CLAUDE_CONFIG_DIR" {
			continue
		}
		seen[k] = true
		out = append(out, kv)
	}
	for _, k := range []string{"HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR"} {
		if v, ok := homes[k]; ok {
			out = append(out, k+"="+v)
		}
	}
	extra := offlineSwitches[agent]
	if agent == AgentClaude && root {
		extra = append(extra, "IS_SANDBOX=1")
	}
	for _, kv := range extra {
		if k, _, _ := strings.Cut(kv, "="); !seen[k] {
			out = append(out, kv)
		}
	}
	return out
}

// MakeHomes creates the directories of Homes (0700).
func MakeHomes(acpxDir, agent string) error {
	for _, d := range Homes(acpxDir, agent) {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// templateFiles are the launch-only files an operator's home template may
// hold for each agent (credentials and launch configuration); they are
// copied into the agent's credential home before every start and never
// travel in a backup (SPEC B2: the acpx profile excludes these names).
var templateFiles = map[string][]string{
	AgentCodex:  {"auth.json", "config.toml"},
	AgentClaude: {".credentials.json", "settings.json"},
}

// CopyTemplate copies the agent's launch-only files present in template
// (runnerd --provider-home-template, the gateway's -acpx-<agent>-home-template)
// into its credential home under acpxDir (0600, atomically). A missing
// file is skipped; "" copies nothing.
func CopyTemplate(template, acpxDir, agent string) error {
	if template == "" {
		return nil
	}
	var home string
	for k, v := range Homes(acpxDir, agent) {
		if k != "HOME" {
			home = v
		}
	}
	for _, name := range templateFiles[agent] {
		b, err := os.ReadFile(filepath.Join(template, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("provider home template: %w", err)
		}
		if err := atomicfile.Write(home, name, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
