package providerpack

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

// FuzzProviderPack parses arbitrary provider-pack.json bytes (seed corpus in
// testdata/fuzz/FuzzProviderPack). It must never panic; every refusal is
// runner_remote_provider_artifact_incompatible; an accepted manifest's digest
// is the canonical hash of its payload.
func FuzzProviderPack(f *testing.F) {
	f.Add([]byte(`{"schema":"tether-runner/remote-provider-pack/v1","digest":"sha256:00","payload":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			if failure.CodeOf(err) != failure.RunnerRemoteProviderArtifactIncompatible {
				t.Fatalf("unexpected code: %v", err)
			}
			return
		}
		if d, err := digest.CanonicalHash(m.Payload); err != nil || d != m.Digest {
			t.Fatalf("accepted a manifest whose digest %q is not its payload's %q (%v)", m.Digest, d, err)
		}
	})
}

// TestWriteFuzzSeeds regenerates the committed seed corpus when
// TETHER_WRITE_SEEDS=1 (go test -run TestWriteFuzzSeeds ./internal/providerpack).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("TETHER_WRITE_SEEDS") != "1" {
		t.Skip("set TETHER_WRITE_SEEDS=1 to rewrite testdata/fuzz/FuzzProviderPack")
	}
	p := newPack(t)
	valid, err := os.ReadFile(filepath.Join(p.root, FileName))
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string]string{
		"valid":         string(valid),
		"tether_schema": strings.Replace(string(valid), CompatSchema, Schema, 1),
		"bad_digest":    strings.Replace(string(valid), `"digest":"sha256:`, `"digest":"sha256:0`, 1),
		"dup_key":       `{"schema":"a","schema":"b","digest":"d","payload":{}}`,
		"not_object":    `["schema"]`,
		"deep":          strings.Repeat("[", 100) + strings.Repeat("]", 100),
		"numbers":       `{"schema":"tether-runner/remote-provider-pack/v1","digest":"sha256:1","payload":{"n":[1e400,-0,1.5]}}`,
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzProviderPack")
	for name, s := range seeds {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(s) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
