package e2e

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// confinedHarness starts a stack whose gateway confines its runners with
// -runner-confinement=mode (SPEC T7). The fake runs without the stack's
// shared call log (outside every root a provider may reach), and runnerd
// and the fake are started from a copy whose every ancestor other users
// can traverse, as a runner under its company's uid must.
func confinedHarness(t *testing.T, mode string) *harness {
	t.Helper()
	return confinedHarnessWith(t, stack.Options{}, mode, false)
}

// confinedHarnessWith is confinedHarness with stack options; mode "" gives
// the gateway no -runner-confinement (its default, auto); offLoopback has
// the gateway serve on every address (0.0.0.0, its port unchanged).
func confinedHarnessWith(t *testing.T, opts stack.Options, mode string, offLoopback bool) *harness {
	t.Helper()
	if (mode == "" || strings.Contains(mode, "uid")) && os.Geteuid() != 0 {
		t.Skip("confinement by uid needs a gateway running as root")
	}
	if mode == "" || strings.Contains(mode, "bwrap") {
		if _, err := exec.LookPath("bwrap"); err != nil {
			t.Skip("bwrap is not installed (Debian package bubblewrap; .ci/run installs it)")
		}
	}
	opts.NoCallLog = true
	h := newHarnessWith(t, opts, "backup-verifier")
	dir := h.st.Dir()
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		if fi.Mode().Perm()&0o001 == 0 {
			require.NoError(t, os.Chmod(d, fi.Mode().Perm()|0o011))
		}
	}
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(bin, 0o755))
	for _, b := range []string{"runnerd", "fake-codex-app-server"} {
		copyExecutable(t, filepath.Join(binDir, b), filepath.Join(bin, b))
	}
	args := []string{"-runnerd-path", filepath.Join(bin, "runnerd"), "-codex-command", filepath.Join(bin, "fake-codex-app-server")}
	if mode != "" {
		args = append(args, "-runner-confinement", mode)
	}
	if offLoopback {
		_, port, err := net.SplitHostPort(h.st.Addr("runnergw"))
		require.NoError(t, err)
		args = append(args, "-grpc-addr", "0.0.0.0:"+port)
	}
	h.st.SetExtraArgs("runnergw", args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []string{"runnergw", "executor"} {
		_, err := h.st.Start(ctx, p)
		require.NoError(t, err)
	}
	h.client = h.clientFor("executor")
	return h
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	if os.Link(from, to) == nil {
		return
	}
	src, err := os.Open(from)
	require.NoError(t, err)
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
}

// confinedInput is a warm run's input for company in session, working in
// cwd (empty: the scope's own workspace).
func confinedInput(t *testing.T, company, session, cwd, prompt string) *prpv1.ExecutionInput {
	t.Helper()
	in, err := cli.InputSpec{Prompt: prompt, Company: company, Agent: "agent-1", Issue: "ISS-1", Session: session,
		Lifecycle: "warm", Cwd: cwd}.Input()
	require.NoError(t, err)
	return in
}

// runProbes runs one turn with the prompt and returns its reply, which
// must have succeeded.
func (h *harness) runProbes(ctx context.Context, runID string, in *prpv1.ExecutionInput) string {
	h.t.Helper()
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in})
	require.NoError(h.t, err)
	run := h.waitTerminal(ctx, runID)
	require.Equal(h.t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	return run.GetResult().GetFinalMessage()
}

// probe is the fake's probe marker; probeOK and probeFailed are its
// outcomes (see fake-codex-app-server's README).
func probe(kind, path string) string { return "[probe-" + kind + ":" + path + "]" }

func probeOK(kind, path string) string { return "probe-" + kind + " " + path + ": ok" }

func probeFailed(kind, path string) string { return "probe-" + kind + " " + path + ": error" }

// requireProbes checks the reply's outcome of each probe: ok for allowed,
// refused (permission denied or not found) for denied.
func requireProbes(t *testing.T, reply string, allowed, denied map[string][]string) {
	t.Helper()
	for kind, paths := range allowed {
		for _, p := range paths {
			require.Contains(t, reply, probeOK(kind, p), "the provider must reach its own %s", p)
		}
	}
	for kind, paths := range denied {
		for _, p := range paths {
			require.NotContains(t, reply, probeOK(kind, p), "the provider reached %s", p)
			require.Contains(t, reply, probeFailed(kind, p), "no outcome for %s in %q", p, reply)
		}
	}
}

// t7Setup runs a globex session that leaves a file in its workspace and
// its scope root, and returns the paths an acme provider must not reach.
type t7Paths struct {
	gatewayKey, stateRoot, globexScope, globexState, globexWorkspace, globexFile string
}

