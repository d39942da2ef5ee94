// Package confine keeps the processes a gateway launches for a company —
// runnerd and, above all, the provider, which runs arbitrary tool commands —
// away from what is not theirs: the gateway's keys, other sessions' scope
// roots and other companies' workspaces (SPEC T7).
//
// Two mechanisms, alone or together:
//
//   - uid: a gateway running as root starts each company's runners under an
//     unprivileged uid and gid of their own (a configured range, assigned
//     per company once and kept in <state-root>/runner-uids.json), hands
//     the runner's subtrees of the scope root (runner/, the provider home,
//     the workspace) and the company's workspace root over to that uid
//     (mode 0700) before every launch, so ownership follows restored or
//     moved roots, and keeps the scope root itself (0710, the company's
//     group) and its own files there and elsewhere root's, so a runner
//     cannot plant a link where the gateway writes (KeepScopeRoot).
//   - bwrap: the provider runs in a bubblewrap namespace sandbox (mount, PID,
//     IPC, UTS, user and cgroup namespaces; the network is shared): it sees
//     the system directories read-only, its scope root and workspace
//     read-write, its own binary read-only and nothing else — no state root,
//     no other scope, no key. A private PID namespace also keeps it out of
//     other processes' /proc/<pid>/root.
//
// Off loopback the default ("auto") is the strongest available combination;
// a gateway that can confine nothing there refuses to start unless
// -runner-confinement=none says so. On loopback "auto" confines nothing, so
// development stays zero-config.
package confine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Mode is how runners are confined.
type Mode string

// Modes.
const (
	// Auto: on loopback None; off loopback the strongest available
	// (UIDBwrap, UID, Bwrap), or an error.
	Auto     Mode = "auto"
	None     Mode = "none"
	UID      Mode = "uid"
	Bwrap    Mode = "bwrap"
	UIDBwrap Mode = "uid+bwrap"
)

// Modes lists the values -runner-confinement accepts.
var Modes = []Mode{Auto, None, UID, Bwrap, UIDBwrap}

// UsesUID reports whether runners run under their company's uid.
func (m Mode) UsesUID() bool { return m == UID || m == UIDBwrap }

// UsesBwrap reports whether providers run in a bubblewrap sandbox.
func (m Mode) UsesBwrap() bool { return m == Bwrap || m == UIDBwrap }

// Host is what this host can do.
type Host struct {
	// Root: the gateway runs as root, so it can start processes under
	// other uids.
	Root bool
	// Bwrap: a bubblewrap sandbox starts here (as the user the providers
	// will run as); BwrapErr says why not.
	Bwrap    bool
	BwrapErr string
}

// Resolve decides the confinement from the requested mode, where the
// gateway serves and what the host can do. An explicitly requested mode
// the host cannot provide is an error everywhere; "auto" off loopback with
// nothing available is an error that names the way out.
func Resolve(requested Mode, offLoopback bool, h Host) (Mode, error) {
	needRoot := func(m Mode) error {
		if !h.Root {
			return fmt.Errorf("-runner-confinement=%s: starting runners under their own uid needs a gateway running as root (runner_confinement_unavailable)", m)
		}
		return nil
	}
	needBwrap := func(m Mode) error {
		if !h.Bwrap {
			return fmt.Errorf("-runner-confinement=%s: bubblewrap cannot start a sandbox here: %s (runner_confinement_unavailable)", m, h.BwrapErr)
		}
		return nil
	}
	switch requested {
	case None:
		return None, nil
	case UID:
		return UID, needRoot(UID)
	case Bwrap:
		return Bwrap, needBwrap(Bwrap)
	case UIDBwrap:
		if err := needRoot(UIDBwrap); err != nil {
			return UIDBwrap, err
		}
		return UIDBwrap, needBwrap(UIDBwrap)
	case Auto, "":
		switch {
		case !offLoopback:
			return None, nil
		case h.Root && h.Bwrap:
			return UIDBwrap, nil
		case h.Root:
			return UID, nil
		case h.Bwrap:
			return Bwrap, nil
		}
		return None, fmt.Errorf("the gateway serves off loopback but cannot confine its runners: it does not run as root "+
			"and bubblewrap cannot start a sandbox (%s); install bubblewrap and allow unprivileged user namespaces, run it as root, "+
			"or accept unconfined providers with -runner-confinement=none (unsafe: a provider can read the gateway's keys and other "+
			"companies' files) (runner_confinement_unavailable)", h.BwrapErr)
	}
	return None, fmt.Errorf("-runner-confinement=%q: want one of %s", requested, modeList())
}

func modeList() string {
	s := make([]string, len(Modes))
	for i, m := range Modes {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}

// ProbeBwrap starts `bwrap … true` with the sandbox flags providers get, as
// cred (nil: the gateway's own user), and reports whether it works.
func ProbeBwrap(bwrap string, cred *syscall.Credential) (bool, string) {
	if bwrap == "" {
		return false, "bwrap is not installed (Debian package bubblewrap)"
	}
	cmd := exec.Command(bwrap, append(sandboxFlags(cred == nil && os.Geteuid() == 0),
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = "/" // the gateway's own directory may be closed to cred
	if out, err := cmd.CombinedOutput(); err != nil {
		return false, fmt.Sprintf("%s: %v: %s", bwrap, err, strings.TrimSpace(string(out)))
	}
	return true, ""
}

// sandboxFlags are the namespace flags of every sandbox. As root (no uid
// of its own) the sandbox also drops every capability.
func sandboxFlags(root bool) []string {
	f := []string{"--unshare-all", "--share-net"}
	if root {
		f = append(f, "--cap-drop", "ALL")
	}
	return f
}

// SystemDirs are bound read-only into every sandbox (those that exist).
var SystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// within reports whether p is dir or below it (both clean, absolute).
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// searchable refuses a path one of whose ancestors other users cannot
// traverse (o+x): a runner under its own uid could not reach it.
func searchable(p string) error {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (on the way to %s) is mode %o: runners under their own uid cannot traverse it; give it o+x", d, p, fi.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
