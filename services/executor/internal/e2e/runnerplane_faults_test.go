package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// Runner-plane faults with real processes: the runnerd process or its
// WebSocket fails in the middle of a turn, and the turn still completes
// with the executor's events contiguous, each event once, and the provider
// turn started exactly once.

// requireExactlyOnce checks a finished run's events: contiguous, one
// turn.started and one run.terminal, and the streamed deltas add up to the
// final message exactly (no delta lost or repeated across the fault).
func requireExactlyOnce(t *testing.T, h *harness, evs []*executorv1.WatchRunResponse) {
	t.Helper()
	requireContiguous(t, evs)
	seen := map[string]bool{}
	counts := map[string]int{}
	var deltas strings.Builder
	for _, m := range evs {
		ev := m.GetEvent()
		key := fmt.Sprintf("%s/%d", ev.GetSourceInstanceId(), ev.GetSourceSeq())
		require.False(t, seen[key], "event %s persisted twice", key)
		seen[key] = true
		counts[ev.GetEventType()]++
		if ev.GetEventType() == "item.delta" {
			if d, ok := ev.GetPayload().AsMap()["delta"].(string); ok {
				deltas.WriteString(d)
			}
		}
	}
	require.Equal(t, 1, counts["turn.started"], "the turn is announced once")
	require.Equal(t, 1, counts["run.terminal"])
	last := evs[len(evs)-1].GetEvent()
	require.Equal(t, "run.terminal", last.GetEventType())
	final, _ := last.GetPayload().AsMap()["finalMessage"].(string)
	require.NotEmpty(t, final)
	require.Equal(t, final, deltas.String(), "every streamed delta exactly once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"), "the provider turn started exactly once")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "process-start"), "one provider process throughout")
}

func isRunnerd(pid int32) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "runnerd\x00") && strings.Contains(string(b), "--runner-id")
}

func TestR4_RunnerdKilledMidTurnRestartsOnItsStateDirAndTheTurnCompletesOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "60"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("runnerd-crash", "runnerd-crash", slowTurn)
	var killed int32
	evs := h.watch(ctx, "runnerd-crash", 0, func(m *executorv1.WatchRunResponse) {
		if killed != 0 || m.GetEvent().GetEventType() != "item.delta" {
			return
		}
		pid := h.get("runnerd-crash").GetRunnerProcess().GetPid()
		require.True(t, isRunnerd(pid), "pid %d is the session's runnerd", pid)
		require.NoError(t, syscall.Kill(int(pid), syscall.SIGKILL))
		killed = pid
	})
	require.NotZero(t, killed, "runnerd was killed mid-turn")
	requireExactlyOnce(t, h, evs)
	run := h.get("runnerd-crash")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.EqualValues(t, 1, run.GetAttempt(), "the executor kept its lease")
	require.NotEqual(t, killed, run.GetRunnerProcess().GetPid(), "a new runnerd took over the state dir")
	types := map[string]int{}
	reattached := false
	for _, m := range evs {
		types[m.GetEvent().GetEventType()]++
		if m.GetEvent().GetEventType() == "harness.ready" && m.GetEvent().GetPayload().AsMap()["reattached"] == true {
			reattached = true
		}
	}
	require.Equal(t, 1, types["runner.reconciled"], "the restarted runnerd reloaded its durable state")
	require.True(t, reattached, "and re-attached to the surviving provider")
	require.Zero(t, types["harness.exited"], "the provider was never lost")
	replayed := h.watch(ctx, "runnerd-crash", 0, nil)
	require.Len(t, replayed, len(evs))
}

// tcpProxy forwards loopback TCP connections to target and can drop or
// stall (black-hole) the ones it carries, or be turned off and on at once
// (no process start to wait for, however loaded the machine).
type tcpProxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	pairs    []*proxyPair
	off      bool // every new connection is closed unanswered
	accepted atomic.Int32
	wg       sync.WaitGroup
}