func (h *harness) t7Globex(ctx context.Context) t7Paths {
	h.t.Helper()
	ws := filepath.Join(h.st.WorkspaceRoot(), "globex", "repo")
	file := filepath.Join(ws, "plans.txt")
	in := confinedInput(h.t, "globex", "globex-session", ws, "keep this "+probe("write", file))
	reply := h.runProbes(ctx, "globex-1", in)
	require.Contains(h.t, reply, probeOK("write", file))
	sc := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("globex-1", in))
	return t7Paths{
		gatewayKey:      filepath.Join(h.st.Dir(), "keys", "gateway.key"),
		stateRoot:       h.st.RunnerStateRoot(),
		globexScope:     sc,
		globexState:     filepath.Join(sc, "codex-home", "fake-codex-state.json"),
		globexWorkspace: ws,
		globexFile:      file,
	}
}

// As root, each company's runners run under a uid of their own: an acme
// provider cannot read the gateway's key, list the state root, or read a
// globex scope root or workspace; its own workspace works and the run
// succeeds, twice in its warm session. The runner's subtrees are the uid's,
// 0700, the scope root root's (0710); the gateway's key stays root's, 0600.
func TestT7_UnderItsCompanysUIDAProviderCannotReadTheGatewayKeyNorAnotherCompanysScopeOrWorkspace(t *testing.T) {
	t.Parallel()
	h := confinedHarness(t, "uid")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := h.t7Globex(ctx)
	ws := filepath.Join(h.st.WorkspaceRoot(), "acme", "repo")
	mine := filepath.Join(ws, "notes.txt")
	prompt := strings.Join([]string{probe("read", g.gatewayKey), probe("list", g.stateRoot), probe("list", g.globexScope),
		probe("read", g.globexState), probe("list", g.globexWorkspace), probe("read", g.globexFile),
		probe("write", mine), probe("read", mine)}, " ")
	in := confinedInput(t, "acme", "acme-session", ws, prompt)
	reply := h.runProbes(ctx, "acme-1", in)
	requireProbes(t, reply, map[string][]string{"write": {mine}, "read": {mine}},
		map[string][]string{"read": {g.gatewayKey, g.globexState, g.globexFile}, "list": {g.stateRoot, g.globexScope, g.globexWorkspace}})
	// The warm session's next turn, in the same runner, still works.
	reply = h.runProbes(ctx, "acme-2", confinedInput(t, "acme", "acme-session", ws, probe("read", mine)))
	require.Contains(t, reply, probeOK("read", mine))
	require.Contains(t, reply, "2 earlier messages")

	acme := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-1", in))
	acmeUID := ownerOf(t, filepath.Join(acme, "runner"), 0o700)
	globexUID := ownerOf(t, filepath.Join(g.globexScope, "runner"), 0o700)
	require.Zero(t, ownerOf(t, acme, 0o710), "the scope root stays root's")
	require.NotZero(t, acmeUID)
	require.NotEqual(t, acmeUID, globexUID, "each company has a uid of its own")
	require.Equal(t, acmeUID, ownerOf(t, filepath.Join(h.st.WorkspaceRoot(), "acme"), 0o700))
	require.Zero(t, ownerOf(t, g.gatewayKey, 0o600))
}

func ownerOf(t *testing.T, p string, mode os.FileMode) uint32 {
	t.Helper()
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, mode, fi.Mode().Perm(), "%s", p)
	return fi.Sys().(*syscall.Stat_t).Uid
}

// A gateway that confines with bubblewrap alone (as an unprivileged
// gateway does; here even as root, so nothing but the sandbox stands in
// the way): the provider sees the system directories, its scope root and
// its workspace — not the gateway's keys or state root, not another
// session of its own company, not another company's workspace, not the
// gateway's processes.
func TestT7_InABubblewrapSandboxAProviderSeesOnlyItsScopeRootAndWorkspace(t *testing.T) {
	t.Parallel()
	h := confinedHarness(t, "bwrap")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := h.t7Globex(ctx)
	// Another session of acme itself.
	otherIn := confinedInput(t, "acme", "acme-other", "", "hello")
	h.runProbes(ctx, "acme-other-1", otherIn)
	other := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-other-1", otherIn))

	in := confinedInput(t, "acme", "acme-session", "", "")
	own := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-1", in))
	mine := filepath.Join(own, "workspace", "notes.txt")
	gw := h.st.Proc("runnergw").Pid()
	in.Task.Prompt = strings.Join([]string{probe("read", g.gatewayKey), probe("list", g.stateRoot), probe("list", other),
		probe("list", g.globexScope), probe("read", g.globexFile), probe("list", filepath.Join(h.st.Dir(), "keys")),
		probe("list", filepath.Join("/proc", itoa(gw), "root")), probe("write", mine), probe("read", mine)}, " ")
	reply := h.runProbes(ctx, "acme-1", in)
	requireProbes(t, reply, map[string][]string{"write": {mine}, "read": {mine}},
		map[string][]string{"read": {g.gatewayKey, g.globexFile},
			"list": {other, g.globexScope, filepath.Join(h.st.Dir(), "keys"), filepath.Join("/proc", itoa(gw), "root")}})
	requireOnlyOwnScope(t, reply, g.stateRoot, own)
}

