package codex

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/procid"
)

// waitLoop reaps the provider.
func (s *Session) waitLoop() {
	if s.cmd == nil {
		// A transport ends with its connection: the reader saw it close.
		<-s.readerDone
		close(s.procDone)
		return
	}
	_ = s.cmd.Wait()
	s.mu.Lock()
	s.procState = s.cmd.ProcessState
	s.mu.Unlock()
	close(s.procDone)
}

// stderrLoop keeps a bounded, sanitized tail of provider stderr and logs each
// line at debug level.
func (s *Session) stderrLoop() {
	defer close(s.stderrDone)
	if s.stderr == nil {
		return
	}
	readBoundedLines(s.stderr, stderrLineMax, func(line []byte, truncated bool) {
		text := sanitizeLogLine(string(line))
		if truncated {
			text += " …[truncated]"
		}
		s.stderrTail.add(text)
		s.log.Debug("codex: provider stderr", "pid", s.info.PID, "line", text)
	})
}

// monitor decides why the session ended, fails it, terminates what is left of
// the process group and waits for the session's goroutines.
func (s *Session) monitor() {
	defer close(s.monitorDone)
	var cause *Error
	select {
	case <-s.procDone:
		// Let stdout deliver what the process wrote before it exited.
		s.drainStdout()
		if cause = s.getReaderFatal(); cause == nil {
			cause = s.exitCause()
		}
	case <-s.readerDone:
		if cause = s.getReaderFatal(); cause == nil {
			if s.awaitExit() {
				cause = s.exitCause()
			} else if rerr := s.getReaderErr(); rerr != nil {
				cause = errorf(failure.ProviderTransportFailed, "read harness stdout: %s", rerr.Error())
			} else {
				cause = errorf(failure.ProviderStdoutClosed, "harness closed its stdout while still running")
			}
		}
	case <-s.writeBroken:
		if s.awaitExit() {
			s.drainStdout()
			cause = s.exitCause()
		} else {
			s.mu.Lock()
			cause = s.writeErr
			s.mu.Unlock()
		}
	}
	if s.getReaderFatal() != nil {
		// Nothing more will be read: release a provider blocked writing the
		// rest of an oversize frame (it gets EPIPE).
		_ = s.stdout.Close()
	}
	s.mu.Lock()
	if s.closing && cause.Code != failure.ProviderFrameTooLarge && cause.Code != failure.ProviderTransportFailed {
		cause = errorf(failure.ProviderClosed, "harness closed by runnerd (%s)", cause.Message)
	}
	s.mu.Unlock()
	s.fail(cause)

	s.startTermination(failGrace)
	<-s.termDone
	<-s.procDone
	// Everything in the group is gone; a stray holder of the pipes outside the
	// group must not keep the readers alive.
	if !waitFor(s.readerDone, exitDrainWindow) {
		_ = s.stdout.Close()
		<-s.readerDone
	}
	if !waitFor(s.stderrDone, exitDrainWindow) {
		_ = s.stderr.Close() // not nil: without stderr the loop is done
		<-s.stderrDone
	}
	_ = s.stdout.Close()
	if s.stderr != nil {
		_ = s.stderr.Close()
	}
	s.closeStdin()
	s.log.Info("codex: provider session ended", "pid", s.info.PID, "code", cause.Code)
}

// drainStdout waits, after the process exited, until stdout reached EOF or
// the reader sits idle without progress for a window (something outside the
// leader, e.g. a grandchild, still holds the pipe). A reader busy in a slow
// emit is waited for.
func (s *Session) drainStdout() {
	last := int64(-1)
	for {
		if waitFor(s.readerDone, exitDrainWindow) {
			return
		}
		n := s.readerFrames.Load()
		if !s.readerBusy.Load() && n == last {
			return
		}
		last = n
	}
}

