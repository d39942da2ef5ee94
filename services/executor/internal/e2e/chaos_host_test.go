package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// Host-loss faults of the chaos matrix (issue #30): a whole host dies, a
// session fails back onto a gateway's old root, a runnerd dies right after
// a checkpoint. They need two gateways, checkpoints and a gateway TTL short
// enough that a dead host is declared lost within seconds.

// gatewayOf is the chaos gateways' process names (their ids are the same
// but for the first, stack.GatewayIDOf).
var chaosGateways = []string{"runnergw", "runnergw-2"}

// hold parks each session's loop before its next submission; release lets
// them go on. parked returns, for every held session that parked, the last
// run it submitted ("" before its first).
func (c *chaos) hold(sessions []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sessions {
		if c.held[s] == nil {
			c.held[s] = make(chan struct{})
		}
	}
}

func (c *chaos) release(sessions []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sessions {
		if ch := c.held[s]; ch != nil {
			close(ch)
			delete(c.held, s)
		}
	}
}

// gate is the session loop's side of hold: it blocks while the session is
// held, noting the session's last run as parked.
func (c *chaos) gate(ctx context.Context, session, last string) {
	for {
		c.mu.Lock()
		ch := c.held[session]
		if ch != nil {
			c.parked[session] = last
		}
		c.mu.Unlock()
		if ch == nil {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		delete(c.parked, session)
		c.mu.Unlock()
	}
}

// giveUpAfter: a session that failed this many runs in a row stops
// submitting (it is wedged; the audit reports it).
const giveUpAfter = 10

// stop notes that a session's loop ended for good after its run last.
func (c *chaos) stop(session, last string) {
	c.mu.Lock()
	c.stopped[session] = last
	c.mu.Unlock()
	c.logf("session %s stopped after %d failed runs in a row (the last %s)", session, giveUpAfter, last)
}

func (c *chaos) allStopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stopped) == c.cfg.Sessions
}

