// Package procid identifies OS processes across PID reuse: a process is the
// same one only if its pid, its start time (clock ticks since boot, field 22
// of /proc/<pid>/stat) and the boot id all match. Executors, the gateway and
// runnerd use it to prove a recorded process alive or dead.
package procid

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrZombie reports a process that exited but was not reaped yet.
var ErrZombie = errors.New("process is a zombie")

// StartTicks returns pid's start time in clock ticks since boot. The comm
// field may contain spaces and parentheses, so fields are counted after the
// last ')'. A zombie is ErrZombie: it can no longer act.
func StartTicks(pid int) (uint64, error) {
	return startTicksAt("/proc/" + strconv.Itoa(pid) + "/stat")
}

// startTicksAt reads the start time from a /proc/<pid>/stat file.
func startTicksAt(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, errors.New("proc stat: no comm field")
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return 0, errors.New("proc stat: too few fields")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, ErrZombie
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// BootID returns this boot's id (/proc/sys/kernel/random/boot_id), "" when
// unknown.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Alive reports whether pid is alive and still the process that started at
// startTicks during boot (boot "" skips the boot check). The start time must
// match exactly.
func Alive(pid int, startTicks uint64, boot string) bool {
	if pid <= 0 || (boot != "" && boot != BootID()) {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	t, err := StartTicks(pid)
	return err == nil && t == startTicks
}

// Exists reports whether some live (non-zombie) process has this pid; use it
// only when no start time was recorded.
func Exists(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	_, err := StartTicks(pid)
	return err == nil
}

// Dead reports whether the recorded process is provably gone on this host:
// recorded on this boot, and no such pid, a zombie, or a pid now owned by a
// process that started at another time. A process recorded on another boot
// (or without a pid) cannot be proven dead from here.
func Dead(pid int, startTicks uint64, boot string) bool {
	if pid <= 0 || boot == "" || boot != BootID() {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	t, err := StartTicks(pid)
	if errors.Is(err, ErrZombie) || errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && t != startTicks
}

// signalNames are the conventional names of the signals a process is
// usually ended by (syscall.Signal's String gives descriptions instead,
// e.g. "killed" for SIGKILL).
var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

// SignalName is the conventional name of sig ("SIGKILL"), or "signal <n>".
func SignalName(sig syscall.Signal) string {
	if n, ok := signalNames[sig]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(sig))
}

// DescribeExit says how a reaped process ended: "killed by signal SIGKILL"
// or "exited with status 3".
func DescribeExit(ps *os.ProcessState) string {
	if ps == nil {
		return "exited"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by signal " + SignalName(ws.Signal())
	}
	return "exited with status " + strconv.Itoa(ps.ExitCode())
}
