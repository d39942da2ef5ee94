package conformance

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, from this package's directory (go test
// runs a package's tests in its directory).
const repoRoot = "../.."

var (
	// catalogued: a behaviour's heading in docs/behaviours.md.
	catalogued = regexp.MustCompile(`^### ([A-Z][0-9]+) — \S`)
	// testName: a test named after a behaviour.
	testName = regexp.MustCompile(`\bfunc (Test|Fuzz|Benchmark)([A-Z][0-9]+)_`)
	// citation: "SPEC E7", "SPEC: E7", "SPEC F7–F9", "SPEC T2, T3".
	citation = regexp.MustCompile(`\bSPEC:? ([A-Z][0-9]+(?:(?:[,/–-]| and|, ?) ?[A-Z][0-9]+)*)`)
	anID     = regexp.MustCompile(`[A-Z][0-9]+`)
)

// catalogue reads the IDs docs/behaviours.md explains.
func catalogue(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "docs", "behaviours.md"))
	require.NoError(t, err)
	defer f.Close()
	ids := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := catalogued.FindStringSubmatch(sc.Text()); m != nil {
			require.False(t, ids[m[1]], "docs/behaviours.md explains %s twice", m[1])
			ids[m[1]] = true
		}
	}
	require.NoError(t, sc.Err())
	return ids
}

// cited returns, for each ID a Go file of the repository cites (test names
// and SPEC citations; generated code and third-party code aside), the first
// place that cites it.
func cited(t *testing.T) map[string]string {
	t.Helper()
	_, err := os.Stat(filepath.Join(repoRoot, "go.work"))
	require.NoError(t, err, "not at the repository's root")
	where := map[string]string{}
	note := func(id, at string) {
		if _, ok := where[id]; !ok {
			where[id] = at
		}
	}
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == filepath.Join(repoRoot, "pkg", "conformance") {
				return filepath.SkipDir // this test's own examples
			}
			switch d.Name() {
			case ".git", ".cache", "node_modules", "gen", "third_party", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		for i, line := range strings.Split(string(b), "\n") {
			at := rel + ":" + strconv.Itoa(i+1)
			for _, m := range testName.FindAllStringSubmatch(line, -1) {
				note(m[2], at)
			}
			for _, m := range citation.FindAllStringSubmatch(line, -1) {
				for _, id := range anID.FindAllString(m[1], -1) {
					note(id, at)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return where
}

// Every behaviour ID a test name or a SPEC citation uses is explained in
// docs/behaviours.md.
func TestCatalogue_EveryCitedBehaviourIsExplained(t *testing.T) {
	t.Parallel()
	have := catalogue(t)
	var missing []string
	for id, at := range cited(t) {
		if !have[id] {
			missing = append(missing, id+" (cited at "+at+")")
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "docs/behaviours.md lacks these behaviour IDs; add a paragraph for each")
}

// The patterns find what they should.
func TestCatalogue_CitationsAreRecognised(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		"func TestE7_RenewRequiresExactFencedOwner(t *testing.T) {": {"E7"},
		"// (SPEC F7–F9, R13)":                                      {"F7", "F9", "R13"},
		"// SPEC T2, T3: scoped":                                    {"T2", "T3"},
		"// SPEC: P4":                                               {"P4"},
		"// SPECS E1 and a SPEC of nothing":                         nil,
	} {
		var got []string
		for _, m := range testName.FindAllStringSubmatch(line, -1) {
			got = append(got, m[2])
		}
		for _, m := range citation.FindAllStringSubmatch(line, -1) {
			got = append(got, anID.FindAllString(m[1], -1)...)
		}
		require.Equal(t, want, got, line)
	}
}
