package fakecodex

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

// Fault phases of a turn at which the fake kills itself (SPEC R7 tests).
// A prompt containing "[die:<phase>]" makes the fake SIGKILL itself at that
// phase, once: only with Options.DieOnceDir set, and only when the
// sentinel for this phase and prompt is not in that directory yet (it is
// written, synced, before dying, so the retried turn lives).
const (
	// DieAtTurnStart: on receiving turn/start, before the turn is recorded
	// or answered (the provider never knew the turn).
	DieAtTurnStart = "turn-start"
	// DieMidStream: after the first agentMessage delta was written (the
	// turn is recorded in progress; it reads back interrupted).
	DieMidStream = "mid-stream"
	// DieAfterCompletion: after the completed turn was saved, before any
	// of its completion notifications was written (the provider finished
	// the turn, its client never heard).
	DieAfterCompletion = "completed"
)

// dieAt kills the process with SIGKILL when prompt asks for phase and the
// fault has not happened yet for this prompt.
func (s *Server) dieAt(phase, prompt string) {
	dir := s.opts.DieOnceDir
	if dir == "" || !strings.Contains(prompt, "[die:"+phase+"]") {
		return
	}
	sum := sha256.Sum256([]byte(prompt))
	sentinel := filepath.Join(dir, fmt.Sprintf("died-%s-%s", phase, hex.EncodeToString(sum[:8])))
	f, err := os.OpenFile(sentinel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return
	}
	if err != nil {
		s.diag("die-once sentinel %s: %v", sentinel, err)
		return
	}
	_ = f.Sync()
	_ = f.Close()
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	s.logCall("die:" + phase)
	_ = s.out.Flush()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for { // SIGKILL cannot be caught; it is delivered before this returns
		time.Sleep(time.Hour)
	}
}
