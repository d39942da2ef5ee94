package confine

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestT7_ResolveConfinement(t *testing.T) {
	t.Parallel()
	root := Host{Root: true, Bwrap: true}
	rootNoBwrap := Host{Root: true, BwrapErr: "no bwrap"}
	user := Host{Bwrap: true}
	nothing := Host{BwrapErr: "user namespaces are disabled"}
	for _, tc := range []struct {
		name      string
		requested Mode
		off       bool
		host      Host
		want      Mode
		err       string
	}{
		{"loopback auto confines nothing (zero-config development)", Auto, false, root, None, ""},
		{"loopback default", "", false, nothing, None, ""},
		{"off loopback as root with bwrap: both", Auto, true, root, UIDBwrap, ""},
		{"off loopback as root without bwrap: uid", Auto, true, rootNoBwrap, UID, ""},
		{"off loopback unprivileged: bwrap", Auto, true, user, Bwrap, ""},
		{"off loopback with nothing available: refused", Auto, true, nothing, None, "-runner-confinement=none"},
		{"an explicit none off loopback", None, true, nothing, None, ""},
		{"uid needs root", UID, false, user, UID, "needs a gateway running as root"},
		{"bwrap needs a working bwrap", Bwrap, false, rootNoBwrap, Bwrap, "no bwrap"},
		{"uid+bwrap needs both", UIDBwrap, true, user, UIDBwrap, "root"},
		{"explicit uid on loopback", UID, false, root, UID, ""},
		{"unknown", "chroot", true, root, None, "want one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.requested, tc.off, tc.host)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestT7_EachCompanyGetsAUIDOfItsOwnKeptAcrossRestarts(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("uid confinement needs root")
	}
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o711))
	cfg := Config{Mode: UID, StateRoot: filepath.Join(dir, "state"), WorkspaceRoot: filepath.Join(dir, "ws"), UIDBase: 300000, UIDCount: 2}
	c, err := New(cfg)
	require.NoError(t, err)
	acme, err := c.UIDOf("acme")
	require.NoError(t, err)
	globex, err := c.UIDOf("globex")
	require.NoError(t, err)
	require.Equal(t, []int{300000, 300001}, []int{acme, globex})
	_, err = c.UIDOf("initech")
	require.ErrorContains(t, err, "every uid")

	// A restarted gateway keeps the assignments, whatever order companies
	// come back in.
	c2, err := New(cfg)
	require.NoError(t, err)
	g2, err := c2.UIDOf("globex")
	require.NoError(t, err)
	require.Equal(t, globex, g2)
	fi, err := os.Stat(filepath.Join(cfg.StateRoot, UIDFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	for _, d := range []string{cfg.StateRoot, cfg.WorkspaceRoot} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o711), fi.Mode().Perm(), "%s: traversable, not listable", d)
	}
}

func TestT7_HandOverFollowsNoLinkAndLeavesHardLinkedFilesAlone(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "scope")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a", "b", "f"), []byte("x"), 0o600))
	secret := filepath.Join(dir, "gateway.key")
	require.NoError(t, os.WriteFile(secret, []byte("k"), 0o600))
	outside := filepath.Join(dir, "outside")
	require.NoError(t, os.Mkdir(outside, 0o700))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "dirlink")))
	require.NoError(t, os.Symlink(secret, filepath.Join(root, "keylink")))
	require.NoError(t, os.Link(secret, filepath.Join(root, "a", "hardlink")))

	require.NoError(t, HandOver(root, 300100, 300100))
	for _, p := range []string{root, filepath.Join(root, "a"), filepath.Join(root, "a", "b"), filepath.Join(root, "a", "b", "f"),
		filepath.Join(root, "dirlink"), filepath.Join(root, "keylink")} {
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(p, &st))
		require.EqualValues(t, 300100, st.Uid, p)
		require.EqualValues(t, 300100, st.Gid, p)
	}
	for _, p := range []string{secret, outside} {
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(p, &st))
		require.Zero(t, st.Uid, "%s changed hands through a link", p)
	}
	fi, err := os.Stat(root)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	require.NoError(t, HandOver(filepath.Join(dir, "missing"), 300100, 300100))
}

