package e2e

import (
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

// TestL4_EveryBinaryAnswersVersionWithTheSameBuild: each shipped binary
// answers -version (tetherctl also `version`) with one line naming its
// version, commit and Go toolchain, exits 0, and all report the same build
// (make build stamps one VERSION into all of them).
func TestL4_EveryBinaryAnswersVersionWithTheSameBuild(t *testing.T) {
	t.Parallel()
	line := regexp.MustCompile(`^(\S+) (\S+) \(commit \S+?(, modified)?(, \S+)?, go\S+\)\n$`)
	versions := map[string]bool{}
	for _, tc := range []struct {
		pkg  string
		args []string
	}{
		{"github.com/tether-run/tether/services/executor/cmd/executor", []string{"-version"}},
		{"github.com/tether-run/tether/services/runnergw/cmd/runnergw", []string{"-version"}},
		{"github.com/tether-run/tether/services/backup/cmd/backup-verifier", []string{"-version"}},
		{"github.com/tether-run/tether/services/runnerd/cmd/runnerd", []string{"-version"}},
		{"github.com/tether-run/tether/services/executor/cmd/tetherctl", []string{"-version"}},
		{"github.com/tether-run/tether/services/executor/cmd/tetherctl", []string{"version"}},
	} {
		bin, err := testbin.Path(tc.pkg)
		require.NoError(t, err)
		out, err := exec.Command(bin, tc.args...).Output()
		require.NoError(t, err, "%s %v", path.Base(tc.pkg), tc.args)
		m := line.FindStringSubmatch(string(out))
		require.NotNil(t, m, "%s %v printed %q", path.Base(tc.pkg), tc.args, out)
		require.Equal(t, path.Base(tc.pkg), m[1])
		versions[m[2]] = true
		require.False(t, strings.Contains(string(out), "\n\n"))
	}
	require.Len(t, versions, 1, "one build: %v", versions)
}
