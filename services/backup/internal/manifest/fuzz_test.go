package manifest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-run/tether/pkg/failure"
)

// FuzzManifest parses arbitrary manifest bytes (seed corpus in
// testdata/fuzz/FuzzManifest). It must never panic; every refusal is
// failure.RunnerHarnessBackupManifestInvalid; an accepted manifest survives a canonical round trip
// with the same digest.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			if failure.CodeOf(err) != failure.RunnerHarnessBackupManifestInvalid {
				t.Fatalf("unexpected code: %v", err)
			}
			return
		}
		d1, err := m.Digest()
		if err != nil {
			t.Fatalf("digest of an accepted manifest: %v", err)
		}
		canon, err := m.CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseManifest(canon)
		if err != nil {
			if len(canon) > MaxManifestBytes {
				return
			}
			t.Fatalf("canonical form does not parse: %v\n%s", err, canon)
		}
		if d2, _ := back.Digest(); d2 != d1 {
			t.Fatalf("digest changed across a round trip: %s vs %s", d1, d2)
		}
		_ = m.MatchesIdentity(Expectation{Execution: backupExecution(), RunnerInstanceID: "runner-1"})
	})
}

// TestWriteFuzzSeeds regenerates the committed seed corpus when
// TETHER_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("TETHER_WRITE_SEEDS") != "1" {
		t.Skip("set TETHER_WRITE_SEEDS=1 to rewrite testdata/fuzz/FuzzManifest")
	}
	_, m := writeBackup(t, t.TempDir(), "current")
	valid, err := m.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	m.Archive = &ArchiveInfo{SHA256: m.Directories[0].SHA256, Bytes: 10240, ExpandedBytes: 24, Entries: 5}
	m.CheckpointID, m.SessionScope = "0123456789abcdef", strings.Repeat("ab", 32)
	withArchive, _ := m.CanonicalJSON()
	seeds := map[string]string{
		"valid":         string(valid),
		"with_archive":  string(withArchive),
		"unknown_field": strings.Replace(string(valid), `"schema"`, `"extra":1,"schema"`, 1),
		"dup_dir":       strings.Replace(string(valid), `"name":"codex-home"`, `"name":"runner"`, 1),
		"bad_time":      strings.Replace(string(valid), `2026-08-26T00:00:00.000Z`, `yesterday`, 1),
		"numbers":       strings.Replace(string(valid), `"approvalPolicy":"never"`, `"approvalPolicy":1e999`, 1),
	}
	for name, s := range seeds {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(s) + ")\n"
		if err := os.WriteFile(filepath.Join("testdata", "fuzz", "FuzzManifest", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
