// Package workspace confines a run's workspace.cwd to the workspace root of
// its company (SPEC T6): <root>/<company_id>/... . The executor checks the
// path's syntax at submit (Check); the gateway, which creates the directory
// and launches the provider in it, also resolves it (Confine), so a symbolic
// link cannot lead outside.
package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// DefaultRoot is the workspace root of executors and gateways unless
// -workspace-root says otherwise.
const DefaultRoot = "/var/lib/tether/workspaces"

// CompanyRoot is the directory a company's workspaces live in.
func CompanyRoot(root, company string) string { return filepath.Join(root, company) }

// Check refuses a cwd that is not a clean absolute path inside
// CompanyRoot(root, company) (the company's root itself included); an empty
// cwd (the runner assigns one) passes.
func Check(root, company, cwd string) error {
	if cwd == "" {
		return nil
	}
	croot := CompanyRoot(root, company)
	switch {
	case !filepath.IsAbs(root):
		return outside("the workspace root %q is not absolute", root)
	case company == "" || strings.ContainsAny(company, "/\x00") || company == "." || company == "..":
		return outside("company %q cannot name a workspace directory", company)
	case !filepath.IsAbs(cwd) || filepath.Clean(cwd) != cwd || strings.ContainsRune(cwd, 0):
		return outside("workspace.cwd %q must be a clean absolute path", cwd)
	case !within(croot, cwd):
		return outside("workspace.cwd %q is outside the workspace root of company %s (%s)", cwd, company, croot)
	}
	return nil
}

// Confine checks cwd like Check, creates the company root and cwd (0700) and
// returns cwd once its resolved path (every symbolic link followed) is still
// inside the company root's resolved path. It resolves before it creates
// anything below the company root, so a link does not make it create a
// directory elsewhere.
func Confine(root, company, cwd string) (string, error) {
	if err := Check(root, company, cwd); err != nil {
		return "", err
	}
	croot := CompanyRoot(root, company)
	if err := os.MkdirAll(croot, 0o700); err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.WorkspaceOutsideRoot, "creating the workspace root %s: %v", croot, err)
	}
	realRoot, err := filepath.EvalSymlinks(croot)
	if err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.WorkspaceOutsideRoot, "resolving the workspace root %s: %v", croot, err)
	}
	existing, err := deepestExisting(cwd)
	if err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.WorkspaceOutsideRoot, "resolving %s: %v", cwd, err)
	}
	if !within(realRoot, existing) {
		return "", outside("workspace.cwd %q resolves to %s, outside the workspace root of company %s", cwd, existing, company)
	}
	if err := os.MkdirAll(cwd, 0o700); err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.WorkspaceOutsideRoot, "creating %s: %v", cwd, err)
	}
	resolved, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.WorkspaceOutsideRoot, "resolving %s: %v", cwd, err)
	}
	if !within(realRoot, resolved) {
		return "", outside("workspace.cwd %q resolves to %s, outside the workspace root of company %s", cwd, resolved, company)
	}
	return cwd, nil
}

// deepestExisting resolves the longest existing prefix of the clean path p.
func deepestExisting(p string) (string, error) {
	for q := p; ; q = filepath.Dir(q) {
		r, err := filepath.EvalSymlinks(q)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, os.ErrNotExist) || q == filepath.Dir(q) {
			return "", err
		}
	}
}

// within reports whether p is dir or below it (both clean).
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

func outside(format string, args ...any) error {
	return failure.New(codes.InvalidArgument, failure.WorkspaceOutsideRoot, format, args...)
}
