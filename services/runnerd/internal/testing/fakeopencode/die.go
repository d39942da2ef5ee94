package fakeopencode

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
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

// DiePrompt is the "[die:prompt]" marker's phase: prompt_async read the
// request and the server dies before it records the prompt or answers (a
// server lost during the prompt call that never took the prompt).
const DiePrompt = "prompt"

// DiePromptRecorded is the "[die:prompt-recorded]" marker's phase: the
// prompt's user message is recorded (saved) and the server dies before it
// answers prompt_async or starts the reply (a server lost during the
// prompt call that took the prompt).
const DiePromptRecorded = "prompt-recorded"

// DropPrompt is the "[drop:prompt]" marker's phase: prompt_async cuts the
// connection before it records the prompt, and the server lives on (a
// prompt call lost on the way while the server stays up).
const DropPrompt = "drop:prompt"

// DropPromptTaken is the "[drop:prompt-taken]" marker's phase: the prompt
// is taken and answered, but prompt_async cuts the connection instead of
// its 204 (the answer lost on the way back).
const DropPromptTaken = "drop:prompt-taken"

// dropOnce reports whether prompt holds the marker of phase (a "drop:…"
// phase: "[drop:…]") for the first time (DieOnceDir sentinel, written
// first) and cuts the request's connection if so.
func (s *Server) dropOnce(w http.ResponseWriter, phase, prompt string) bool {
	if s.opts.DieOnceDir == "" || !strings.Contains(prompt, "["+phase+"]") {
		return false
	}
	f, err := os.OpenFile(s.sentinel(phase, prompt), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	_ = f.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return false
	}
	s.CallLog(phase)
	_ = conn.Close()
	return true
}

// dieAt SIGKILLs the server when prompt holds "[die:<phase>]", once per
// prompt: only with Options.DieOnceDir, and only when the sentinel for the
// phase and prompt is not there yet (it is written and synced first, so
// the retried turn lives).
func (s *Server) dieAt(phase, prompt string) {
	if !s.dieArmed(phase, prompt) {
		return
	}
	f, err := os.OpenFile(s.sentinel(phase, prompt), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) || err != nil {
		return
	}
	_ = f.Sync()
	_ = f.Close()
	if d, err := os.Open(s.opts.DieOnceDir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	s.CallLog("die:" + phase)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for { // SIGKILL cannot be caught; it is delivered before this returns
		time.Sleep(time.Hour)
	}
}

// dieArmed reports whether dieAt(phase, prompt) would kill the server.
func (s *Server) dieArmed(phase, prompt string) bool {
	if s.opts.DieOnceDir == "" || !strings.Contains(prompt, "[die:"+phase+"]") {
		return false
	}
	_, err := os.Stat(s.sentinel(phase, prompt))
	return errors.Is(err, fs.ErrNotExist)
}

func (s *Server) sentinel(phase, prompt string) string {
	sum := sha256.Sum256([]byte(prompt))
	return filepath.Join(s.opts.DieOnceDir, fmt.Sprintf("died-%s-%s", phase, hex.EncodeToString(sum[:8])))
}
