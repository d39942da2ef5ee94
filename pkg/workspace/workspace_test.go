package workspace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-run/tether/pkg/failure"
)

func TestT6_CheckConfinesCwdToTheCompanyRoot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		root, company, cwd string
		ok                 bool
	}{
		{"/w", "acme", "", true},
		{"/w", "acme", "/w/acme", true},
		{"/w", "acme", "/w/acme/repo/sub", true},
		{"/w", "acme", "/any/path", false},
		{"/w", "acme", "/w/globex/repo", false},
		{"/w", "acme", "/w/acme/../globex", false},
		{"/w", "acme", "/w/acme/./repo", false},
		{"/w", "acme", "/w/acme/", false},
		{"/w", "acme", "/w/acmecorp", false},
		{"/w", "acme", "w/acme/repo", false},
		{"/w", "acme", "/w", false},
		{"/w", "..", "/w/../x", false},
		{"rel", "acme", "rel/acme", false},
	} {
		err := Check(tc.root, tc.company, tc.cwd)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q, %q, %q) = %v, want ok=%v", tc.root, tc.company, tc.cwd, err, tc.ok)
		}
		if err != nil && failure.CodeOf(err) != failure.WorkspaceOutsideRoot {
			t.Errorf("Check(%q, %q, %q) code %q", tc.root, tc.company, tc.cwd, failure.CodeOf(err))
		}
	}
}

func TestT6_ConfineRefusesASymlinkOutOfTheCompanyRoot(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "workspaces")
	outsideDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "acme"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outsideDir, filepath.Join(root, "acme", "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "acme", "real"), filepath.Join(root, "acme", "inside")); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{
		filepath.Join(root, "acme", "escape"),
		filepath.Join(root, "acme", "escape", "new", "dir"),
	} {
		if _, err := Confine(root, "acme", cwd); failure.CodeOf(err) != failure.WorkspaceOutsideRoot {
			t.Fatalf("Confine(%s) = %v, want %s", cwd, err, failure.WorkspaceOutsideRoot)
		}
	}
	if entries, _ := os.ReadDir(outsideDir); len(entries) != 0 {
		t.Fatalf("Confine created %v outside the root", entries)
	}
	// A link that stays inside, and a fresh directory, are fine (created 0700).
	for _, cwd := range []string{filepath.Join(root, "acme", "repo", "sub"), filepath.Join(root, "globex")} {
		company := "acme"
		if filepath.Base(cwd) == "globex" {
			company = "globex"
		}
		got, err := Confine(root, company, cwd)
		if err != nil || got != cwd {
			t.Fatalf("Confine(%s) = %q, %v", cwd, got, err)
		}
		if fi, err := os.Stat(cwd); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v", cwd, fi.Mode(), err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "acme", "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Confine(root, "acme", filepath.Join(root, "acme", "inside")); err != nil {
		t.Fatal(err)
	}
}
