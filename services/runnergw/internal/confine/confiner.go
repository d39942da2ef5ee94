package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/workspace"
)

// UIDFile is the per-company uid assignment in the state root.
const UIDFile = "runner-uids.json"

// Config configures a Confiner.
type Config struct {
	Mode Mode
	// StateRoot and WorkspaceRoot are the gateway's (-state-root,
	// -workspace-root).
	StateRoot, WorkspaceRoot string
	// UIDBase and UIDCount are the uid (= gid) range companies get uids
	// from (UID modes).
	UIDBase, UIDCount int
	// BwrapPath is the bubblewrap binary (Bwrap modes).
	BwrapPath string
	// ReadOnly are extra paths bound read-only into each sandbox (what a
	// provider needs outside the system directories).
	ReadOnly []string
	// Hidden are the gateway's secrets (key files, TLS keys, templates):
	// one under a directory a sandbox binds is masked there.
	Hidden []string
	// Executables are the binaries runners under their own uid start
	// (runnerd, provider commands): checked reachable at New.
	Executables []string
}

// Confiner applies a Mode to runner launches. A nil Confiner confines
// nothing.
type Confiner struct {
	cfg  Config
	mu   sync.Mutex
	uids map[string]int // company -> uid
}

// uidTable is UIDFile's document.
type uidTable struct {
	Companies map[string]int `json:"companies"`
}

// New prepares the state root for cfg.Mode: for the UID modes it makes the
// state and workspace roots traversable (0711, not listable) by the
// runners' uids, checks every path a runner must reach is, and loads the
// uid assignments.
func New(cfg Config) (*Confiner, error) {
	if cfg.WorkspaceRoot == "" {
		cfg.WorkspaceRoot = workspace.DefaultRoot
	}
	c := &Confiner{cfg: cfg, uids: map[string]int{}}
	if !cfg.Mode.UsesUID() {
		return c, nil
	}
	if cfg.UIDBase <= 0 || cfg.UIDCount <= 0 || cfg.UIDBase+cfg.UIDCount > 1<<31-1 {
		return nil, fmt.Errorf("-runner-uid-base %d / -runner-uid-count %d: want a positive range of uids", cfg.UIDBase, cfg.UIDCount)
	}
	// The roots are searchable (x), not readable, by the per-company uids:
	// each reaches its own scope below by name, and lists nothing.
	for _, d := range []string{cfg.StateRoot, cfg.WorkspaceRoot} {
		if err := os.MkdirAll(d, 0o711); err != nil { //nolint:gosec // 0o711 on purpose, see above
			return nil, err
		}
		if err := os.Chmod(d, 0o711); err != nil { //nolint:gosec // 0o711 on purpose, see above
			return nil, err
		}
		if err := searchable(d); err != nil {
			return nil, err
		}
	}
	for _, p := range cfg.Executables {
		if err := searchable(p); err != nil {
			return nil, err
		}
	}
	raw, err := os.ReadFile(filepath.Join(cfg.StateRoot, UIDFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		var t uidTable
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("%s: %w", UIDFile, err)
		}
		for company, uid := range t.Companies {
			// An assignment outside the configured range is dropped: the
			// company gets a new uid and its roots follow at the next launch.
			if uid >= cfg.UIDBase && uid < cfg.UIDBase+cfg.UIDCount {
				c.uids[company] = uid
			}
		}
	}
	return c, nil
}

// Mode is the applied mode.
func (c *Confiner) Mode() Mode {
	if c == nil {
		return None
	}
	return c.cfg.Mode
}

