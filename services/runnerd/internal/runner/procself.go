package runner

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// procStartTicks reads field 22 (starttime) of /proc/<pid>/stat. The comm
// field may contain spaces and parentheses, so fields are counted from the
// last ')'.
func procStartTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, errors.New("proc stat: no comm field")
	}
	rest := strings.Fields(string(b[end+1:]))
	if len(rest) < 20 {
		return 0, errors.New("proc stat: too few fields")
	}
	return strconv.ParseUint(rest[22-3], 10, 64)
}

// bootID returns /proc/sys/kernel/random/boot_id.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// sameProcessAlive reports whether pid is alive and still the process that
// started at startTicks during boot bootID.
func sameProcessAlive(pid int, startTicks uint64, boot string) bool {
	if pid <= 0 || (boot != "" && boot != bootID()) {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	t, err := procStartTicks(pid)
	return err == nil && t == startTicks
}
