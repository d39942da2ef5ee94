package conformance

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// services are the binaries tether ships, by the directory of their module
// and the package of their main.
var services = []struct{ module, main string }{
	{"services/executor", "./cmd/executor"},
	{"services/runnergw", "./cmd/runnergw"},
	{"services/runnerd", "./cmd/runnerd"},
	{"services/backup", "./cmd/backup-verifier"},
}

// testOnly matches the import paths of test doubles, harnesses and benches:
// a service binary must not link any.
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
