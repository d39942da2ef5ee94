package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// templateHarness starts a stack whose gateway takes its provider home
// templates per company from dir (-provider-home-templates), plus extra
// gateway flags.
func templateHarness(t *testing.T, dir string, extra ...string) *harness {
	t.Helper()
	h := newHarnessWith(t, stack.Options{}, "backup-verifier")
	h.st.SetExtraArgs("runnergw", append([]string{"-provider-home-templates", dir}, extra...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []string{"runnergw", "executor"} {
		_, err := h.st.Start(ctx, p)
		require.NoError(t, err)
	}
	h.client = h.clientFor("executor")
	return h
}

// writeTemplate writes a template's auth.json (0600, in a 0700 directory).
func writeTemplate(t *testing.T, dir, auth string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "auth.json"), []byte(auth), 0o600))
}

// probeOwnAuth runs a warm run of company in session whose provider reads
// its own codex-home/auth.json, and returns the reply and that file's path.
func (h *harness) probeOwnAuth(ctx context.Context, runID, company, session string) (string, string) {
	h.t.Helper()
	in := confinedInput(h.t, company, session, "", "")
	auth := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun(runID, in), "codex-home", "auth.json")
	in.Task.Prompt = "check " + probe("read", auth)
	return h.runProbes(ctx, runID, in), auth
}

// Each company's provider finds its own company's auth.json in its home,
// never another's: acme's run reads acme's (its size), globex's run reads
// globex's, and the file on disk is exactly each company's template.
func TestT3_EachCompanysProviderGetsItsOwnCompanysHomeTemplate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "templates")
	acme := `{"OPENAI_API_KEY":"sk-acme"}`
	globex := `{"OPENAI_API_KEY":"sk-globex-a-longer-key-of-its-own"}`
	writeTemplate(t, filepath.Join(dir, "acme"), acme)
	writeTemplate(t, filepath.Join(dir, "globex"), globex)
	h := templateHarness(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	reply, acmeAuth := h.probeOwnAuth(ctx, "acme-1", "acme", "acme-session")
	require.Contains(t, reply, probeOK("read", acmeAuth)+" "+itoa(len(acme))+" bytes")
	reply, globexAuth := h.probeOwnAuth(ctx, "globex-1", "globex", "globex-session")
	require.Contains(t, reply, probeOK("read", globexAuth)+" "+itoa(len(globex))+" bytes")

	for path, want := range map[string]string{acmeAuth: acme, globexAuth: globex} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, want, string(b), path)
	}
}

// A company without a template of its own gets no launch files — not
// another company's — until the operator puts a _default template there;
// then it gets that one, and the company with its own keeps its own.
func TestT3_ACompanyWithoutItsOwnTemplateGetsOnlyTheDefaultWhenThereIsOne(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "templates")
	acme := `{"OPENAI_API_KEY":"sk-acme"}`
	writeTemplate(t, filepath.Join(dir, "acme"), acme)
	h := templateHarness(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	reply, acmeAuth := h.probeOwnAuth(ctx, "acme-1", "acme", "acme-session")
	require.Contains(t, reply, probeOK("read", acmeAuth)+" "+itoa(len(acme))+" bytes")
	reply, globexAuth := h.probeOwnAuth(ctx, "globex-1", "globex", "globex-session")
	require.Contains(t, reply, probeFailed("read", globexAuth)+" not found", "globex has no template and no default")

	def := `{"OPENAI_API_KEY":"sk-the-operators-shared-default-key"}`
	writeTemplate(t, filepath.Join(dir, "_default"), def)
	reply, globexAuth = h.probeOwnAuth(ctx, "globex-2", "globex", "globex-other")
	require.Contains(t, reply, probeOK("read", globexAuth)+" "+itoa(len(def))+" bytes")
	reply, acmeAuth = h.probeOwnAuth(ctx, "acme-2", "acme", "acme-other")
	require.Contains(t, reply, probeOK("read", acmeAuth)+" "+itoa(len(acme))+" bytes")
	b, err := os.ReadFile(acmeAuth)
	require.NoError(t, err)
	require.False(t, strings.Contains(string(b), "shared-default"))
}
