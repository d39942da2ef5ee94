package e2e

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

// TestD5_EveryFlagOfEveryServiceBinaryIsInTheConfigurationReference: an
// operator reading docs/configuration.md finds every flag the executor,
// runnergw, backup-verifier and runnerd accept, as `-flag` or `--flag` in
// code quotes (alone or in a list); a flag a binary's -h prints and the page
// lacks fails the test, so a new knob cannot ship undocumented.
func TestD5_EveryFlagOfEveryServiceBinaryIsInTheConfigurationReference(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	require.NoError(t, err)
	documented := documentedFlags(string(doc))
	flagLine := regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9-]*)`)
	for _, pkg := range []string{
		"github.com/tether-run/tether/services/executor/cmd/executor",
		"github.com/tether-run/tether/services/runnergw/cmd/runnergw",
		"github.com/tether-run/tether/services/backup/cmd/backup-verifier",
		"github.com/tether-run/tether/services/runnerd/cmd/runnerd",
	} {
		bin, err := testbin.Path(pkg)
		require.NoError(t, err)
		out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 0 or 2 depending on the flag package
		flags := flagLine.FindAllStringSubmatch(string(out), -1)
		require.NotEmpty(t, flags, "%s -h printed no flags: %s", path.Base(pkg), out)
		var missing []string
		for _, f := range flags {
			if !documented[f[1]] {
				missing = append(missing, "-"+f[1])
			}
		}
		sort.Strings(missing)
		require.Empty(t, missing, "%s flags missing from docs/configuration.md", path.Base(pkg))
	}
}

// repoRoot is the repository's root, from this package's directory (the
// working directory of its tests).
const repoRoot = "../../../.."

// documentedFlags is every name written as `-name`, `--name` or `-name
// VALUE` inside backquotes in a markdown text.
func documentedFlags(doc string) map[string]bool {
	code := regexp.MustCompile("`([^`\n]+)`")
	flag := regexp.MustCompile(`(?:^|[\s/(,])--?([a-z0-9][a-z0-9-]*)`)
	out := map[string]bool{}
	for _, m := range code.FindAllStringSubmatch(doc, -1) {
		for _, f := range flag.FindAllStringSubmatch(m[1], -1) {
			out[strings.TrimSuffix(f[1], "-")] = true
		}
	}
	return out
}
