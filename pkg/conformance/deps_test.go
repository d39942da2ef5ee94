package conformance

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// services are the binaries tether ships, by the directory of their module
// and the package of their main.
var services = []struct{ module, main string }{
	{"services/executor", "./cmd/executor"},
	{"services/executor", "./cmd/tetherctl"},
	{"services/runnergw", "./cmd/runnergw"},
	{"services/runnerd", "./cmd/runnerd"},
	{"services/backup", "./cmd/backup-verifier"},
}

// testOnly matches the import paths of test doubles, harnesses and benches
// (tether's own packages only: a dependency's internal package may be
// named so, as puddle's internal/genstack is): a service binary must not
// link any.
var testOnly = regexp.MustCompile(`^github\.com/tether-run/tether/.*(fake|mock|testing|stack|pgtest|testbin|bench)`)

// No service binary links a fake provider, a mock model, the test harness
// or a bench (`go list -deps` of each main package).
func TestConformance_ServiceBinariesLinkNoTestDoubles(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	for _, s := range services {
		t.Run(filepath.Base(s.main), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-deps", s.main)
			cmd.Dir = filepath.Join(repoRoot, s.module)
			out, err := cmd.Output()
			require.NoError(t, err, "go list -deps %s in %s", s.main, s.module)
			var bad []string
			for _, p := range strings.Fields(string(out)) {
				if testOnly.MatchString(p) {
					bad = append(bad, p)
				}
			}
			require.Empty(t, bad, "%s links test-only packages", s.main)
		})
	}
}

// grpcxAllowed are the tether packages the gRPC bootstrap may link: the
// build line, the flag helpers, the failure registry, the role names (not
// the dev PKI, which links the grant signer), the key files and the
// telemetry it wires. A new dependency is a decision: add it here with
// its reason, or keep the bootstrap small.
var grpcxAllowed = []string{
	"pkg/grpcx",
	"pkg/buildinfo",
	"pkg/envflag",
	"pkg/failure",
	"pkg/identity",
	"pkg/keyfile",
	"pkg/atomicfile",        // keyfile's atomic writes
	"pkg/synctrace",         // atomicfile's fsync tracing
	"pkg/telemetry",         // tracing and the log handler
	"pkg/gen/tether/prp/v1", // telemetry's trace attributes of PRP events
}

// The gRPC bootstrap (pkg/grpcx) stays a bootstrap: `go list -deps` of it
// names only the tether packages in grpcxAllowed — no grant, scope,
// runner state, PRP or digest package (SPEC issue #34: identity without
// devpki).
func TestConformance_GRPCBootstrapLinksFewTetherPackages(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	cmd := exec.Command("go", "list", "-deps", "./grpcx")
	cmd.Dir = filepath.Join(repoRoot, "pkg")
	out, err := cmd.Output()
	require.NoError(t, err, "go list -deps ./grpcx")
	const prefix = "github.com/tether-run/tether/"
	var extra []string
	for _, p := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(p, prefix)
		if ok && !slices.Contains(grpcxAllowed, rel) {
			extra = append(extra, rel)
		}
	}
	require.Empty(t, extra, "pkg/grpcx links tether packages outside its allowed set")
}

// No two tether packages a service binary links share a name: inside one
// service a package name says which package it is (issue #34: runnerd
// linked its own durable and pkg/scope/durable).
func TestConformance_NoServiceLinksTwoPackagesOfOneName(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	for _, s := range services {
		t.Run(filepath.Base(s.main), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-deps", "-f", "{{.Name}} {{.ImportPath}}", s.main)
			cmd.Dir = filepath.Join(repoRoot, s.module)
			out, err := cmd.Output()
			require.NoError(t, err, "go list -deps %s in %s", s.main, s.module)
			byName := map[string][]string{}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				name, path, _ := strings.Cut(line, " ")
				if strings.HasPrefix(path, "github.com/tether-run/tether/") && name != "main" {
					byName[name] = append(byName[name], path)
				}
			}
			var dups []string
			for name, paths := range byName {
				if len(paths) > 1 {
					dups = append(dups, name+": "+strings.Join(paths, ", "))
				}
			}
			slices.Sort(dups)
			require.Empty(t, dups, "%s links packages of one name", s.main)
		})
	}
}

// The executor's store is persistence only (issue #34): it writes what the
// run's rules (package runrules, through the store.Rules interface)
// decide, and links no executor domain package — `go list -deps` of it
// names no services/executor/internal package but itself.
func TestConformance_TheExecutorStoreImportsNoDomainPackage(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	const store = "github.com/tether-run/tether/services/executor/internal/store"
	cmd := exec.Command("go", "list", "-deps", "./internal/store")
	cmd.Dir = filepath.Join(repoRoot, "services/executor")
	out, err := cmd.Output()
	require.NoError(t, err, "go list -deps ./internal/store")
	var domain []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/tether-run/tether/services/executor/internal/") && p != store {
			domain = append(domain, p)
		}
	}
	require.Empty(t, domain, "the executor's store links executor domain packages")
}
