package main

import (
	"slices"

	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/services/runnerd/internal/opencode"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
)

// providerStarters is runnerd's driver registry: one StartFunc per launch
// profile name (package providerlaunch). The gateway names the profile
// with --provider; runnerd refuses a run whose provider is another one.
var providerStarters = map[string]runner.StartFunc{
	providerlaunch.Codex:      startCodex,
	providerlaunch.OpenCode:   opencode.Start,
	providerlaunch.ACPXCodex:  startACP,
	providerlaunch.ACPXClaude: startACP,
}

func registeredProviders() []string {
	names := make([]string, 0, len(providerStarters))
	for n := range providerStarters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
