package dispatch

import (
	"os"

	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// SelfController identifies this process for same-host takeover proofs.
func SelfController() store.Controller {
	ticks, _ := procid.StartTicks(os.Getpid())
	return store.Controller{BootID: procid.BootID(), PID: os.Getpid(), StartTicks: ticks}
}

// ControllerDead reports whether the recorded controller process is provably
// gone on this host: no such pid, a zombie, or a pid now owned by a process
// that started at another time (PID reuse).
func ControllerDead(c store.Controller) bool {
	return procid.Dead(c.PID, c.StartTicks, c.BootID)
}
