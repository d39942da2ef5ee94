package dispatch

import (
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// SelfController identifies this process for same-host takeover proofs:
// boot id, PID namespace, pid and start time.
func SelfController() store.Controller {
	return store.Controller{Identity: procid.Self()}
}

// ControllerDead reports whether the recorded controller process is provably
// gone as seen from this process: recorded on this boot and in this PID
// namespace, and no such pid, a zombie, or a pid now owned by a process that
// started at another time (PID reuse). A controller in another PID namespace
// (another container on this host) is never judged dead by pid (SPEC F5).
func ControllerDead(c store.Controller) bool {
	return procid.ProvablyDead(c.Identity)
}