type proxyPair struct {
	a, b    net.Conn
	stalled atomic.Bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, pr := range p.pairs {
			pr.a.Close()
			pr.b.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			a.Close()
			continue
		}
		pr := &proxyPair{a: a, b: b}
		p.mu.Lock()
		if p.off {
			p.mu.Unlock()
			a.Close()
			b.Close()
			continue
		}
		p.accepted.Add(1)
		p.pairs = append(p.pairs, pr)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pr, a, b)
		go p.pipe(pr, b, a)
	}
}

// pipe copies src to dst; a stalled pair swallows everything and
// propagates nothing, not even a close (a black-holed path).
func (p *tcpProxy) pipe(pr *proxyPair, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pr.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if !pr.stalled.Load() {
				pr.a.Close()
				pr.b.Close()
			}
			return
		}
	}
}

// dropAll closes every carried connection (both sides see it at once).
func (p *tcpProxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked()
}

func (p *tcpProxy) dropLocked() {
	for _, pr := range p.pairs {
		pr.a.Close()
		pr.b.Close()
	}
}

// setOff turns the proxy off — every carried connection cut and each new
// one closed unanswered, as a service that went away — or on again.
func (p *tcpProxy) setOff(off bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.off = off
	if off {
		p.dropLocked()
	}
}

// stallAll black-holes every carried connection: bytes vanish and neither
// side learns anything; new connections are forwarded normally.
func (p *tcpProxy) stallAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.pairs {
		pr.stalled.Store(true)
	}
}

// proxiedHarness puts a TCP proxy between runnerd and the gateway's runner
// listener (the gateway tells launched runners to dial the proxy).
func proxiedHarness(t *testing.T, gatewayArgs ...string) (*harness, *tcpProxy) {
	port, err := stack.FreePort()
	require.NoError(t, err)
	proxy := newTCPProxy(t, fmt.Sprintf("127.0.0.1:%d", port))
	args := append([]string{"-runner-connect-url", "ws://" + proxy.addr() + "/v1/runners/connect"}, gatewayArgs...)
	h := newHarness(t, stack.Options{RunnerPort: port, GatewayArgs: args, FakeArgs: []string{"--delta-delay-ms", "60"}})
	return h, proxy
}

func TestG4_RunnerWebSocketDroppedMidTurnTheTurnCompletesOnce(t *testing.T) {
	t.Parallel()
	h, proxy := proxiedHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("ws-drop", "ws-drop", slowTurn)
	var runnerPid int32
	dropped := false
	evs := h.watch(ctx, "ws-drop", 0, func(m *executorv1.WatchRunResponse) {
		if !dropped && m.GetEvent().GetEventType() == "item.delta" {
			dropped = true
			runnerPid = h.get("ws-drop").GetRunnerProcess().GetPid()
			proxy.dropAll()
		}
	})
	require.True(t, dropped, "the runner's WebSocket was cut mid-turn")
	requireExactlyOnce(t, h, evs)
	run := h.get("ws-drop")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.EqualValues(t, 1, run.GetAttempt())
	require.Equal(t, runnerPid, run.GetRunnerProcess().GetPid(), "the same runnerd reconnected")
	require.GreaterOrEqual(t, proxy.accepted.Load(), int32(2), "runnerd dialed again")
}

func TestG4_StalledRunnerConnectionIsDetectedByPingsAndTheTurnCompletesOnce(t *testing.T) {
	t.Parallel()
	h, proxy := proxiedHarness(t, "-runner-ping-interval", "200ms", "-runner-ping-timeout", "1200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("ws-stall", "ws-stall", slowTurn)
	var runnerPid int32
	stalled := false
	evs := h.watch(ctx, "ws-stall", 0, func(m *executorv1.WatchRunResponse) {
		if !stalled && m.GetEvent().GetEventType() == "item.delta" {
			stalled = true
			runnerPid = h.get("ws-stall").GetRunnerProcess().GetPid()
			proxy.stallAll()
		}
	})
	require.True(t, stalled, "the runner's connection was black-holed mid-turn")
	requireExactlyOnce(t, h, evs)
	run := h.get("ws-stall")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	require.Equal(t, runnerPid, run.GetRunnerProcess().GetPid(), "the same runnerd reconnected")
	require.GreaterOrEqual(t, proxy.accepted.Load(), int32(2), "a half-open connection was given up and replaced")
}
