package statedir

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/synctrace"
)

// IntentLogFile is the intent log's name inside the runner directory.
const IntentLogFile = runnerstate.IntentLogFile

// Intent is a command journaled as received, before any of its effects.
type Intent = runnerstate.Intent

// IntentOf is the intent of a journal record.
func IntentOf(r *runnerstate.CommandRecord) Intent {
	return Intent{CommandID: r.CommandID, ControllerSeq: r.ControllerSeq, CommandType: r.CommandType, RunID: r.RunID,
		Attempt: r.Attempt, Fingerprint: r.Fingerprint, ReceivedAt: r.ReceivedAt}
}

// IntentLog is an append-only log of command intents, the cheap way to make
// an intent durable before its effect: one append and one fdatasync, where
// a save of the state document rewrites a file and syncs it and its
// directory. The state document stays the truth: an intent is in the log
// only until a saved document holds its command (every new command holds
// the next controller seq, so the document covers exactly the intents with
// a seq up to its lastControllerCommandSeq; see ReplayIntents). The log
// also holds outcome records (Intent.Outcomes: the outcomes of commands
// that ran, journaled before they are answered), numbered: the document
// covers those up to its lastOutcomeSeq. The log is emptied only once a
// saved document covers every record in it. Each line is
// "<crc32c hex> <intent JSON>\n"; a torn or corrupt tail is dropped on open.
type IntentLog struct {
	dir  string
	f    *os.File
	size int64
}

// OpenIntentLog opens (creating) dir/intents.log and returns its intents.
func OpenIntentLog(dir string) (*IntentLog, []Intent, error) {
	path := filepath.Join(dir, IntentLogFile)
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return nil, nil, err
	}
	l := &IntentLog{dir: dir, f: f}
	ins, err := l.load()
	if err == nil {
		err = SyncDir(dir)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return l, ins, nil
}

func (l *IntentLog) load() ([]Intent, error) {
	br := bufio.NewReader(l.f)
	var (
		ins []Intent
		off int64
	)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		in, ok := runnerstate.DecodeIntent(line)
		if !ok {
			break // torn or corrupt tail: everything from here is dropped
		}
		ins = append(ins, in)
		off += int64(len(line))
		if err != nil {
			break
		}
	}
	if _, err := truncateTail(l.f, off); err != nil {
		return nil, err
	}
	l.size = off
	return ins, nil
}

// Append writes the intents and syncs their data before returning: they are
// durable then.
func (l *IntentLog) Append(ins ...Intent) error {
	if len(ins) == 0 {
		return nil
	}
	defer synctrace.BeginNote("runnerd.intents", ins[0].RunID, func() string {
		return synctrace.Types(len(ins), func(i int) string { return ins[i].CommandType })
	})()
	var buf bytes.Buffer
	for _, in := range ins {
		if err := runnerstate.AppendFrame(&buf, in); err != nil {
			return err
		}
	}
	if _, err := l.f.Write(buf.Bytes()); err != nil {
		// Leave no half line behind for the next append.
		_ = l.f.Truncate(l.size)
		_, _ = l.f.Seek(l.size, io.SeekStart)
		return err
	}
	if err := fdatasync(l.f); err != nil {
		return err
	}
	l.size += int64(buf.Len())
	return nil
}

// dataSyncs counts fdatasync calls (tests: the logs' appends sync their
// data with it, not with a full fsync).
var dataSyncs atomic.Int64

func fdatasync(f *os.File) error {
	dataSyncs.Add(1)
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// Size is the log's size in bytes.
func (l *IntentLog) Size() int64 { return l.size }

// Reset empties the log once a saved state document covers its intents. It
// is not synced: intents the document covers are ignored if they come back.
func (l *IntentLog) Reset() error {
	if l.size == 0 {
		return nil
	}
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	l.size = 0
	_, err := l.f.Seek(0, io.SeekStart)
	return err
}

// Close closes the log file.
func (l *IntentLog) Close() error { return l.f.Close() }

// ReplayIntents puts the intents a saved state does not cover back into it:
// the commands with a controller seq after its lastControllerCommandSeq,
// in seq order, as pending records (a recovering runner makes them
// indeterminate: never re-executed), with the seq cursor and the highest
// attempts they moved. It returns how many it restored.
//
// An outcome record (Intent.Outcomes) the state does not cover is applied
// over it: its commands are completed with their journaled outcomes (a
// resent one gets its stored answer, never runs again) and the state they
// left is restored.
func ReplayIntents(st *runnerstate.State, ins []Intent) int {
	n := 0
	for _, in := range ins {
		if in.Outcomes != nil {
			if st.ApplyOutcomes(in.Outcomes) {
				n += len(in.Outcomes.Commands)
			}
			continue
		}
		if in.ControllerSeq <= st.LastControllerCommandSeq {
			continue // covered by the document
		}
		st.LastControllerCommandSeq = in.ControllerSeq
		if in.RunID != "" && in.Attempt > st.HighestAttempts[in.RunID] {
			st.NoteAttempt(in.RunID, in.Attempt)
		}
		if _, ok := st.ProcessedCommands[in.CommandID]; ok {
			continue
		}
		st.ProcessedCommands[in.CommandID] = &runnerstate.CommandRecord{
			CommandID: in.CommandID, ControllerSeq: in.ControllerSeq, CommandType: in.CommandType, RunID: in.RunID,
			Attempt: in.Attempt, Status: runnerstate.StatusPending, Fingerprint: in.Fingerprint, ReceivedAt: in.ReceivedAt,
		}
		n++
	}
	return n
}

// ReadIntentLog reads the intents in dir/intents.log without changing it
// (none when there is no log); a torn or corrupt tail ends them.
func ReadIntentLog(dir string) ([]Intent, error) {
	b, err := readPrivateFile(filepath.Join(dir, IntentLogFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return runnerstate.ParseIntents(b), nil
}