// awaitExit reports whether the process exited (and was reaped) shortly
// after stdout closed or stdin broke. A zombie is exiting for sure and is
// waited for; a live process gets exitWait to exit.
func (s *Session) awaitExit() bool {
	deadline := time.Now().Add(exitWait)
	for {
		if waitFor(s.procDone, pollInterval) {
			return true
		}
		if st, err := readProcStat(s.info.PID); s.cmd != nil && err == nil && (st.State == 'Z' || st.State == 'X') {
			<-s.procDone
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (s *Session) getReaderFatal() *Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readerFatal
}

func (s *Session) getReaderErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readerErr
}

// exitCause describes the reaped process.
func (s *Session) exitCause() *Error {
	s.mu.Lock()
	ps := s.procState
	s.mu.Unlock()
	if s.cmd == nil {
		return errorf(failure.ProviderProcessExited, "the provider host closed the connection")
	}
	if ps == nil {
		return errorf(failure.ProviderProcessExited, "harness process exited")
	}
	return errorf(failure.ProviderProcessExited, "harness process %s", procid.DescribeExit(ps))
}

// fail records the first failure, fails pending calls and the active turn
// (unless Config.ReconcileOnExit leaves it to the caller), and closes
// Exited. Only the monitor calls it. It holds emitMu throughout:
// turn.failed is the last event, and every TurnResult is on TurnDone before
// Exited closes.
func (s *Session) fail(cause *Error) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	if s.failErr != nil {
		s.mu.Unlock()
		return
	}
	s.failErr = cause
	t := s.turn
	s.turn = nil
	s.mu.Unlock()

	s.log.Warn("codex: provider session failed", "pid", s.info.PID, "code", cause.Code, "message", cause.Message)
	s.conn.Fail(cause)
	// Open runtime requests and tool calls die with the provider; the
	// provider does not re-issue them after a resume (replayAllowed false).
	reason := failure.ProviderProcessLost
	if cause.Code == failure.ProviderClosed {
		reason = failure.SessionClosed
	}
	s.expireRequests("", reason, true)
	// A lost provider's turn may be reconciled by the caller; a protocol
	// failure (a frame too large, a malformed frame) fails it here.
	lost := cause.Code == failure.ProviderProcessExited || cause.Code == failure.ProviderStdoutClosed
	if t != nil && !(s.cfg.ReconcileOnExit && lost) {
		res := TurnResult{
			TurnID: t.id, Status: TurnFailed, FinalMessage: t.finalMessage, Usage: t.usage,
			ErrorCode: cause.Code, ErrorMessage: cause.Message, Artifacts: t.artifacts(),
		}
		s.emitFn(Event{Type: "turn.failed", TurnID: t.id, Priority: PriorityP0, Payload: map[string]any{
			"status":       TurnFailed,
			"finalMessage": t.finalMessage,
			"error":        map[string]any{"code": cause.Code, "message": cause.Message},
		}})
		s.deliverTurn(res)
	}
	close(s.exited)
}

func (s *Session) closeStdin() {
	s.stdinOnce.Do(func() {
		s.stdinClosed.Store(true)
		// Not under the write lock: closing unblocks a write stuck on a full pipe.
		_ = s.stdin.Close()
	})
}

func (s *Session) startTermination(grace time.Duration) {
	s.termOnce.Do(func() { go s.terminate(grace) })
}

// terminate: close stdin; wait up to grace for the leader to exit; SIGTERM
// the group if anything is left; wait up to grace for the group to vanish;
// SIGKILL the group. killNow skips the waits.
func (s *Session) terminate(grace time.Duration) {
	defer close(s.termDone)
	s.closeStdin()
	s.waitUntil(grace, true, func() bool { return isClosed(s.procDone) })
	if isClosed(s.procDone) && !procgroup.Alive(s.info.PGID) {
		return
	}
	s.signal(syscall.SIGTERM)
	if s.waitUntil(grace, true, s.groupGone) {
		return
	}
	s.signal(syscall.SIGKILL)
	if !s.waitUntil(killWait, false, s.groupGone) {
		s.log.Error("codex: provider process group survived SIGKILL", "pgid", s.info.PGID)
	}
}

func (s *Session) groupGone() bool {
	return isClosed(s.procDone) && !procgroup.Alive(s.info.PGID)
}

func (s *Session) signal(sig syscall.Signal) {
	if s.cmd == nil {
		// A transport has no process here: closing it ends the session
		// (the host, seeing its client gone, keeps or stops its provider).
		_ = s.stdout.Close()
		return
	}
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.log.Debug("codex: signal provider", "signal", sig.String(), "err", err)
	}
	procgroup.Signal(s.info.PGID, sig)
}

// waitUntil polls cond until it holds (true) or d elapsed (false). With
// interruptible, killNow ends the wait early (false).
func (s *Session) waitUntil(d time.Duration, interruptible bool, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	procDone := s.procDone
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if interruptible {
			select {
			case <-tick.C:
			case <-procDone:
				procDone = nil // wake once on reaping, then poll
			case <-s.killNow:
				return cond()
			}
		} else {
			<-tick.C
		}
	}
}

func waitFor(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (s *Session) deliverTurn(r TurnResult) {
	select {
	case s.turnDone <- r:
	default:
		s.log.Error("codex: TurnDone buffer full; turn result dropped", "turn", r.TurnID, "status", r.Status)
	}
}
