package runner

import "github.com/tether-run/tether/pkg/procid"

// procStartTicks reads field 22 (starttime) of /proc/<pid>/stat.
func procStartTicks(pid int) (uint64, error) { return procid.StartTicks(pid) }

// bootID returns /proc/sys/kernel/random/boot_id.
func bootID() string { return procid.BootID() }

// sameProcessAlive reports whether pid is alive and still the process that
// started at startTicks during boot bootID.
func sameProcessAlive(pid int, startTicks uint64, boot string) bool {
	return procid.Alive(pid, startTicks, boot)
}
