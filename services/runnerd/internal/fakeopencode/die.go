package fakeopencode

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DieMidStream is the "[die:mid-stream]" prompt marker's phase: after the
// reply's first delta was published (the turn is recorded, its assistant
// message unfinished).
const DieMidStream = "mid-stream"

// dieAt SIGKILLs the server when prompt holds "[die:<phase>]", once per
// prompt: only with Options.DieOnceDir, and only when the sentinel for the
// phase and prompt is not there yet (it is written and synced first, so
// the retried turn lives).
func (s *Server) dieAt(phase, prompt string) {
	dir := s.opts.DieOnceDir
	if dir == "" || !strings.Contains(prompt, "[die:"+phase+"]") {
		return
	}
	sum := sha256.Sum256([]byte(prompt))
	sentinel := filepath.Join(dir, fmt.Sprintf("died-%s-%s", phase, hex.EncodeToString(sum[:8])))
	f, err := os.OpenFile(sentinel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) || err != nil {
		return
	}
	_ = f.Sync()
	_ = f.Close()
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	s.CallLog("die:" + phase)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for { // SIGKILL cannot be caught; it is delivered before this returns
		time.Sleep(time.Hour)
	}
}