// Both: runners under their company's uid and providers in a sandbox. A
// second session of the same company (same uid) is hidden by the sandbox,
// another company's by both; the session's runner keeps working across a
// stop and a cold start on its root (the ownership follows).
func TestT7_UnderItsUIDAndInASandboxAProviderReachesOnlyItsOwnSession(t *testing.T) {
	t.Parallel()
	h := confinedHarness(t, "uid+bwrap")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := h.t7Globex(ctx)
	otherWS := filepath.Join(h.st.WorkspaceRoot(), "acme", "other")
	otherIn := confinedInput(t, "acme", "acme-other", otherWS, probe("write", filepath.Join(otherWS, "draft.txt")))
	h.runProbes(ctx, "acme-other-1", otherIn)
	other := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-other-1", otherIn))

	ws := filepath.Join(h.st.WorkspaceRoot(), "acme", "repo")
	mine := filepath.Join(ws, "notes.txt")
	prompt := strings.Join([]string{probe("read", g.gatewayKey), probe("list", g.stateRoot), probe("list", other),
		probe("read", filepath.Join(otherWS, "draft.txt")), probe("list", g.globexScope), probe("read", g.globexFile),
		probe("write", mine), probe("read", mine)}, " ")
	in := confinedInput(t, "acme", "acme-session", ws, prompt)
	reply := h.runProbes(ctx, "acme-1", in)
	requireProbes(t, reply, map[string][]string{"write": {mine}, "read": {mine}},
		map[string][]string{"read": {g.gatewayKey, filepath.Join(otherWS, "draft.txt"), g.globexFile},
			"list": {other, g.globexScope}})
	requireOnlyOwnScope(t, reply, g.stateRoot, filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-1", in)))

	// The runner stops; the next run starts a new one on the same root.
	h.stopRunner(ctx, "acme-session")
	reply = h.runProbes(ctx, "acme-2", confinedInput(t, "acme", "acme-session", ws, probe("read", mine)))
	require.Contains(t, reply, probeOK("read", mine))
	require.Contains(t, reply, "2 earlier messages", "the conversation survived the cold start")
}

// requireOnlyOwnScope checks that the sandbox's state root, where the
// provider's own scope root is bound, lists that scope root alone.
func requireOnlyOwnScope(t *testing.T, reply, stateRoot, own string) {
	t.Helper()
	require.Contains(t, reply, "["+probeOK("list", stateRoot)+" "+filepath.Base(own)+"]")
}

func itoa(i int) string { return strconv.Itoa(i) }

// A confinement the host cannot provide is refused at startup, on loopback
// too, instead of launching runners unconfined.
func TestT7_AGatewayRefusesToStartWithAConfinementItCannotProvide(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{}, "backup-verifier")
	h.st.SetExtraArgs("runnergw", "-runner-confinement", "bwrap", "-bwrap-path", filepath.Join(h.st.Dir(), "no-bwrap"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := h.st.Start(ctx, "runnergw")
	require.Error(t, err)
	log, err := os.ReadFile(h.st.LogPath("runnergw"))
	require.NoError(t, err)
	require.Contains(t, string(log), "runner_confinement_unavailable")
}

// Off loopback the gateway confines by default: as root with bubblewrap,
// each company's runners under their uid and providers in a sandbox,
// without a flag (SPEC T7 default-on). The gateway serves mTLS on every
// address (0.0.0.0); the executor reaches it on 127.0.0.1.
func TestT7_OffLoopbackTheGatewayConfinesItsRunnersByDefault(t *testing.T) {
	t.Parallel()
	h := confinedHarnessWith(t, stack.Options{MTLS: true}, "", true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := h.t7Globex(ctx)
	in := confinedInput(t, "acme", "acme-session", "", "")
	own := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-1", in))
	mine := filepath.Join(own, "workspace", "notes.txt")
	in.Task.Prompt = strings.Join([]string{probe("read", g.gatewayKey), probe("list", g.globexScope), probe("read", g.globexFile),
		probe("write", mine), probe("read", mine)}, " ")
	reply := h.runProbes(ctx, "acme-1", in)
	requireProbes(t, reply, map[string][]string{"write": {mine}, "read": {mine}},
		map[string][]string{"read": {g.gatewayKey, g.globexFile}, "list": {g.globexScope}})
	require.NotZero(t, ownerOf(t, filepath.Join(own, "runner"), 0o700), "the runner's state is its company uid's")
	require.Zero(t, ownerOf(t, own, 0o710), "the scope root stays root's")
	log, err := os.ReadFile(h.st.LogPath("runnergw"))
	require.NoError(t, err)
	require.Contains(t, string(log), `"runner_confinement":"uid+bwrap"`)
}

// Under its company's uid a runner owns only its subtrees of the scope
// root (runner/, the provider home, the workspace), never the root itself
// nor what the gateway, as root, writes there. Its provider tries to put
// symbolic links to files outside in place of the launch record (and the
// fixed-name temporary the gateway once wrote it through), runnerd's log
// and the control plane; then the runner is stopped and the next run
// launches a new one on the root. No swap succeeds, no file outside
// changes, the runs succeed, and the layout is root's root (0710, the
// company's group) with the company's uid owning runner/ alone.
func TestT7_UnderItsUIDARunnerCannotRedirectTheGatewaysWritesInItsScopeRoot(t *testing.T) {
	t.Parallel()
	h := confinedHarness(t, "uid")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	victims := filepath.Join(h.st.Dir(), "victims")
	require.NoError(t, os.Mkdir(victims, 0o700))
	victim := func(name string) string {
		p := filepath.Join(victims, name)
		require.NoError(t, os.WriteFile(p, []byte("untouched"), 0o600))
		return p
	}
	launchTmp, log, launch, mark := victim("launch-tmp"), victim("log"), victim("launch"), victim("mark")

	in := confinedInput(t, "acme", "acme-session", "", "")
	root := filepath.Join(h.st.RunnerStateRoot(), scope.OfRun("acme-1", in))
	swap := func(name, target string) string {
		return "[probe-swap:" + filepath.Join(root, name) + ">" + target + "]"
	}
	swaps := []string{swap(".launch.json.tmp", launchTmp), swap("runnerd.log", log), swap("launch.json", launch),
		swap("checkpoint-mark.json", mark)}
	in.Task.Prompt = strings.Join(swaps, " ")
	first := h.runProbes(ctx, "acme-1", in)

	// A new runner on the root: the gateway writes the launch record, opens
	// runnerd's log and binds the control plane again, as root.
	h.stopRunner(ctx, "acme-session")
	cp := filepath.Join(victims, "control-plane")
	require.NoError(t, os.Mkdir(cp, 0o700))
	next := confinedInput(t, "acme", "acme-session", "", swap("control-plane", cp))
	second := h.runProbes(ctx, "acme-2", next)
	for _, v := range []string{launchTmp, log, launch, mark} {
		b, err := os.ReadFile(v)
		require.NoError(t, err)
		require.Equal(t, "untouched", string(b), "the gateway wrote through a runner's link into %s", v)
	}
	for _, reply := range []string{first, second} {
		require.NotContains(t, reply, ": ok", "a swap in the scope root succeeded: %s", reply)
	}
	require.Contains(t, first, "probe-swap "+filepath.Join(root, "runnerd.log")+">"+log+": error permission denied")

	h.stopRunner(ctx, "acme-session")
	third := h.runProbes(ctx, "acme-3", confinedInput(t, "acme", "acme-session", "", "again"))
	require.Contains(t, third, "4 earlier messages", "the session went on on its root")
	entries, err := os.ReadDir(cp)
	require.NoError(t, err)
	require.Empty(t, entries, "the control plane was written through a runner's link")

	uid := ownerOf(t, filepath.Join(root, "runner"), 0o700)
	require.NotZero(t, uid)
	require.Zero(t, ownerOf(t, root, 0o710), "the scope root stays root's")
	fi, err := os.Stat(root)
	require.NoError(t, err)
	require.EqualValues(t, uid, fi.Sys().(*syscall.Stat_t).Gid, "the company's group traverses the root")
	require.Zero(t, ownerOf(t, filepath.Join(root, "control-plane"), 0o700))
	require.Zero(t, ownerOf(t, filepath.Join(root, "launch.json"), 0o600))
	require.Equal(t, uid, ownerOf(t, filepath.Join(root, "codex-home"), 0o700))
	require.Equal(t, uid, ownerOf(t, filepath.Join(root, "workspace"), 0o700))
}
