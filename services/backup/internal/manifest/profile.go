// Package manifest is the backup domain of a session's harness state: which
// directories a provider's state lives in (persistence profiles, SPEC B2),
// the backup manifest that records their digests and the execution identity
// they belong to, its verification, the ACPX identity-rotation rule and the
// restore decision (SPEC B3). It is pure except for the functions that take
// a directory.
package manifest

import (
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// Directory names of the profiles.
const (
	DirRunner    = "runner"
	DirCodexHome = durable.CodexHomeDir
	DirOpenCode  = durable.OpenCodeHomeDir
	DirACPX      = durable.ACPXHomeDir
)

// AllDirectories are every directory name a manifest may hold.
var AllDirectories = []string{DirRunner, DirCodexHome, DirOpenCode, DirACPX}

// Location says where a profile directory lives on the runner host.
type Location string

// Locations.
const (
	// LocationRunner is runnerd's state directory.
	LocationRunner Location = "runner"
	// LocationFilesystem is a provider directory in the sandbox filesystem.
	LocationFilesystem Location = "filesystem"
)

// Directory is one directory of a persistence profile.
type Directory struct {
	Name     string
	Location Location
	// ExcludeTopLevel lists top-level entries that never travel
	// (credentials re-materialised at launch, scratch trees).
	ExcludeTopLevel []string
	// ExcludeAnywhere lists names that never travel from any depth of the
	// directory (a credential a provider may write into a subdirectory).
	ExcludeAnywhere []string
}

// Profile is the complete recovery state of a provider: its directories in
// order.
type Profile struct {
	ProviderKind string
	DriverKind   string
	Directories  []Directory
}

// CodexHomeExclusions are never backed up: scratch trees and the
// launch-time credentials (auth.json, config.toml may hold a bearer token).
var CodexHomeExclusions = []string{"tmp", ".tmp", "auth.json", "config.toml"}

// CodexHomeCredentialNames are never backed up from any depth of codex-home
// (SPEC S4): codex-home/sub/auth.json is as much a credential as the
// top-level one.
var CodexHomeCredentialNames = []string{"auth.json"}

// ResolveProfile returns the persistence profile of a provider kind: codex →
// [runner, codex-home (without tmp, .tmp, auth.json, config.toml at the top
// and any auth.json below)];
// opencode → [runner, opencode (without its launch-only entries, see
// durable.LaunchOnlyOpenCodeEntries, and any auth.json)]; acpx (any agent) → [runner, acpx (without
// durable.ACPXCredentialNames at any depth)]. Any
// other kind is failure.RunnerHarnessProviderUnsupported.
func ResolveProfile(providerKind string) (Profile, error) {
	runner := Directory{Name: DirRunner, Location: LocationRunner}
	switch providerKind {
	case provenv.KindCodex:
		return Profile{ProviderKind: provenv.KindCodex, DriverKind: provenv.DriverCodexAppServer, Directories: []Directory{runner,
			{Name: DirCodexHome, Location: LocationFilesystem, ExcludeTopLevel: slices.Clone(CodexHomeExclusions),
				ExcludeAnywhere: slices.Clone(CodexHomeCredentialNames)}}}, nil
	case provenv.KindOpenCode:
		return Profile{ProviderKind: provenv.KindOpenCode, DriverKind: provenv.DriverOpenCodeServer, Directories: []Directory{runner,
			{Name: DirOpenCode, Location: LocationFilesystem, ExcludeTopLevel: slices.Clone(durable.LaunchOnlyOpenCodeEntries),
				ExcludeAnywhere: []string{"auth.json"}}}}, nil
	case provenv.KindACPX:
		return Profile{ProviderKind: provenv.KindACPX, DriverKind: provenv.DriverACPXRuntime, Directories: []Directory{runner,
			{Name: DirACPX, Location: LocationFilesystem, ExcludeAnywhere: slices.Clone(durable.ACPXCredentialNames)}}}, nil
	}
	return Profile{}, failure.New(codes.InvalidArgument, failure.RunnerHarnessProviderUnsupported,
		"no persistence profile for provider kind %q", providerKind)
}

// Names returns the profile's directory names in order.
func (p Profile) Names() []string {
	out := make([]string, len(p.Directories))
	for i, d := range p.Directories {
		out[i] = d.Name
	}
	return out
}

// Exclusions returns every excluded entry as a path below its directory
// ("codex-home/auth.json", ...).
func (p Profile) Exclusions() []string {
	return p.below(func(d Directory) []string { return d.ExcludeTopLevel })
}

// ExclusionsAnywhere returns every name excluded at any depth as
// "<directory>/<name>" (archive.ExtractOptions.ExcludeAnywhere).
func (p Profile) ExclusionsAnywhere() []string {
	return p.below(func(d Directory) []string { return d.ExcludeAnywhere })
}

// below returns "<directory>/<name>" for each name list(d) gives.
func (p Profile) below(list func(Directory) []string) []string {
	var out []string
	for _, d := range p.Directories {
		for _, e := range list(d) {
			out = append(out, d.Name+"/"+e)
		}
	}
	return out
}

// SameNames reports whether names are exactly the profile's directories, in
// any order.
func (p Profile) SameNames(names []string) bool {
	a, b := slices.Clone(names), p.Names()
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
