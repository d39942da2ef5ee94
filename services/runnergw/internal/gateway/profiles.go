package gateway

import (
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// persistence is the B2 persistence profile of a provider kind inside a
// scope root: the directories a checkpoint holds (runner state first) and,
// for the provider home, what never travels.
type persistence struct {
	dirs []string
	home string
	// exclude: top-level entries of home; anywhere: names at any depth of
	// home (credentials, SPEC S4).
	exclude, anywhere []string
}

// persistenceOf returns the profile of a provider kind (false: the
// gateway cannot checkpoint it).
func persistenceOf(kind string) (persistence, bool) {
	switch kind {
	case provenv.KindCodex:
		return persistence{dirs: codexProfileDirs, home: durable.CodexHomeDir, exclude: codexHomeExclusions, anywhere: codexHomeCredentials}, true
	case provenv.KindOpenCode:
		return persistence{dirs: []string{durable.RunnerDir, durable.OpenCodeHomeDir}, home: durable.OpenCodeHomeDir,
			exclude: durable.LaunchOnlyOpenCodeEntries, anywhere: []string{"auth.json"}}, true
	case provenv.KindACPX:
		return persistence{dirs: []string{durable.RunnerDir, durable.ACPXHomeDir}, home: durable.ACPXHomeDir,
			anywhere: durable.ACPXCredentialNames}, true
	}
	return persistence{}, false
}

// providerHomes are every provider home a scope root may hold.
var providerHomes = []string{durable.CodexHomeDir, durable.OpenCodeHomeDir, durable.ACPXHomeDir}
