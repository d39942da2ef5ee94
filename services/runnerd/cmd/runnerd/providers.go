package main

import (
	"slices"

	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/runnerd/internal/acp"
	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/opencode"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// providerStarters is runnerd's driver registry: one provider.StartFunc
// per launch profile name (package providerlaunch). Each driver implements
// the provider contract itself. The gateway names the profile with
// --provider; runnerd refuses a run whose provider is another one.
var providerStarters = map[string]provider.StartFunc{
	providerlaunch.Codex:      codex.StartProvider,
	providerlaunch.OpenCode:   opencode.Start,
	providerlaunch.ACPXCodex:  acp.StartProvider,
	providerlaunch.ACPXClaude: acp.StartProvider,
}

func registeredProviders() []string {
	names := make([]string, 0, len(providerStarters))
	for n := range providerStarters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
