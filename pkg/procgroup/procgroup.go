// Package procgroup is the one place tether starts a process as the
// leader of a process group of its own and ends that group: runnerd's
// providers and provider host, and the gateway's runnerd. A group is what
// is killed, so a provider's children (a model's tool processes, an
// agent's node workers) die with it and no orphan outlives its scope.
//
// Reaping stays with the caller (exec.Cmd.Wait): Stop is given a channel
// closed once the leader was reaped.
package procgroup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Start starts cmd as the leader of a new process group whose id is the
// child's pid (set before exec, or Start fails). Other SysProcAttr fields
// (a credential, a parent-death signal) are kept.
func Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = 0
	return cmd.Start()
}

// Signal sends sig to every member of group pgid. A group that is gone is
// not an error; pgid <= 1 is ignored (never init's, never "every process
// we may signal").
func Signal(pgid int, sig syscall.Signal) {
	if pgid <= 1 {
		return
	}
	_ = syscall.Kill(-pgid, sig)
}

// Kill sends SIGKILL to group pgid (see Signal).
func Kill(pgid int) { Signal(pgid, syscall.SIGKILL) }

// Stop ends group pgid: SIGTERM, then SIGKILL when done (closed once the
// leader was reaped) is not closed within grace or ctx ends first. It
// reports whether SIGKILL was sent. Members other than the leader may
// outlive a TERM the leader obeyed; callers that must leave nothing
// behind Kill the group afterwards.
func Stop(ctx context.Context, pgid int, done <-chan struct{}, grace time.Duration) (killed bool) {
	Signal(pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
	case <-ctx.Done():
	}
	Kill(pgid)
	return true
}

// Alive reports whether group pgid still has a member that is not a
// zombie. Zombies are ignored: an orphaned member that died but was not
// yet reaped by its new parent can no longer do anything.
func Alive(pgid int) bool {
	if pgid <= 1 {
		return false
	}
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	dir, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return true
	}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		state, pgrp, ok := stat(pid)
		if ok && pgrp == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// stat reads the state and process group of pid from /proc/<pid>/stat.
// The comm field may hold spaces and parentheses, so fields are counted
// after the last ')'.
func stat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state), f[2] field 5 (pgrp).
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgrp, true
}
