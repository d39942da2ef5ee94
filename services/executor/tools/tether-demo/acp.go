package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// defaultACPModules is where make test-providers installs the pinned
// ACP agents.
const defaultACPModules = ".cache/acp/node_modules"

// acpPackages are the npm packages of the ACPX agents (SPEC R11).
var acpPackages = map[string]string{
	providerlaunch.ACPXCodex:  "@agentclientprotocol/codex-acp",
	providerlaunch.ACPXClaude: "@agentclientprotocol/claude-agent-acp",
}

// acpProvider prepares a demo on a real ACP agent installed at its pinned
// version under modules, run by node; node and the agent's entry script
// are both pinned. The agent works offline against bin/mock-model:
// codex-acp through its home template holding the mock's config.toml,
// claude-agent-acp through ANTHROPIC_BASE_URL in the run's configured
// environment.
func acpProvider(ctx context.Context, name, modules, binDir, dir string, opts *stack.Options) (*demoProvider, error) {
	pkg := acpPackages[name]
	modules, err := filepath.Abs(modules)
	if err != nil {
		return nil, err
	}
	pkgDir := filepath.Join(modules, pkg)
	want := providerlaunch.Versions[name]
	var meta struct {
		Version string `json:"version"`
	}
	raw, err := os.ReadFile(filepath.Join(pkgDir, "package.json"))
	if err == nil {
		err = json.Unmarshal(raw, &meta)
	}
	if err != nil || meta.Version != want {
		return nil, fmt.Errorf("%s@%s is not installed in %s (found %q): run make test-providers, or pass -acp-modules", pkg, want, modules, meta.Version)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("node is not on PATH: %w", err)
	}
	entry := filepath.Join(pkgDir, "dist", "index.js")
	entrySum, err := providerlaunch.FileSHA256(entry)
	if err != nil {
		return nil, err
	}
	args, err := stack.ProviderGatewayArgs(name, node, entry)
	if err != nil {
		return nil, err
	}
	args = append(args, "-"+name+"-sha256", entry+"="+entrySum)
	var mockArgs []string
	template := filepath.Join(dir, "codex-home-template")
	if name == providerlaunch.ACPXCodex {
		mockArgs = []string{"-codex-home", template}
		args = append(args, "-"+name+"-home-template", template)
	}
	base, stop, err := startMockModel(ctx, binDir, mockArgs...)
	if err != nil {
		return nil, err
	}
	p := &demoProvider{name: name, stop: stop, provider: &prpv1.Provider{Kind: provenv.KindACPX, PermissionMode: "approve-all"}}
	switch name {
	case providerlaunch.ACPXCodex:
		p.provider.Agent, p.env = provenv.AgentCodex, map[string]string{"MOCK_API_KEY": "mock-key"}
	case providerlaunch.ACPXClaude:
		p.provider.Agent = provenv.AgentClaude
		p.env = map[string]string{"ANTHROPIC_BASE_URL": strings.TrimSuffix(base, "/v1"), "ANTHROPIC_API_KEY": "mock-key"}
	}
	opts.GatewayArgs = append(opts.GatewayArgs, args...)
	fmt.Printf("demo: provider %s (%s@%s under %s) against the mock model %s\n", name, pkg, want, node, base)
	return p, nil
}
