package buildinfo_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestL4_TheNewestReleaseHasItsAPIImageAndLintChecksAgainstIt: the newest
// version CHANGELOG.md names has its API image in proto/releases, and make
// lint's buf breaking compares proto/ with that image (RELEASE_API), so a
// release cannot be cut without the baseline later changes are checked
// against.
func TestL4_TheNewestReleaseHasItsAPIImageAndLintChecksAgainstIt(t *testing.T) {
	root := filepath.Join("..", "..")
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)\b`).FindSubmatch(changelog)
	require.NotNil(t, m, "CHANGELOG.md names no release")
	newest := string(m[1])
	image := filepath.Join("proto", "releases", newest+".binpb")
	st, err := os.Stat(filepath.Join(root, image))
	require.NoError(t, err, "the API image of %s", newest)
	require.Positive(t, st.Size())
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^RELEASE_API := `+regexp.QuoteMeta(image)+`$`, string(makefile))
	require.Regexp(t, `(?m)^\tbuf breaking proto --against \$\(RELEASE_API\)$`, string(makefile))
}