// waitParked waits (bounded) until every one of sessions parked (or
// stopped) and returns their last runs.
func (c *chaos) waitParked(ctx context.Context, sessions []string, bound time.Duration) map[string]string {
	deadline := time.Now().Add(bound)
	for {
		c.mu.Lock()
		out := map[string]string{}
		for _, s := range sessions {
			if last, ok := c.parked[s]; ok {
				out[s] = last
			}
			if last, ok := c.stopped[s]; ok {
				out[s] = last
			}
		}
		c.mu.Unlock()
		if len(out) == len(sessions) || time.Now().After(deadline) || ctx.Err() != nil {
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkpointed waits (bounded) until each run has a checkpoint recorded
// for its idle period, and returns the runs that got one.
func (c *chaos) checkpointed(ctx context.Context, runs []string, bound time.Duration) map[string]bool {
	deadline := time.Now().Add(bound)
	got := map[string]bool{}
	for {
		for _, r := range runs {
			if got[r] || r == "" {
				continue
			}
			var n int
			if err := c.st.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.session_checkpoints WHERE last_run_id = $1`, r).Scan(&n); err == nil && n > 0 {
				got[r] = true
			}
		}
		if len(got) == len(runs) || time.Now().After(deadline) || ctx.Err() != nil {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdForCheckpoints parks sessions and waits until each one's last run
// is checkpointed (its idle period passes -checkpoint-after, the verifier
// stamps the suspension). The sessions stay held; it returns their last
// runs and how many got a checkpoint.
func (c *chaos) holdForCheckpoints(ctx context.Context, sessions []string) (map[string]string, int) {
	c.hold(sessions)
	parked := c.waitParked(ctx, sessions, time.Minute)
	runs := make([]string, 0, len(parked))
	for _, r := range parked {
		runs = append(runs, r)
	}
	got := c.checkpointed(ctx, runs, 20*time.Second)
	return parked, len(got)
}

// sessionsOn lists the chaos sessions placed on gateway id gw.
func (c *chaos) sessionsOn(ctx context.Context, gw string) []string {
	rows, err := c.st.Pool().Query(ctx, `SELECT DISTINCT r.normalized_session_id FROM executor.runs r
  JOIN executor.placements p ON p.session_scope = r.session_scope WHERE p.gateway_id = $1`, gw)
	if err != nil {
		c.t.Logf("chaos: placements of %s: %v", gw, err)
		return nil
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if rows.Scan(&s) == nil {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// waitPlaced waits (bounded) until every one of sessions is placed on
// gateway id gw; it returns those that are not.
func (c *chaos) waitPlaced(ctx context.Context, sessions []string, gw string, bound time.Duration) []string {
	deadline := time.Now().Add(bound)
	for {
		on := map[string]bool{}
		for _, s := range c.sessionsOn(ctx, gw) {
			on[s] = true
		}
		var missing []string
		for _, s := range sessions {
			if !on[s] {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLost waits until the registry's heartbeat of gateway id gw is older
// than the executors' -gateway-ttl: the gateway is lost.
func (c *chaos) waitLost(ctx context.Context, gw string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var lost bool
		err := c.st.Pool().QueryRow(ctx, `SELECT heartbeat_at < now() - make_interval(secs => $2) FROM executor.gateways WHERE gateway_id = $1`,
			gw, c.cfg.GatewayTTL.Seconds()).Scan(&lost)
		if err == nil && lost {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("gateway %s not lost: %v", gw, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setDown marks sessions as served by a dead host: every run they submit
// until setUp is hit by kind (and the first one after it, carried).
func (c *chaos) setDown(sessions []string, kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sessions {
		c.down[s] = kind
		if id := c.inFlight[s]; id != "" {
			c.hitLocked(id, kind)
		}
	}
}

func (c *chaos) setUp(sessions []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sessions {
		if kind, ok := c.down[s]; ok {
			delete(c.down, s)
			c.carried[s] = kind
		}
	}
}

// killHost kills -9 a gateway and every runnerd and provider process of
// its state root at once, as a host dies: the sessions placed on it are
// down from then on.
func (c *chaos) killHost(ctx context.Context, name, kind string) []string {
	sessions := c.sessionsOn(ctx, stack.GatewayIDOf(name))
	c.setDown(sessions, kind)
	p := c.h.st.Proc(name)
	_ = syscall.Kill(p.Pid(), syscall.SIGKILL)
	n := stack.KillProcessesUnder(c.h.st.RunnerStateRootOf(name))
	<-p.Done()
	c.logf("host %s died (%d runnerd/provider processes with it), sessions on it: %v", name, n, sessions)
	return sessions
}

// restartHost brings a dead host's gateway back with the same id and
// state root.
func (c *chaos) restartHost(ctx context.Context, name string) {
	if _, err := c.h.st.Start(ctx, name); err != nil {
		c.t.Errorf("restarting %s: %v", name, err)
	}
	c.logf("host %s is back on its root", name)
}

// hostKill: a host dies, stays down until its gateway is lost (past
// -gateway-ttl) and a little longer, and comes back on the same root.
func (c *chaos) hostKill(ctx context.Context, in injection) {
	name := chaosGateways[in.Pick%len(chaosGateways)]
	sessions := c.killHost(ctx, name, in.Kind)
	c.count(in.Kind)
	if err := c.waitLost(ctx, stack.GatewayIDOf(name)); err != nil {
		c.t.Errorf("host kill: %v", err)
	}
	pause(ctx, time.Duration(in.Pick%2000)*time.Millisecond)
	c.restartHost(ctx, name)
	c.setUp(sessions)
}

// failBack: the sessions of gateway a are checkpointed and a's host dies;
// once a is lost they move to b (restoring their checkpoints); a comes
// back on its old root; they are checkpointed on b and b's host dies;
// once b is lost they move back onto a, where their old roots are. b
// comes back at the end.
func (c *chaos) failBack(ctx context.Context, in injection) {
	a := chaosGateways[in.Pick%len(chaosGateways)]
	b := chaosGateways[(in.Pick+1)%len(chaosGateways)]
	movers := c.sessionsOn(ctx, stack.GatewayIDOf(a))
	if len(movers) == 0 {
		c.retryLater(ctx, in)
		return
	}
	c.count(in.Kind)
	_, n := c.holdForCheckpoints(ctx, movers)
	c.logf("fail-back %s -> %s -> %s: %d of %d sessions checkpointed on %s", a, b, a, n, len(movers), a)
	downA := c.killHost(ctx, a, in.Kind)
	if err := c.waitLost(ctx, stack.GatewayIDOf(a)); err != nil {
		c.t.Errorf("fail-back: %v", err)
	}
	c.release(movers)
	if missing := c.waitPlaced(ctx, movers, stack.GatewayIDOf(b), time.Minute); len(missing) > 0 {
		c.logf("fail-back: %v did not move to %s", missing, b)
	}
	c.restartHost(ctx, a)
	c.setUp(downA)
	_, n = c.holdForCheckpoints(ctx, movers)
	c.logf("fail-back: %d of %d sessions checkpointed on %s", n, len(movers), b)
	downB := c.killHost(ctx, b, in.Kind)
	if err := c.waitLost(ctx, stack.GatewayIDOf(b)); err != nil {
		c.t.Errorf("fail-back: %v", err)
	}
	c.release(movers)
	if missing := c.waitPlaced(ctx, movers, stack.GatewayIDOf(a), time.Minute); len(missing) > 0 {
		c.logf("fail-back: %v did not move back to %s", missing, a)
	}
	c.restartHost(ctx, b)
	c.setUp(downB)
}

// killRunnerdAfterCheckpoint: a session is checkpointed, its next run (a
// slow turn, about 2 s of deltas) starts in a new runner, and that runnerd
// is killed about a second into it.
func (c *chaos) killRunnerdAfterCheckpoint(ctx context.Context, in injection) {
	session := fmt.Sprintf("chaos-%d", in.Pick%c.cfg.Sessions)
	c.mu.Lock()
	_, down := c.down[session]
	_, stopped := c.stopped[session]
	c.mu.Unlock()
	if down || stopped {
		c.retryLater(ctx, in)
		return
	}
	parked, n := c.holdForCheckpoints(ctx, []string{session})
	if n == 0 {
		c.release([]string{session})
		c.retryLater(ctx, in)
		return
	}
	c.mu.Lock()
	c.nextPrompt[session] = "[slow] the first turn after a checkpoint"
	c.mu.Unlock()
	c.release([]string{session})
	runID, pid := "", 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		c.mu.Lock()
		runID = c.inFlight[session]
		c.mu.Unlock()
		if runID != "" && runID != parked[session] {
			if pid = c.processOf(ctx, runID, true); pid != 0 {
				break
			}
		}
	}
	if pid == 0 {
		c.retryLater(ctx, in)
		return
	}
	pause(ctx, 700*time.Millisecond+time.Duration(in.Pick%600)*time.Millisecond)
	if syscall.Kill(pid, syscall.SIGKILL) != nil {
		c.retryLater(ctx, in)
		return
	}
	c.mu.Lock()
	c.injected[in.Kind]++
	c.hitLocked(runID, in.Kind)
	c.carried[session] = in.Kind
	c.mu.Unlock()
}

func (c *chaos) count(kind string) {
	c.mu.Lock()
	c.injected[kind]++
	c.mu.Unlock()
}

func (c *chaos) logf(format string, args ...any) {
	c.t.Logf("chaos %s: "+format, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// orphanProviders lists the fake provider processes under dir (the test's
// stack: its gateways' state roots) that no longer serve a root: a
// provider whose parent is not a runnerd (its runnerd died and it lives
// on), whose home is gone or set aside (quarantine, continuity-breaks), or
// one of two providers of one scope root (all but one).
func orphanProviders(dir string) []string {
	dir = filepath.Clean(dir) + "/"
	entries, _ := os.ReadDir("/proc")
	byHome := map[string][]int{}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		argv := procArgv(pid)
		if len(argv) == 0 || filepath.Base(argv[0]) != "fake-codex-app-server" {
			continue
		}
		home := procEnv(pid, "CODEX_HOME")
		if !strings.HasPrefix(home, dir) {
			continue
		}
		ppid := procPPid(pid)
		parent := procArgv(ppid)
		switch {
		case len(parent) == 0 || filepath.Base(parent[0]) != "runnerd":
			out = append(out, fmt.Sprintf("pid %d (home %s): its runnerd is gone (parent %d %v)", pid, home, ppid, parent))
		case strings.Contains(home, "/quarantine/") || strings.Contains(home, "/continuity-breaks/"):
			out = append(out, fmt.Sprintf("pid %d: its home %s was set aside", pid, home))
		default:
			if _, err := os.Stat(home); err != nil {
				out = append(out, fmt.Sprintf("pid %d: its home %s is gone", pid, home))
				continue
			}
			byHome[home] = append(byHome[home], pid)
		}
	}
	for home, pids := range byHome {
		if len(pids) > 1 {
			out = append(out, fmt.Sprintf("pids %v: %d providers of one home %s", pids, len(pids), home))
		}
	}
	sort.Strings(out)
	return out
}

func procArgv(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func procEnv(pid int, key string) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

func procPPid(pid int) int {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}
