package dispatch

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// SelfController identifies this process for same-host takeover proofs.
func SelfController() store.Controller {
	ticks, _ := startTicks(os.Getpid())
	return store.Controller{BootID: bootID(), PID: os.Getpid(), StartTicks: ticks}
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// startTicks reads field 22 of /proc/<pid>/stat (the command may contain
// spaces and parentheses, so fields are counted after the last ')').
func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// ControllerDead reports whether the recorded controller process is provably
// gone on this host: no such pid, or a pid now owned by a process that
// started at another time (PID reuse). A zombie counts as dead.
func ControllerDead(c store.Controller) bool {
	if c.PID <= 0 || c.BootID == "" || c.BootID != bootID() {
		return false // not provable from here
	}
	if err := syscall.Kill(c.PID, 0); err == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.PID))
	if err != nil {
		return os.IsNotExist(err)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 0 && f[0] == "Z" {
			return true
		}
	}
	ticks, err := startTicks(c.PID)
	return err == nil && ticks != c.StartTicks
}
