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

// StallTurnRecorded is the "[stall:turn-recorded]" prompt marker (tests
// only, with Options.DieOnceDir): once per prompt, after the turn was
// recorded and saved, the fake logs "stall:turn-recorded" to its call log
// and holds its answer to turn/start until the file ReleaseFile(phase)
// exists in DieOnceDir (at most StallLimit) — a window in which a test
// kills the provider's client (runnerd) with the turn started but not
// answered.
const StallTurnRecorded = "turn-recorded"

// StallMidStream is the "[stall:mid-stream]" prompt marker (tests only,
// with Options.DieOnceDir): once per prompt, after the reply's first delta
// the fake logs "stall:mid-stream" to its call log and sends the turn's
// next delta only once the file ReleaseFile(phase) exists in DieOnceDir
// (at most StallLimit). Unlike "[stall:turn-recorded]" it holds only that
// turn: the server keeps answering requests meanwhile. A test keeps a turn
// in flight for as long as it needs (a drain, a replica's SIGTERM) and
// then lets it end at once, instead of streaming slow deltas that must
// outlast the slowest machine.
const StallMidStream = "mid-stream"

// StallLimit bounds a "[stall:…]" marker's hold.
const StallLimit = time.Minute

// ReleaseFile is the file (in DieOnceDir) that ends a stall at phase.
func ReleaseFile(phase string) string { return "release-" + phase }

// dieAt kills the process with SIGKILL when prompt asks for phase and the
// fault has not happened yet for this prompt.
func (s *Server) dieAt(phase, prompt string) {
	if !s.once("die", phase, prompt) {
		return
	}
	s.logCall("die:" + phase)
	_ = s.out.Flush()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for { // SIGKILL cannot be caught; it is delivered before this returns
		time.Sleep(time.Hour)
	}
}

// stallAt holds the caller when prompt asks for phase, once, until the
// test releases it (ReleaseFile).
func (s *Server) stallAt(phase, prompt string) {
	if !s.once("stall", phase, prompt) {
		return
	}
	s.logCall("stall:" + phase)
	release := filepath.Join(s.opts.DieOnceDir, ReleaseFile(phase))
	for deadline := time.Now().Add(StallLimit); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(release); err == nil {
			return
		}
	}
}

// stallMidStream starts the "[stall:mid-stream]" hold of at, once per
// prompt: called after the reply's first delta.
func (s *Server) stallMidStream(at *activeTurn) {
	if !s.once("stall", StallMidStream, at.prompt) {
		return
	}
	s.logCall("stall:" + StallMidStream)
	at.stallUntil = time.Now().Add(StallLimit)
}

// stalled reports whether at's "[stall:mid-stream]" hold still holds: no
// release file yet and StallLimit not over.
func (s *Server) stalled(at *activeTurn) bool {
	if at.stallUntil.IsZero() {
		return false
	}
	_, err := os.Stat(filepath.Join(s.opts.DieOnceDir, ReleaseFile(StallMidStream)))
	if err == nil || time.Now().After(at.stallUntil) {
		at.stallUntil = time.Time{}
		return false
	}
	return true
}

// stallPoll is how often a held turn looks for its release file.
const stallPoll = 10 * time.Millisecond

// once reports whether the "[kind:phase]" marker of prompt fires: only with
// Options.DieOnceDir, and only the first time (a synced sentinel in that
// directory records it).
func (s *Server) once(kind, phase, prompt string) bool {
	dir := s.opts.DieOnceDir
	if dir == "" || !strings.Contains(prompt, "["+kind+":"+phase+"]") {
		return false
	}
	sum := sha256.Sum256([]byte(prompt))
	prefix := "died"
	if kind != "die" {
		prefix = kind
	}
	sentinel := filepath.Join(dir, fmt.Sprintf("%s-%s-%s", prefix, phase, hex.EncodeToString(sum[:8])))
	f, err := os.OpenFile(sentinel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false
	}
	if err != nil {
		s.diag("once sentinel %s: %v", sentinel, err)
		return false
	}
	_ = f.Sync()
	_ = f.Close()
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return true
}
