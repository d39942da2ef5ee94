package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// defaultOpenCode is where make test-providers installs the pinned OpenCode.
const defaultOpenCode = ".cache/opencode/node_modules/opencode-linux-x64/bin/opencode"

// demoProvider is the provider the demo's runs name: the fake codex by
// default, or a real provider driven offline against the loopback mock
// model (bin/mock-model).
type demoProvider struct {
	name string
	// provider and env are set on every run's input (nil: codex defaults).
	provider *prpv1.Provider
	env      map[string]string
	stop     func()
}

// setupProvider prepares the gateway flags of a real provider (pinned
// profile, home template pointing at a mock model it starts).
func setupProvider(ctx context.Context, name, command, acpModules, binDir, dir string, opts *stack.Options) (*demoProvider, error) {
	switch name {
	case "", "codex":
		return &demoProvider{name: "codex", stop: func() {}}, nil
	case "opencode":
	case providerlaunch.ACPXCodex, providerlaunch.ACPXClaude:
		return acpProvider(ctx, name, acpModules, binDir, dir, opts)
	default:
		return nil, fmt.Errorf("-provider %q: this demo knows codex, opencode, acpx-codex and acpx-claude", name)
	}
	if command == "" {
		command = defaultOpenCode
	}
	abs, err := filepath.Abs(command)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("OpenCode not found at %s (make test-providers installs opencode-ai 1.18.17 there; or pass -opencode-command)", abs)
	}
	base, stop, err := startMockModel(ctx, binDir)
	if err != nil {
		return nil, err
	}
	tmpl := filepath.Join(dir, "opencode-template")
	if err := os.MkdirAll(tmpl, 0o700); err != nil {
		stop()
		return nil, err
	}
	cfg := `{"$schema":"https://opencode.ai/config.json","provider":{"mock":{"npm":"@ai-sdk/openai-compatible","name":"Mock (loopback)",` +
		`"options":{"baseURL":"` + base + `","apiKey":"{env:MOCK_API_KEY}"},` +
		`"models":{"mock-model":{"name":"Mock Model","tool_call":true,"limit":{"context":100000,"output":4096}}}}}}`
	if err := os.WriteFile(filepath.Join(tmpl, "opencode.json"), []byte(cfg), 0o600); err != nil {
		stop()
		return nil, err
	}
	args, err := stack.ProviderGatewayArgs("opencode", abs)
	if err != nil {
		stop()
		return nil, err
	}
	opts.GatewayArgs = append(opts.GatewayArgs, append(args, "-opencode-home-template", tmpl)...)
	fmt.Printf("demo: provider opencode %s against the mock model %s\n", abs, base)
	return &demoProvider{name: "opencode", stop: stop,
		provider: &prpv1.Provider{Kind: "opencode", Model: "mock/mock-model", PermissionMode: "ask"},
		env:      map[string]string{"MOCK_API_KEY": "mock-key"}}, nil
}

// startMockModel starts bin/mock-model (extra flags in args) and returns
// its base URL (…/v1) and how to stop it.
func startMockModel(ctx context.Context, binDir string, args ...string) (string, func(), error) {
	mock := exec.CommandContext(ctx, filepath.Join(binDir, "mock-model"), args...)
	out, err := mock.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	mock.Stderr = os.Stderr
	if err := mock.Start(); err != nil {
		return "", nil, fmt.Errorf("starting the mock model: %w", err)
	}
	stop := func() { _ = mock.Process.Kill(); _ = mock.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("the mock model did not print its URL: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}

// apply sets the provider on a run's input.
func (p *demoProvider) apply(in *prpv1.ExecutionInput) {
	if p.provider == nil {
		return
	}
	in.Provider = p.provider
	in.Session.DriverKind = scope.DefaultDriverKind(p.provider.GetKind())
	in.Environment = &prpv1.ProviderEnvironment{Configured: p.env}
}
