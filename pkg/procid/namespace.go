package procid

import (
	"os"
	"strconv"
)

// PIDNamespace returns this process's PID namespace as the kernel names it
// ("pid:[4026531836]", from /proc/self/ns/pid), "" when unknown. A pid means
// the same process only to processes of the same PID namespace: two
// containers on one host (one boot id) each have their own pid 1.
func PIDNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}

// procIsOwn reports whether /proc shows this process's PID namespace: a
// process started in a new PID namespace without its own /proc mount (e.g.
// `unshare --pid --fork` without --mount-proc) sees the parent namespace's
// pids there, and no pid it reads there may be compared with its own.
func procIsOwn() bool {
	self, err := os.Readlink("/proc/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
}

// SelfStartTicks is StartTicks of this process, read through /proc/self
// (right also when /proc belongs to another PID namespace).
func SelfStartTicks() (uint64, error) { return startTicksAt("/proc/self/stat") }

// Identity names a process across PID reuse, reboots and PID namespaces.
type Identity struct {
	BootID string
	// PIDNamespace is the namespace PID is valid in (see PIDNamespace).
	PIDNamespace string
	PID          int
	StartTicks   uint64
}

// Self is this process's identity.
func Self() Identity {
	ticks, _ := SelfStartTicks()
	return Identity{BootID: BootID(), PIDNamespace: PIDNamespace(), PID: os.Getpid(), StartTicks: ticks}
}

// ProvablyDead reports whether the recorded process is provably gone, as
// seen from this process: it was recorded on this boot and in this PID
// namespace (which this process's /proc shows), and Dead holds for its pid
// and start time. A process of another boot, another PID namespace, or one
// recorded without a namespace cannot be proven dead from here: its pid
// names another process in this namespace, if any.
func ProvablyDead(id Identity) bool {
	if id.PIDNamespace == "" || id.PIDNamespace != PIDNamespace() || !procIsOwn() {
		return false
	}
	return Dead(id.PID, id.StartTicks, id.BootID)
}
