package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// fleetThroughput (-throughput N) is SPEC P5: short warm runs per second
// through the whole stack with the given number of gateways, and the CPU
// each kind of process spent per run. Every session first runs one turn
// (opening its runner); then N runs are submitted, each session running
// its runs one after another (a session's runs are serialised by design),
// all sessions at once. CPU is read from /proc (utime+stime of every
// process of each kind, including exited children reaped by its parent)
// before and after the measured runs.
func fleetThroughput(ctx context.Context, st *stack.Stack, client executorv1.ExecutorServiceClient, pgDir string, gateways, sessions, runs int) error {
	for i := 1; i <= sessions; i++ {
		if err := oneTurnIn(ctx, client, fmt.Sprintf("p5-warm-%d", i), fmt.Sprintf("p5-%d", i)); err != nil {
			return fmt.Errorf("opening session %d: %w", i, err)
		}
	}
	roots := map[string]int{"executor": st.Proc("executor").Pid()}
	for g := 1; g <= gateways; g++ {
		roots[gatewayName(g)] = st.Proc(gatewayName(g)).Pid()
	}
	if pid, err := postmasterPID(pgDir); err == nil {
		roots["postgres"] = pid
	}
	before := cpuByKind(roots)
	switchesBefore := switchesByKind(roots)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	t0 := time.Now()
	for s := 1; s <= sessions; s++ {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > int64(runs) {
					return
				}
				if err := oneTurnIn(ctx, client, fmt.Sprintf("p5-run-%d", n), fmt.Sprintf("p5-%d", s)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	select {
	case err := <-errs:
		return err
	default:
	}
	after := cpuByKind(roots)
	switchesAfter := switchesByKind(roots)
	rate := float64(runs) / elapsed.Seconds()
	fmt.Printf("P5 fleet throughput: %d gateway(s), %d warm sessions, %d short runs in %s: %.1f runs/s\n",
		gateways, sessions, runs, elapsed.Round(time.Millisecond), rate)
	tree := procTree()
	var spread []string
	for g := 1; g <= gateways; g++ {
		n := 0
		for _, c := range tree.children[roots[gatewayName(g)]] {
			if tree.comm[c] == "runnerd" {
				n++
			}
		}
		spread = append(spread, fmt.Sprintf("%s=%d", gatewayName(g), n))
	}
	fmt.Printf("  runners per gateway: %s\n", strings.Join(spread, " "))
	var parts []string
	total := 0.0
	for _, k := range sortedKinds(after) {
		ms := float64(after[k]-before[k]) * 1000 / float64(clockTicks) / float64(runs)
		total += ms
		fmt.Printf("  CPU per run  %-9s %7.2f ms\n", k, ms)
		parts = append(parts, fmt.Sprintf("cpu_ms_per_run_%s=%.3f", k, ms))
	}
	fmt.Printf("  CPU per run  %-9s %7.2f ms (%.0f %% of the box's 2 cores at this rate)\n", "total", total, 100*total*rate/1000/2)
	fmt.Printf("BENCH fleet_throughput_%dgw runs_per_s=%.2f sessions=%d runs=%d %s cpu_ms_per_run_total=%.3f target=0.00 met=true unit=runs/s\n",
		gateways, rate, sessions, runs, strings.Join(parts, " "), total)
	printSwitches(switchesBefore, switchesAfter, runs)
	return nil
}

// printSwitches prints the context switches per run of each process kind
// (switchesByKind's kinds): on a guest where every wake-up of a thread is
// dear, how many each kind's share of a run cost.
func printSwitches(before, after map[string]int64, runs int) {
	var parts []string
	total := 0.0
	for _, k := range sortedKinds(after) {
		n := float64(after[k]-before[k]) / float64(runs)
		total += n
		fmt.Printf("  context switches per run  %-9s %7.1f\n", k, n)
		parts = append(parts, fmt.Sprintf("%s=%.1f", k, n))
	}
	fmt.Printf("  context switches per run  %-9s %7.1f\n", "total", total)
	fmt.Printf("BENCH fleet_switches_per_run %s total=%.1f\n", strings.Join(parts, " "), total)
}

// sortedKinds are the process kinds counted in m, in order.
func sortedKinds(m map[string]int64) []string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// gatewayName is the stack name of gateway g (1-based).
func gatewayName(g int) string {
	if g == 1 {
		return "runnergw"
	}
	return fmt.Sprintf("runnergw-%d", g)
}

// clockTicks is USER_HZ, the unit of /proc/pid/stat's times (100 on Linux).
const clockTicks = 100

// cpuByKind sums utime+stime+cutime+cstime (ticks) of every process below
// each root, by kind: the roots' own names ("runnergw-2" counts as
// "runnergw"), and below a gateway "runnerd" and "provider" (everything
// runnerd starts: the provider host, the shim and the fake provider).
func cpuByKind(roots map[string]int) map[string]int64 {
	tree := procTree()
	return sumByKind(roots, tree, func(pid int) int64 { return tree.cpu[pid] }, func(kind, _ string) string {
		switch kind {
		case "runnerd":
			return "provider"
		}
		return kind
	})
}

// switchesByKind sums the context switches (voluntary and not, of every
// thread: /proc/<pid>/task/*/status) of every live process below each root,
// by kind as cpuByKind, except that below runnerd the provider host (a
// runnerd process itself) is "provhost" and what it starts "provider".
// Threads that exited take their counts with them (Go's seldom do).
func switchesByKind(roots map[string]int) map[string]int64 {
	return sumByKind(roots, procTree(), threadSwitches, func(kind, comm string) string {
		switch {
		case kind == "runnerd" && comm == "runnerd":
			return "provhost"
		case kind == "runnerd" || kind == "provhost":
			return "provider"
		}
		return kind
	})
}

// sumByKind sums value over every process below each root, by kind: a
// root's kind is its name ("runnergw-2" counts as "runnergw"), a runnerd
// below a gateway is "runnerd", and below that below(parent's kind, the
// child's command name) decides.
func sumByKind(roots map[string]int, tree procs, value func(pid int) int64, below func(kind, comm string) string) map[string]int64 {
	out := map[string]int64{}
	for name, root := range roots {
		kind := name
		if strings.HasPrefix(name, "runnergw") {
			kind = "runnergw"
		}
		out[kind] += value(root)
		var walk func(pid int, kind string)
		walk = func(pid int, kind string) {
			for _, c := range tree.children[pid] {
				k := below(kind, tree.comm[c])
				if kind == "runnergw" && tree.comm[c] == "runnerd" {
					k = "runnerd"
				}
				out[k] += value(c)
				walk(c, k)
			}
		}
		walk(root, kind)
	}
	return out
}

// threadSwitches is the sum of voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches over the threads of process pid.
func threadSwitches(pid int) int64 {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, _ := os.ReadDir(dir)
	var n int64
	for _, t := range tasks {
		raw, err := os.ReadFile(filepath.Join(dir, t.Name(), "status"))
		if err != nil {
			continue
		}
		n += switchesOf(string(raw))
	}
	return n
}

// switchesOf reads the two context-switch counters of a status file.
func switchesOf(status string) int64 {
	var n int64
	for line := range strings.Lines(status) {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "voluntary_ctxt_switches" || name == "nonvoluntary_ctxt_switches") {
			x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			n += x
		}
	}
	return n
}

type procs struct {
	children map[int][]int
	comm     map[int]string
	cpu      map[int]int64
}

func procTree() procs {
	p := procs{children: map[int][]int{}, comm: map[int]string{}, cpu: map[int]int64{}}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(raw)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+2:])
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		var ticks int64
		for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
		p.children[ppid] = append(p.children[ppid], pid)
		p.comm[pid] = s[open+1 : closing]
		p.cpu[pid] = ticks
	}
	return p
}

// postmasterPID reads the cluster's postmaster.pid under dir.
func postmasterPID(dir string) (int, error) {
	var found string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "postmaster.pid" {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		return 0, fmt.Errorf("no postmaster.pid under %s", dir)
	}
	raw, err := os.ReadFile(found)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}
