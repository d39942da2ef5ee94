package main

// CPU time of the processes a figure measures, read from /proc: the unary
// figures print each side's server CPU and the database's CPU per call,
// which a busy shared machine distorts far less than the rates (the rate
// of a side falls when another engineer's build runs; the CPU it spends
// on a call hardly moves).

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the kernel's USER_HZ (100 on Linux).
const clockTick = 10 * time.Millisecond

// procStat returns a process's parent and its CPU time (user + system).
func procStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// The command name may hold spaces: the fields follow its ')'.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, time.Duration(utime+stime) * clockTick, true
}

// processCPU is the CPU time of one process, 0 when it is gone.
func processCPU(pid int) time.Duration {
	_, cpu, _ := procStat(pid)
	return cpu
}

// childrenCPU is the CPU time of every child of parent (a PostgreSQL
// server's backends and background processes).
func childrenCPU(parent int) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, cpu, ok := procStat(pid); ok && ppid == parent {
			sum += cpu
		}
	}
	return sum
}

// postmaster is the PID of the database server's main process when it
// runs on this machine (the parent of a backend of b's), 0 otherwise.
func (b *bench) postmaster(ctx context.Context) int {
	var backend int
	if err := b.raw.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	ppid, _, ok := procStat(backend)
	if !ok {
		return 0
	}
	return ppid
}

// loadAvg is the machine's one-minute load average, as printed.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