func TestT7_TheSandboxBindsOnlyTheRunnersOwnRootsAndMasksSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "provider")
	require.NoError(t, os.MkdirAll(filepath.Dir(bin), 0o755))
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	c, err := New(Config{Mode: Bwrap, BwrapPath: "/usr/bin/bwrap", StateRoot: filepath.Join(dir, "state"),
		WorkspaceRoot: filepath.Join(dir, "ws"), Hidden: []string{"/etc/hostname", "", "relative"}})
	require.NoError(t, err)
	scopeRoot := filepath.Join(dir, "state", "s1")
	ws := filepath.Join(dir, "ws", "acme", "repo")
	cmd, args, err := c.Provider(scopeRoot, ws, bin, []string{"app-server", "--x"})
	require.NoError(t, err)
	require.Equal(t, "/usr/bin/bwrap", cmd)
	line := strings.Join(args, " ")
	require.Contains(t, line, "--unshare-all --share-net")
	require.Contains(t, line, "--ro-bind /usr /usr")
	require.Contains(t, line, "--ro-bind /dev/null /etc/hostname", "a secret under /etc is masked")
	require.Contains(t, line, "--bind "+scopeRoot+" "+scopeRoot)
	require.Contains(t, line, "--bind "+ws+" "+ws)
	require.Contains(t, line, "--ro-bind "+bin+" "+bin)
	require.True(t, strings.HasSuffix(line, "-- "+bin+" app-server --x"), line)
	require.NotContains(t, line, "--bind "+filepath.Join(dir, "state")+" ")
	require.NotContains(t, line, "relative")

	// Confining nothing changes nothing.
	var none *Confiner
	cmd, args, err = none.Provider(scopeRoot, ws, bin, []string{"a"})
	require.NoError(t, err)
	require.Equal(t, bin, cmd)
	require.Equal(t, []string{"a"}, args)
}

// A scope root handed over whole by an earlier gateway (the layout before
// this one) is taken back: the root and every entry but the runner's
// subtrees become the gateway's (root 0710 with the company's group), the
// runner's subtrees (and the missing ones it needs) the company's uid's; a
// link where a runner's subtree should be is refused, not followed.
func TestT7_AScopeRootStaysTheGatewaysAndOnlyTheRunnersSubtreesChangeHands(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "scope")
	for _, d := range []string{"control-plane", "runner", "codex-home/sessions"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o700))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "launch.json"), []byte("{}"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(root, "runner", "state.json"), []byte("{}"), 0o600))
	outside := filepath.Join(dir, "outside")
	require.NoError(t, os.WriteFile(outside, []byte("x"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "runnerd.log")))
	require.NoError(t, HandOver(root, 300200, 300200))

	owned := []string{"runner", "codex-home", "opencode", "acpx"}
	require.NoError(t, KeepScopeRoot(root, 300200, owned, []string{"runner", "codex-home", "acpx"}))
	owner := func(p string) (uint32, uint32, os.FileMode) {
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(p, &st))
		return st.Uid, st.Gid, os.FileMode(st.Mode).Perm()
	}
	uid, gid, mode := owner(root)
	require.Equal(t, []any{uint32(0), uint32(300200), os.FileMode(0o710)}, []any{uid, gid, mode})
	for _, p := range []string{"control-plane", "launch.json", "runnerd.log"} {
		uid, _, _ := owner(filepath.Join(root, p))
		require.Zero(t, uid, p)
	}
	for _, p := range []string{"runner", "runner/state.json", "codex-home", "codex-home/sessions", "acpx"} {
		uid, _, _ := owner(filepath.Join(root, p))
		require.EqualValues(t, 300200, uid, p)
	}
	_, err := os.Lstat(filepath.Join(root, "opencode"))
	require.True(t, os.IsNotExist(err), "only the subtrees a launch needs are created")
	uid, _, _ = owner(outside)
	require.Zero(t, uid)

	require.NoError(t, os.RemoveAll(filepath.Join(root, "codex-home")))
	require.NoError(t, os.Symlink(dir, filepath.Join(root, "codex-home")))
	require.ErrorContains(t, KeepScopeRoot(root, 300200, owned, []string{"runner"}), "link or not a directory")
}
