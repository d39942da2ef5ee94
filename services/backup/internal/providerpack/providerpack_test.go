package providerpack

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

// jsCanonical is an independent transcription of the canonical form the pack
// builder uses (keys sorted, no whitespace, JSON primitives), for ASCII data.
func jsCanonical(v any) string {
	switch t := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			kb, _ := json.Marshal(k)
			parts[i] = string(kb) + ":" + jsCanonical(t[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		parts := make([]string, len(t))
		for i, e := range t {
			parts[i] = jsCanonical(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

type pack struct {
	t       *testing.T
	root    string
	payload map[string]any
}

const (
	proxySrc   = "export const proxy = true;\n"
	sidecarSrc = "export const sidecar = true;\n"
)

func (p *pack) write(rel, data string) {
	p.t.Helper()
	path := filepath.Join(p.root, rel)
	require.NoError(p.t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(p.t, os.WriteFile(path, []byte(data), 0o644))
}

// newPack lays out a complete, fully digested pack as the build would.
func newPack(t *testing.T) *pack {
	p := &pack{t: t, root: t.TempDir()}
	files := map[string]string{
		"dist/cli/opencode-app-server-proxy.cjs":    proxySrc,
		"dist/cli/acpx-runtime-sidecar.cjs":         sidecarSrc,
		"dist/lib/runtime.js":                       "module.exports = 1;\n",
		"node_modules/node/bin/node":                "provider-node\n",
		"pnpm-lock.yaml":                            "lockfileVersion: '9.0'\n",
		"node_modules/.bin/opencode":                "#!/bin/sh\n",
		"node_modules/opencode-ai/bin/opencode.exe": "opencode-binary\n",
	}
	for rel, data := range files {
		p.write(rel, data)
	}
	dist, err := digest.PackTree(filepath.Join(p.root, "dist"))
	require.NoError(t, err)
	art := func(path string) map[string]any { return map[string]any{"path": path, "sha256": sha(files[path])} }
	p.payload = map[string]any{
		"pins": map[string]any{
			"nodeMinimum": "24.11.0", "codex": "0.148.0", "opencode": "1.18.17",
			"acpx": "0.13.1", "claudeAcp": "0.70.0", "codexAcp": "1.6.2",
		},
		"target":               map[string]any{"platform": "linux", "architecture": "x64"},
		"runnerSourceRevision": strings.Repeat("1", 40),
		"distDigest":           dist,
		"bridgeDigest":         sha(sha(proxySrc) + "\n" + sha(sidecarSrc) + "\n" + dist),
		"acpxProfileDigests": map[string]any{
			"claude": "sha256:9d73d1f0f121fb96cc8badb28c22d5bff02d8582eb2e40360a81c189e1b9422a",
			"codex":  "sha256:94049b3e3c3aee87de62703786e4fa81d031d7bd979f99bdf516d84f28791a79",
		},
		"artifacts": map[string]any{
			"nodeCommand":        art("node_modules/node/bin/node"),
			"productionLock":     art("pnpm-lock.yaml"),
			"opencodeCommand":    art("node_modules/.bin/opencode"),
			"opencodeExecutable": art("node_modules/opencode-ai/bin/opencode.exe"),
			"opencodeProxy":      art("dist/cli/opencode-app-server-proxy.cjs"),
			"acpxSidecar":        art("dist/cli/acpx-runtime-sidecar.cjs"),
		},
	}
	p.writeManifest()
	return p
}

// writeManifest writes provider-pack.json with a correct digest of the
// current payload.
func (p *pack) writeManifest() {
	p.writeManifestDigest(sha(jsCanonical(p.payload)))
}

func (p *pack) writeManifestDigest(d string) {
	b, err := json.Marshal(map[string]any{"schema": CompatSchema, "digest": d, "payload": p.payload})
	require.NoError(p.t, err)
	p.write(FileName, string(b))
}

func (p *pack) artifacts() map[string]any { return p.payload["artifacts"].(map[string]any) }

func requireFails(t *testing.T, err error, msg string) {
	t.Helper()
	require.Error(t, err)
	require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err), "%v", err)
	require.Equal(t, failure.RunnerRemoteProviderArtifactIncompatible+": "+msg, err.Error())
}

func TestB1_AcceptsFullyDigestedPack(t *testing.T) {
	p := newPack(t)
	m, err := Read(p.root)
	require.NoError(t, err)
	require.Equal(t, "1.18.17", m.Pins["opencode"])
	require.Equal(t, sha(jsCanonical(p.payload)), m.Digest)
	ours, err := digest.CanonicalHash(p.payload)
	require.NoError(t, err)
	require.Equal(t, m.Digest, ours, "canonical JSON differs from the builder's")
	_, err = Read(p.root, Options{Platform: "linux", Architecture: "x64"})
	require.NoError(t, err)
	_, err = Read(p.root, Options{Platform: "darwin"})
	requireFails(t, err, "provider pack target does not match")

	// tether's own schema name is accepted too.
	b, err := json.Marshal(map[string]any{"schema": Schema, "digest": m.Digest, "payload": p.payload})
	require.NoError(t, err)
	p.write(FileName, string(b))
	_, err = Read(p.root)
	require.NoError(t, err)
}

func TestB1_SubstitutedArtifactPathSaysPathMustBe(t *testing.T) {
	p := newPack(t)
	labels := map[string]Artifact{}
	for _, a := range Artifacts {
		labels[a.Name] = a
	}
	for _, sub := range [][2]string{
		{"nodeCommand", "productionLock"},
		{"opencodeExecutable", "opencodeCommand"},
		{"opencodeProxy", "acpxSidecar"},
		{"acpxSidecar", "opencodeProxy"},
	} {
		arts := p.artifacts()
		original := arts[sub[0]]
		substitute := map[string]any{}
		for k, v := range arts[sub[1]].(map[string]any) {
			substitute[k] = v
		}
		arts[sub[0]] = substitute
		p.writeManifest()
		_, err := Read(p.root)
		requireFails(t, err, labels[sub[0]].Label+" path must be "+labels[sub[0]].Path)
		require.ErrorContains(t, err, "path must be")
		arts[sub[0]] = original
	}
	p.writeManifest()
	_, err := Read(p.root)
	require.NoError(t, err)
}

func TestB1_TamperedProxyIsDigestMismatch(t *testing.T) {
	p := newPack(t)
	p.write("dist/cli/opencode-app-server-proxy.cjs", "tampered\n")
	_, err := Read(p.root)
	requireFails(t, err, "OpenCode proxy digest mismatch")
	p.write("dist/cli/opencode-app-server-proxy.cjs", proxySrc)
	_, err = Read(p.root)
	require.NoError(t, err)

	require.NoError(t, os.Remove(filepath.Join(p.root, "node_modules", "node", "bin", "node")))
	_, err = Read(p.root)
	requireFails(t, err, "provider Node digest mismatch")
}

func TestB1_ChangedDistFileIsTreeDigestMismatch(t *testing.T) {
	changes := map[string]func(p *pack){
		"added":   func(p *pack) { p.write("dist/cli/transitive-runtime.js", "changed transitive module\n") },
		"changed": func(p *pack) { p.write("dist/lib/runtime.js", "module.exports = 2;\n") },
		"removed": func(p *pack) { require.NoError(t, os.Remove(filepath.Join(p.root, "dist", "lib", "runtime.js"))) },
		"emptydir": func(p *pack) {
			require.NoError(t, os.Mkdir(filepath.Join(p.root, "dist", "empty"), 0o755))
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			p := newPack(t)
			change(p)
			_, err := Read(p.root)
			requireFails(t, err, "provider dist tree digest mismatch")
		})
	}
	t.Run("symlink", func(t *testing.T) {
		p := newPack(t)
		require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(p.root, "dist", "lib", "link")))
		_, err := Read(p.root)
		require.EqualValues(t, failure.RunnerRemoteProviderArtifactIncompatible, failure.CodeOf(err))
		require.ErrorContains(t, err, "unsupported dist entry lib/link")
	})
}

func TestB1_ChecksRunInOrder(t *testing.T) {
	p := newPack(t)
	for _, bad := range []string{"{", `[]`, `{"schema":"x","digest":"y","payload":{},"schema":"z"}`, `{"schema":1,"digest":"y","payload":{}}`, `{"schema":"x","digest":"y"}`} {
		p.write(FileName, bad)
		_, err := Read(p.root)
		requireFails(t, err, "provider-pack.json is unreadable")
	}
	p.write(FileName, strings.Repeat(" ", MaxManifestBytes+1))
	_, err := Read(p.root)
	requireFails(t, err, "provider-pack.json is unreadable")

	pinChanges := map[string]func(){
		"pin":          func() { p.payload["pins"].(map[string]any)["opencode"] = "1.18.18" },
		"extra pin":    func() { p.payload["pins"].(map[string]any)["extra"] = "1" },
		"profile":      func() { p.payload["acpxProfileDigests"].(map[string]any)["codex"] = "sha256:00" },
		"target":       func() { p.payload["target"] = map[string]any{"platform": "linux", "architecture": 64} },
		"revision":     func() { p.payload["runnerSourceRevision"] = strings.Repeat("1", 39) },
		"dirty ok":     func() { p.payload["runnerSourceRevision"] = strings.Repeat("a", 40) + "-dirty" },
		"dist format":  func() { p.payload["distDigest"] = "sha256:XYZ" },
		"schema wrong": func() {},
	}
	for name, change := range pinChanges {
		t.Run(name, func(t *testing.T) {
			p = newPack(t)
			change()
			p.writeManifest()
			if name == "schema wrong" {
				b, _ := json.Marshal(map[string]any{"schema": "remote-provider-pack/v2", "digest": sha(jsCanonical(p.payload)), "payload": p.payload})
				p.write(FileName, string(b))
			}
			_, err := Read(p.root)
			if name == "dirty ok" {
				require.NoError(t, err)
				return
			}
			requireFails(t, err, "provider pack pins or source revision do not match")
		})
	}

	p = newPack(t)
	p.payload["runnerSourceRevision"] = strings.Repeat("2", 40)
	p.writeManifestDigest(sha("something else"))
	_, err = Read(p.root)
	requireFails(t, err, "provider pack manifest digest mismatch")

	for _, bad := range []string{"", "/node_modules/node/bin/node", "node_modules/../node_modules/node/bin/node", "node_modules//node/bin/node", "node_modules\\node", "./pnpm-lock.yaml"} {
		p = newPack(t)
		p.artifacts()["nodeCommand"].(map[string]any)["path"] = bad
		p.writeManifest()
		_, err := Read(p.root)
		requireFails(t, err, "invalid provider Node path")
	}

	p = newPack(t)
	p.payload["bridgeDigest"] = sha("not the bridge")
	p.writeManifest()
	_, err = Read(p.root)
	requireFails(t, err, "provider bridge digest mismatch")

	// An artifact symlink is followed inside the pack but not out of it.
	p = newPack(t)
	require.NoError(t, os.Remove(filepath.Join(p.root, "node_modules", ".bin", "opencode")))
	p.write("node_modules/opencode-ai/bin/opencode", "#!/bin/sh\n")
	require.NoError(t, os.Symlink("../opencode-ai/bin/opencode", filepath.Join(p.root, "node_modules", ".bin", "opencode")))
	_, err = Read(p.root)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(p.root, "node_modules", ".bin", "opencode")))
	outside := filepath.Join(t.TempDir(), "opencode")
	require.NoError(t, os.WriteFile(outside, []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(p.root, "node_modules", ".bin", "opencode")))
	_, err = Read(p.root)
	requireFails(t, err, "OpenCode command digest mismatch")
	_ = bytes.MinRead
}