// UIDOf returns the company's uid, assigning the lowest free one of the
// range on first use and recording it before it is used.
func (c *Confiner) UIDOf(company string) (int, error) {
	if company == "" {
		return 0, errors.New("a runner without a company cannot get a uid of its own")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if uid, ok := c.uids[company]; ok {
		return uid, nil
	}
	used := make(map[int]bool, len(c.uids))
	for _, u := range c.uids {
		used[u] = true
	}
	uid := -1
	for i := 0; i < c.cfg.UIDCount; i++ {
		if !used[c.cfg.UIDBase+i] {
			uid = c.cfg.UIDBase + i
			break
		}
	}
	if uid < 0 {
		return 0, fmt.Errorf("every uid of -runner-uid-base %d / -runner-uid-count %d is taken: no uid for company %s", c.cfg.UIDBase, c.cfg.UIDCount, company)
	}
	c.uids[company] = uid
	t := uidTable{Companies: c.uids}
	b, err := json.MarshalIndent(t, "", "  ")
	if err == nil {
		err = atomicfile.Write(c.cfg.StateRoot, UIDFile, b, 0o600)
	}
	if err != nil {
		delete(c.uids, company)
		return 0, fmt.Errorf("recording the uid of company %s: %w", company, err)
	}
	return uid, nil
}

// Runner prepares the launch of a company's runnerd on stateDir with
// workspace and returns the credential to start it with (nil: the
// gateway's own). In the UID modes the scope root stays the gateway's: it
// becomes owned by the gateway's user and the company's gid, mode 0710 (the
// company's runner traverses it, cannot list it, and cannot create, rename
// or replace anything in it), and so does every entry of it that is not
// the runner's (control-plane/, the launch record, the checkpoint mark,
// runnerd's log, archived state), so a runner cannot plant a link where
// the gateway writes as root. Only the runner's subtrees — the entries of
// stateDir named in owned that exist, each in need (created 0700 when
// missing), and a workspace inside the scope root — and the company's
// workspace root for a workspace outside it are handed over to the
// company's uid, mode 0700.
func (c *Confiner) Runner(company, stateDir, ws string, owned, need []string) (*syscall.Credential, error) {
	if c == nil || !c.cfg.Mode.UsesUID() {
		return nil, nil
	}
	uid, err := c.UIDOf(company)
	if err != nil {
		return nil, err
	}
	owned = append(append([]string(nil), owned...), need...)
	var roots []string
	croot := workspace.CompanyRoot(c.cfg.WorkspaceRoot, company)
	if ws != "" && !within(stateDir, ws) {
		if !within(croot, ws) {
			return nil, fmt.Errorf("workspace %s is neither in the scope root nor in company %s's workspace root %s", ws, company, croot)
		}
		roots = append(roots, croot)
	} else if ws != "" && ws != stateDir {
		top := strings.SplitN(strings.TrimPrefix(ws, strings.TrimSuffix(stateDir, "/")+"/"), "/", 2)[0]
		owned, need = append(owned, top), append(need, top)
	} else if ws == stateDir {
		return nil, fmt.Errorf("workspace %s is the scope root itself: the runner cannot own it", ws)
	}
	if err := KeepScopeRoot(stateDir, uid, owned, need); err != nil {
		return nil, fmt.Errorf("keeping the scope root %s the gateway's: %w", stateDir, err)
	}
	for _, r := range roots {
		if err := HandOver(r, uid, uid); err != nil {
			return nil, fmt.Errorf("handing %s over to uid %d: %w", r, uid, err)
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}, nil
}

// Provider returns the command and arguments that start the provider
// command (args) for the runner on stateDir with workspace: unchanged, or
// inside a bubblewrap sandbox that binds the system directories and the
// provider binary read-only, the scope root and workspace read-write, and
// masks the gateway's secrets.
func (c *Confiner) Provider(stateDir, ws, command string, args []string) (string, []string, error) {
	if c == nil || !c.cfg.Mode.UsesBwrap() {
		return command, args, nil
	}
	bin, err := exec.LookPath(command)
	if err != nil {
		return "", nil, fmt.Errorf("provider command %s: %w", command, err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", nil, err
	}
	a := sandboxFlags(os.Geteuid() == 0 && !c.cfg.Mode.UsesUID())
	var bound []string
	for _, d := range SystemDirs {
		if _, err := os.Stat(d); err == nil {
			a = append(a, "--ro-bind", d, d)
			bound = append(bound, d)
		}
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp")
	// Secrets inside a bound directory are masked: a directory by an empty
	// tmpfs, a file by /dev/null. So is anything of the gateway's state
	// root there.
	hidden := append([]string{c.cfg.StateRoot, c.cfg.WorkspaceRoot}, c.cfg.Hidden...)
	sort.Strings(hidden)
	for _, h := range hidden {
		if h == "" || !filepath.IsAbs(h) || !underAny(bound, h) {
			continue
		}
		fi, err := os.Stat(h)
		switch {
		case err != nil:
		case fi.IsDir():
			a = append(a, "--tmpfs", h)
		default:
			a = append(a, "--ro-bind", "/dev/null", h)
		}
	}
	a = append(a, "--bind", stateDir, stateDir)
	if ws != "" && !within(stateDir, ws) {
		a = append(a, "--bind", ws, ws)
	}
	if !underAny(bound, bin) {
		a = append(a, "--ro-bind", bin, bin)
	}
	for _, p := range c.cfg.ReadOnly {
		a = append(a, "--ro-bind", p, p)
	}
	a = append(a, "--")
	a = append(a, bin)
	return c.cfg.BwrapPath, append(a, args...), nil
}

func underAny(dirs []string, p string) bool {
	for _, d := range dirs {
		if within(d, p) {
			return true
		}
	}
	return false
}
