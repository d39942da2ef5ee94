package gateway

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

// A company's template is its own directory, never reached through a link
// (to another company's template or anywhere else), and each file is read
// by the key-file rule (no link, private); a company id that is not one
// path segment names no template.
func TestT3_APerCompanyTemplateFollowsNoLinkAndNamesOneCompany(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []string{"acme", "globex"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, c), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, c, "auth.json"), []byte(c), 0o600))
	}
	require.NoError(t, CheckProviderHomeTemplates(dir))
	g := &Gateway{cfg: Config{ProviderHomeTemplates: dir, CodexHomeTemplate: filepath.Join(dir, "acme")}}

	got, err := g.companyTemplate("globex", "", "")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "globex"), got)
	got, err = g.companyTemplate("initech", "", "")
	require.NoError(t, err)
	require.Empty(t, got, "no template of its own, no default, no shared flag: none")
	for _, bad := range []string{"../acme", "acme/../globex", "..", "_default", ""} {
		_, err := g.companyTemplate(bad, "", "")
		require.Error(t, err, bad)
	}

	// initech's directory is a link to acme's: refused at startup and at launch.
	require.NoError(t, os.Symlink(filepath.Join(dir, "acme"), filepath.Join(dir, "initech")))
	require.ErrorContains(t, CheckProviderHomeTemplates(dir), "symlink")
	_, err = g.companyTemplate("initech", "", "")
	require.EqualValues(t, failure.KeyFileUnsafe, failure.CodeOf(err))
	require.NoError(t, os.Remove(filepath.Join(dir, "initech")))

	// globex's auth.json is a link to acme's: the launch fails, nothing is copied.
	require.NoError(t, os.Remove(filepath.Join(dir, "globex", "auth.json")))
	require.NoError(t, os.Symlink(filepath.Join(dir, "acme", "auth.json"), filepath.Join(dir, "globex", "auth.json")))
	scopeDir := filepath.Join(t.TempDir(), "scope")
	require.NoError(t, os.Mkdir(scopeDir, 0o700))
	err = materializeCodexHome(filepath.Join(dir, "globex"), scopeDir, true)
	require.EqualValues(t, failure.KeyFileUnsafe, failure.CodeOf(err))
	_, err = os.Stat(filepath.Join(scopeDir, "codex-home", "auth.json"))
	require.True(t, os.IsNotExist(err))

	// A template that loses its auth.json takes it from the home too.
	require.NoError(t, materializeCodexHome(filepath.Join(dir, "acme"), scopeDir, true))
	b, err := os.ReadFile(filepath.Join(scopeDir, "codex-home", "auth.json"))
	require.NoError(t, err)
	require.Equal(t, "acme", string(b))
	require.NoError(t, materializeCodexHome("", scopeDir, true))
	_, err = os.Stat(filepath.Join(scopeDir, "codex-home", "auth.json"))
	require.True(t, os.IsNotExist(err), "a stale auth.json stays behind")
}
