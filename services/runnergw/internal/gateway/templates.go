package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/safefs"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// Provider home templates are the launch-only files (credentials such as
// codex's auth.json, an OpenCode opencode.json with provider keys) a
// provider finds in its home: they never travel in a backup, so the
// gateway copies them in before every launch (SPEC B2, T3). They are per
// company: -provider-home-templates DIR holds DIR/<company_id>/ for each
// company (codex's auth.json and config.toml at its top, a pinned
// provider's files in DIR/<company_id>/<provider>/), and DIR/_default/
// for companies without their own, when the operator puts one there. A
// launch takes the most specific template that exists — the company's,
// else _default, else the provider's shared per-gateway flag
// (-codex-home-template, -<provider>-home-template) when one is given —
// and never another company's. With none, the provider gets no launch
// files, and what an earlier launch copied is removed.

// DefaultHomeTemplate is the directory of -provider-home-templates that
// companies without a template of their own get.
const DefaultHomeTemplate = "_default"

// providerTemplateDir is where, inside a scope root, the gateway puts the
// company's template of a pinned provider for runnerd to read
// (--provider-home-template); never in a checkpoint.
const providerTemplateDir = durable.ProviderTemplateDir

// maxTemplateFiles bounds the files of one pinned provider's template.
const maxTemplateFiles = 32

// validTemplateSegment reports whether name can name a directory of
// -provider-home-templates: one clean path segment.
func validTemplateSegment(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00") && len(name) <= 255
}

// realDir reports whether p exists as a directory, not a link to one; a
// link or a non-directory is an error.
func realDir(p string) (bool, error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
		return false, failure.New(codes.FailedPrecondition, failure.KeyFileUnsafe,
			"provider home template %s is a symlink or not a directory", p)
	}
	return true, nil
}

// CheckProviderHomeTemplates validates -provider-home-templates at startup:
// a real directory whose entries are real directories named by a company
// id (or _default), whose template files follow the key-file rule (SPEC
// S3: regular, not a link, the gateway user's, mode 0600 or stricter).
func CheckProviderHomeTemplates(dir string) error {
	if dir == "" {
		return nil
	}
	if ok, err := realDir(dir); err != nil || !ok {
		return fmt.Errorf("-provider-home-templates %s is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !validTemplateSegment(e.Name()) {
			return fmt.Errorf("-provider-home-templates: %s cannot name a company", p)
		}
		if _, err := realDir(p); err != nil {
			return fmt.Errorf("-provider-home-templates: %w", err)
		}
		if err := CheckCodexHomeTemplate(p); err != nil {
			return fmt.Errorf("-provider-home-templates: %w", err)
		}
	}
	return nil
}

// companyTemplate returns the template directory of company for a
// provider: sub "" is codex's (the company directory itself), else the
// pinned provider's subdirectory. shared is the provider's per-gateway
// template flag. It returns "" when none applies.
func (g *Gateway) companyTemplate(company, sub, shared string) (string, error) {
	root := g.cfg.ProviderHomeTemplates
	if root == "" {
		return shared, nil
	}
	if !validTemplateSegment(company) || company == DefaultHomeTemplate {
		return "", failure.New(codes.FailedPrecondition, failure.KeyFileUnsafe,
			"company %q cannot name a provider home template", company)
	}
	for _, c := range []string{company, DefaultHomeTemplate} {
		p := filepath.Join(root, c)
		ok, err := realDir(p)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		if sub == "" {
			return p, nil
		}
		p = filepath.Join(p, sub)
		if ok, err := realDir(p); err != nil || ok {
			return p, err
		}
	}
	return shared, nil
}

// readTemplateFile reads one launch-only file of a template by the key-file
// rule; a missing file is (nil, nil).
func readTemplateFile(template, name string) ([]byte, error) {
	b, err := keyfile.Read(filepath.Join(template, name))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if failure.CodeOf(err) == failure.KeyFileUnsafe || failure.CodeOf(err) == failure.KeyFileInvalid {
		return nil, err
	}
	if err != nil {
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerLocalConnectFailed, "reading the provider home template: %v", err)
	}
	return b, nil
}

