package runner

import (
	"fmt"
	"sync"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/durable"
)

// The state document is rewritten atomically (a temporary file, fsync,
// rename, directory fsync: milliseconds on a busy disk). The loop encodes
// each snapshot itself (it owns the state) and hands it to a saver
// goroutine, so it can go on journaling and sending events while the
// snapshot is written. Snapshots are numbered; the saver writes them in
// order and, when several wait, only the newest (it contains the others).
// What needs a snapshot durable waits for its number: an effect waits for
// its intent (save), an answer is sent once its outcome is durable
// (answerWhenSaved).

type saveResult struct {
	gen uint64
	err error
}

type stateSaver struct {
	store *durable.Store
	wake  chan struct{}
	done  chan saveResult
	quit  chan struct{}
	exit  chan struct{}

	mu   sync.Mutex
	next []byte // newest snapshot not yet being written
	gen  uint64 // its number
}

func startSaver(store *durable.Store) *stateSaver {
	s := &stateSaver{store: store, wake: make(chan struct{}, 1), done: make(chan saveResult, 64),
		quit: make(chan struct{}), exit: make(chan struct{})}
	go s.run()
	return s
}

func (s *stateSaver) submit(b []byte, gen uint64) {
	s.mu.Lock()
	s.next, s.gen = b, gen
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stateSaver) run() {
	defer close(s.exit)
	for {
		select {
		case <-s.wake:
		case <-s.quit:
			return
		}
		for {
			s.mu.Lock()
			b, gen := s.next, s.gen
			s.next = nil
			s.mu.Unlock()
			if b == nil {
				break
			}
			// done is drained by the loop; at most a few results are ever
			// outstanding (one per snapshot the loop asked for).
			s.done <- saveResult{gen: gen, err: s.store.Write(b)}
		}
	}
}

// stop ends the saver goroutine (after the loop waited for its snapshots).
func (s *stateSaver) stop() {
	close(s.quit)
	<-s.exit
}

// pendingAnswer is a command outcome to send once snapshot gen is durable.
type pendingAnswer struct {
	gen uint64
	rec *runnerstate.CommandRecord
}

// saveAsync encodes the state and has it written (synchronously without a
// saver); it returns the snapshot's number.
func (r *Runner) saveAsync() (uint64, error) {
	if r.saveErr != nil {
		return 0, r.saveErr
	}
	// Events the state follows from are journaled first (and their
	// source seqs are then taken).
	r.flushHeld()
	b, err := runnerstate.Encode(r.st)
	if err != nil {
		return 0, fmt.Errorf("runner_state_write_failed: %w", err)
	}
	r.saveGen++
	r.ackDirty = false // the snapshot holds the cursor
	if r.intents != nil {
		if r.snapCovers == nil {
			r.snapCovers = map[uint64]uint64{}
		}
		r.snapCovers[r.saveGen] = r.st.LastControllerCommandSeq
	}
	if r.saver == nil {
		r.onSaved(saveResult{gen: r.saveGen, err: r.store.Write(b)})
		return r.saveGen, r.saveErr
	}
	r.saver.submit(b, r.saveGen)
	return r.saveGen, nil
}

// waitSaved blocks until snapshot gen is durable.
func (r *Runner) waitSaved(gen uint64) error {
	for r.saveErr == nil && r.savedGen < gen {
		r.onSaved(<-r.saver.done)
	}
	return r.saveErr
}

// onSaved records a written snapshot and sends the answers it made
// durable. A failed write is fatal: nothing more is answered.
func (r *Runner) onSaved(res saveResult) {
	if r.saveErr != nil {
		return
	}
	if res.err != nil {
		r.saveErr = fmt.Errorf("runner_state_write_failed: %w", res.err)
		r.pendingAnswers = nil
		r.log.Error("cannot persist runner state", "err", res.err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
		return
	}
	r.savedGen = max(r.savedGen, res.gen)
	if r.cfg.StateSaved != nil {
		r.cfg.StateSaved(r.st)
	}
	if r.intents != nil {
		covers := r.snapCovers[res.gen]
		for g := range r.snapCovers {
			if g <= res.gen {
				delete(r.snapCovers, g)
			}
		}
		if covers >= r.intentsTo && r.intents.Size() >= intentLogResetBytes {
			if err := r.intents.Reset(); err != nil {
				r.log.Warn("cannot empty the intent log", "err", err)
			}
		}
	}
	r.flushAnswers()
}

// intentLogResetBytes: the intent log is emptied (once a durable state
// covers it) from this size on.
const intentLogResetBytes = 64 << 10

// journalIntents makes the intents of commands about to run durable before
// their effects: appended to the intent log (one fdatasync), or without a
// log by saving the state.
func (r *Runner) journalIntents(ins []durable.Intent) error {
	if r.intents == nil {
		return r.save()
	}
	if err := r.intents.Append(ins...); err != nil {
		err = fmt.Errorf("runner_state_write_failed: intent log: %w", err)
		r.saveErr = err
		r.pendingAnswers = nil
		r.log.Error("cannot journal command intents", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
		return err
	}
	for _, in := range ins {
		r.intentsTo = max(r.intentsTo, in.ControllerSeq)
	}
	return nil
}

// flushAnswers sends the waiting answers whose snapshot is durable. Each
// answer leaves the queue before it is sent: a send that fails drops the
// connection, which saves the state, whose settlement comes back here
// (re-entrantly) and must find only the answers not yet taken.
func (r *Runner) flushAnswers() {
	for len(r.pendingAnswers) > 0 && r.pendingAnswers[0].gen <= r.savedGen {
		a := r.pendingAnswers[0]
		r.pendingAnswers = r.pendingAnswers[1:]
		r.sendResult(a.rec)
	}
}

// answerWhenSaved sends recs (in order, after every answer already
// waiting) once snapshot gen is durable.
func (r *Runner) answerWhenSaved(gen uint64, recs []*runnerstate.CommandRecord) {
	for _, rec := range recs {
		r.pendingAnswers = append(r.pendingAnswers, pendingAnswer{gen: gen, rec: rec})
	}
	r.flushAnswers()
}

// settleSaves waits for every snapshot asked for (and so sends every answer
// waiting for one).
func (r *Runner) settleSaves() error {
	if r.saver == nil {
		return r.saveErr
	}
	return r.waitSaved(r.saveGen)
}

// saveSoon has the state written without waiting (for changes nobody waits
// on); a failure is fatal as for mustSave.
func (r *Runner) saveSoon() {
	if _, err := r.saveAsync(); err != nil && r.saveErr == nil {
		r.log.Error("cannot persist runner state", "err", err)
		r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
	}
}
