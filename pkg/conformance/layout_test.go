package conformance

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// modulePrefix is the import path every tether package starts with.
const modulePrefix = "github.com/tether-run/tether/"

// workspacePackages are the package patterns of the go.work modules, from
// the repository's root.
var workspacePackages = []string{"./pkg/...", "./services/executor/...", "./services/runnergw/...",
	"./services/backup/...", "./services/runnerd/..."}

// shipped are the main packages tether ships (the service image's
// binaries); a service's cmd/ holds these and nothing else.
var shipped = []string{
	"services/executor/cmd/executor",
	"services/executor/cmd/tetherctl",
	"services/runnergw/cmd/runnergw",
	"services/backup/cmd/backup-verifier",
	"services/runnerd/cmd/runnerd",
}

// testTree matches the trees that hold code only tests, the demo and the
// benches use: pkg/testing/…, a service's internal/testing/… and tools/….
var testTree = regexp.MustCompile(`^(pkg/testing/|services/[^/]+/internal/testing/|services/[^/]+/tools/)`)

// testWord matches a path element that names a test double, a harness, a
// bench or one of the shared test helpers (a helper of another name is
// found by its import of "testing").
var testWord = regexp.MustCompile(`fake|mock|bench|harness|pgtest|testbin`)

type listedPackage struct {
	ImportPath string
	Name       string
	Imports    []string // of the non-test files
}

func listWorkspace(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Name,Imports"}, workspacePackages...)...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v", workspacePackages)
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		require.True(t, strings.HasPrefix(p.ImportPath, modulePrefix), p.ImportPath)
		p.ImportPath = strings.TrimPrefix(p.ImportPath, modulePrefix)
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// Test doubles, the test harness, test helpers, benches and the demo live
// in the named trees (docs/layout.md), so a reader can tell product code
// from test code by its path, and the deps check above has a name to look
// for: a package named after a fake, mock, bench, harness or test helper,
// a non-test package importing "testing", and a main package in a
// service's cmd/ that tether does not ship are all refused elsewhere.
func TestConformance_TestCodeLivesOnlyInTheTestingAndToolsTrees(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	t.Parallel()
	var bad []string
	for _, p := range listWorkspace(t) {
		if testTree.MatchString(p.ImportPath) {
			continue
		}
		for _, elem := range strings.Split(p.ImportPath, "/") {
			if testWord.MatchString(elem) {
				bad = append(bad, p.ImportPath+": named like test code ("+elem+")")
				break
			}
		}
		if slices.Contains(p.Imports, "testing") {
			bad = append(bad, p.ImportPath+": a non-test file imports testing")
		}
		if p.Name == "main" && path.Base(path.Dir(p.ImportPath)) == "cmd" && !slices.Contains(shipped, p.ImportPath) {
			bad = append(bad, p.ImportPath+": a main package in cmd/ that tether does not ship (tools/ holds the others)")
		}
	}
	require.Empty(t, bad, "test code outside pkg/testing, internal/testing and tools (docs/layout.md)")
}

// The checks above look at what exists: each rule still refuses what it
// was written for.
func TestConformance_TestCodeRulesRefuseMisplacedPackages(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"services/runnerd/internal/fakecodex", "services/executor/internal/mockmodel",
		"pkg/pgtest", "pkg/testbin", "services/runnergw/cmd/relay-bench", "services/backup/internal/harness"} {
		require.False(t, testTree.MatchString(p), p)
		matched := false
		for _, elem := range strings.Split(p, "/") {
			matched = matched || testWord.MatchString(elem)
		}
		require.True(t, matched, p)
	}
	for _, p := range []string{"services/runnerd/internal/testing/fakecodex", "pkg/testing/pgtest",
		"services/executor/tools/tether-demo", "services/backup/tools/tether-bench-backup"} {
		require.True(t, testTree.MatchString(p), p)
	}
	for _, elem := range []string{"runner", "manifest", "provhost", "runnerd", "stamp", "testing"} {
		require.False(t, testWord.MatchString(elem), elem)
	}
}