// materializeCodexHome copies the template's launch-only files into the
// scope's codex home (0600, atomically, following no link below the state
// root), replacing what a previous launch left: the template is their
// only source. With prune (per-company templates), a file the template
// lacks is removed from the home.
func materializeCodexHome(template, stateDir string, prune bool) error {
	if template == "" && !prune {
		return nil
	}
	home, err := openScopeDir(stateDir, durable.CodexHomeDir, true)
	if err != nil {
		return scopeWriteError(err, "opening the codex home")
	}
	defer home.Close()
	for _, name := range templateFiles {
		var b []byte
		if template != "" {
			if b, err = readTemplateFile(template, name); err != nil {
				return err
			}
		}
		if b == nil {
			if prune {
				if err := safefs.Remove(home, name); err != nil {
					return scopeWriteError(err, "removing a stale "+name)
				}
			}
			continue
		}
		if err := safefs.WriteFile(home, name, b, 0o600); err != nil {
			return scopeWriteError(err, "writing "+name)
		}
	}
	return nil
}

// materializeProviderTemplate copies a pinned provider's company template
// (its regular files, by the key-file rule, at most maxTemplateFiles) into
// <scope>/provider-template, which replaces its previous content, and
// returns that directory for runnerd's --provider-home-template.
func materializeProviderTemplate(template, stateDir string) (string, error) {
	dir, err := openScopeDir(stateDir, providerTemplateDir, true)
	if err != nil {
		return "", scopeWriteError(err, "opening the provider template directory")
	}
	defer dir.Close()
	old, err := dir.Readdirnames(-1)
	if err != nil {
		return "", scopeWriteError(err, "listing the provider template directory")
	}
	entries, err := os.ReadDir(template)
	if err != nil {
		return "", failure.Wrap(err, codes.Internal, failure.RunnerLocalConnectFailed, "reading the provider home template: %v", err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() || e.Type()&fs.ModeSymlink != 0 {
			names = append(names, e.Name())
		}
	}
	if len(names) > maxTemplateFiles {
		return "", failure.New(codes.FailedPrecondition, failure.KeyFileInvalid,
			"provider home template %s holds %d files; at most %d", template, len(names), maxTemplateFiles)
	}
	for _, name := range old {
		if !slices.Contains(names, name) {
			if err := safefs.Remove(dir, name); err != nil {
				return "", scopeWriteError(err, "removing a stale "+name)
			}
		}
	}
	for _, name := range names {
		b, err := readTemplateFile(template, name)
		if err != nil {
			return "", err
		}
		if err := safefs.WriteFile(dir, name, b, 0o600); err != nil {
			return "", scopeWriteError(err, "writing "+name)
		}
	}
	return filepath.Join(stateDir, providerTemplateDir), nil
}

// scopeWriteError is a failed gateway write under a scope root: a link in
// the way is runner_state_directory_unsafe (the runner, not the gateway,
// put it there), anything else an I/O failure.
func scopeWriteError(err error, what string) error {
	if safefs.IsLink(err) {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerStateDirectoryUnsafe, "%s: %v", what, err)
	}
	return failure.Wrap(err, codes.Internal, failure.RunnerLocalConnectFailed, "%s: %v", what, err)
}

// openScopeDir opens sub (relative, "" for the root itself) of the scope
// root scopeDir, following no link below the state root: the gateway's
// writes there never land elsewhere, whatever a runner put in its
// subtrees (SPEC T7).
func openScopeDir(scopeDir, sub string, create bool) (*os.File, error) {
	return safefs.OpenDir(filepath.Dir(scopeDir), filepath.Join(filepath.Base(scopeDir), sub), create, 0o700)
}

// writeScopeFile replaces scopeDir/sub/name (0600) atomically, following
// no link.
func writeScopeFile(scopeDir, sub, name string, b []byte) error {
	d, err := openScopeDir(scopeDir, sub, false)
	if err != nil {
		return err
	}
	defer d.Close()
	return safefs.WriteFile(d, name, b, 0o600)
}

// readScopeFile reads scopeDir/sub/name, at most max bytes, following no
// link.
func readScopeFile(scopeDir, sub, name string, max int64) ([]byte, error) {
	d, err := openScopeDir(scopeDir, sub, false)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return safefs.ReadFile(d, name, max)
}

// runnerdLog is runnerd's log in the scope root (the gateway opens it and
// hands runnerd the descriptor).
const runnerdLog = "runnerd.log"

// openScopeLog opens the scope's runnerd log for appending: a link there
// or a hard-linked file is refused, never followed.
func openScopeLog(scopeDir string) (*os.File, error) {
	d, err := openScopeDir(scopeDir, "", false)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return safefs.OpenAppend(d, runnerdLog, 0o600)
}
