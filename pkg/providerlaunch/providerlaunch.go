// Package providerlaunch is the one path from a run's provider (kind,
// agent) to the program that is launched for it (SPEC R10, R11, B1).
//
// A launch profile is named after the provider it serves: "codex",
// "opencode", "acpx-codex", "acpx-claude" ([Name]). The gateway holds one
// [Profile] per configured name (its -<name>-command, -<name>-arg,
// -<name>-version and -<name>-sha256 flags, see [RegisterFlags]) and hands
// runnerd the profile's name (--provider), command and arguments; runnerd
// picks the driver registered under the same name.
//
// Every profile but codex's is pinned: its version must be the one this
// build supports ([Versions]) and every pinned file's SHA-256 must match
// the bytes on disk, checked by [Profile.Verify] before any process is
// started for a run. An unconfigured, unpinned or mismatching profile is
// refused with runner_remote_provider_artifact_incompatible (FailedPrecondition,
// attempt-terminal: the run cannot be launched until an operator acts).
// Codex keeps its historical unpinned -codex-command.
package providerlaunch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
)

// Profile names.
const (
	Codex      = provenv.KindCodex
	OpenCode   = provenv.KindOpenCode
	ACPXCodex  = "acpx-codex"
	ACPXClaude = "acpx-claude"
)

// Names lists the pinned (non-codex) profile names, in flag order.
var Names = []string{OpenCode, ACPXCodex, ACPXClaude}

// Versions are the exact provider versions this build drives, by profile
// name. A profile declaring another version is refused.
var Versions = map[string]string{
	OpenCode: "1.18.17",
	// The ACP agent packages (@agentclientprotocol/codex-acp,
	// claude-agent-acp): the versions observed to load sessions and ask
	// permissions offline (docs/providers.md).
	ACPXCodex:  "2.6.0",
	ACPXClaude: "0.101.0",
}

// Name is the launch profile name of a run's provider: the kind, or
// "acpx-<agent>" for ACPX ("" when p names no kind).
func Name(p *prpv1.Provider) string {
	switch k := p.GetKind(); k {
	case provenv.KindACPX:
		return k + "-" + p.GetAgent()
	default:
		return k
	}
}

// Pin is one pinned file: its path and the lowercase hex SHA-256 of its
// bytes.
type Pin struct {
	Path   string
	SHA256 string
}

// Profile launches one provider.
type Profile struct {
	Name    string
	Command string
	Args    []string
	// Version is the declared provider version (must equal
	// Versions[Name]).
	Version string
	// Pins are checked before every launch; at least one is required.
	Pins []Pin
	// HomeTemplate is a directory of launch-only provider files (opencode:
	// opencode.json with the provider definitions) the driver copies into
	// the provider's home before each start (runnerd
	// --provider-home-template); they never travel in a backup.
	HomeTemplate string
}

// Configured reports whether the profile names a command.
func (p Profile) Configured() bool { return p.Command != "" }

func refuse(format string, args ...any) error {
	return failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible, format, args...)
}

// Verify checks the profile's pins: the declared version is the supported
// one and every pinned file hashes to its pin. It starts no process.
func (p Profile) Verify() error {
	if !p.Configured() {
		return refuse("provider %q is not configured on this gateway (-%s-command)", p.Name, p.Name)
	}
	want, known := Versions[p.Name]
	switch {
	case !known:
		return refuse("provider %q has no pinned version in this build", p.Name)
	case p.Version == "":
		return refuse("provider %q is unpinned: -%s-version %s is required", p.Name, p.Name, want)
	case p.Version != want:
		return refuse("provider %q version %s is not the pinned %s", p.Name, p.Version, want)
	case len(p.Pins) == 0:
		return refuse("provider %q is unpinned: -%s-sha256 is required", p.Name, p.Name)
	}
	for _, pin := range p.Pins {
		got, err := hashes.sum(pin.Path)
		if err != nil {
			return refuse("provider %q pinned file %s: %v", p.Name, pin.Path, err)
		}
		if got != pin.SHA256 {
			return refuse("provider %q pinned file %s digest mismatch (sha256 %s, pinned %s)", p.Name, pin.Path, got, pin.SHA256)
		}
	}
	return nil
}

var hexSHA = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ParsePin parses a -<name>-sha256 value: "HEX" (pins command) or
// "PATH=HEX"; HEX may carry a "sha256:" prefix.
func ParsePin(v, command string) (Pin, error) {
	path, sum := command, v
	if i := strings.LastIndexByte(v, '='); i >= 0 {
		path, sum = v[:i], v[i+1:]
	}
	sum = strings.ToLower(strings.TrimPrefix(sum, "sha256:"))
	if !hexSHA.MatchString(sum) {
		return Pin{}, fmt.Errorf("pin %q: want [PATH=][sha256:]<64 hex digits>", v)
	}
	if path == "" {
		return Pin{}, fmt.Errorf("pin %q names no file (and no command is set)", v)
	}
	return Pin{Path: path, SHA256: sum}, nil
}

// FileSHA256 returns the lowercase hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashCache remembers a file's digest while its identity and change time
// stay the same, so a 180 MB provider binary is not re-read on every
// launch; any write, rename over or chmod changes ctime and forces a
// re-read.
type hashCache struct {
	mu sync.Mutex
	m  map[string]cachedSum
}

type cachedSum struct {
	dev, ino  uint64
	size      int64
	mtim, ctm syscall.Timespec
	sum       string
}

var hashes = &hashCache{m: map[string]cachedSum{}}

func (c *hashCache) sum(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileSHA256(abs)
	}
	key := cachedSum{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtim: st.Mtim, ctm: st.Ctim}
	c.mu.Lock()
	if e, ok := c.m[abs]; ok && e.dev == key.dev && e.ino == key.ino && e.size == key.size && e.mtim == key.mtim && e.ctm == key.ctm {
		c.mu.Unlock()
		return e.sum, nil
	}
	c.mu.Unlock()
	s, err := FileSHA256(abs)
	if err != nil {
		return "", err
	}
	key.sum = s
	c.mu.Lock()
	c.m[abs] = key
	c.mu.Unlock()
	return s, nil
}

// Set is the gateway's launch profiles by name.
type Set map[string]Profile

// For returns the profile of a run's provider, verified. Codex is not
// handled here (it keeps the gateway's -codex-command).
func (s Set) For(p *prpv1.Provider) (Profile, error) {
	name := Name(p)
	if !slices.Contains(Names, name) {
		return Profile{}, refuse("provider %q has no launch profile in this build", name)
	}
	prof, ok := s[name]
	if !ok {
		prof = Profile{Name: name}
	}
	if err := prof.Verify(); err != nil {
		return Profile{}, err
	}
	return prof, nil
}
