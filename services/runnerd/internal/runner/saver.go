package runner

import (
	"fmt"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// The state document is rewritten atomically (a temporary file, fsync,
// rename, directory fsync: milliseconds on a busy disk). The loop encodes
// each snapshot itself (it owns the state) and hands it to a saver
// goroutine, so it can go on journaling and sending events while the
// snapshot is written. Snapshots are numbered; the saver writes them in
// order and, when several wait, only the newest (it contains the others).
// What needs a snapshot durable waits for its number: an effect waits for
// its intent (save), an answer is sent once its outcome is durable
// (answerWhenSaved) — unless the outcome went to the intent log
// (journalOutcomes), which a later snapshot covers.

type saveResult struct {
	gen uint64
	err error
}

type stateSaver struct {
	store *statedir.Store
	wake  chan struct{}
	done  chan saveResult
	quit  chan struct{}
	exit  chan struct{}

	mu   sync.Mutex
	next []byte // newest snapshot not yet being written
	gen  uint64 // its number
}

func startSaver(store *statedir.Store) *stateSaver {
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
func (j *journal) saveAsync() (uint64, error) {
	if j.saveErr != nil {
		return 0, j.saveErr
	}
	// Events the state follows from are journaled first (and their
	// source seqs are then taken).
	j.host.flushHeld()
	b, err := runnerstate.Encode(j.st)
	if err != nil {
		return 0, fmt.Errorf("runner_state_write_failed: %w", err)
	}
	j.saveGen++
	if j.saved != nil {
		if snap, err := runnerstate.Decode(b); err == nil {
			if j.savedSnaps == nil {
				j.savedSnaps = map[uint64]*runnerstate.State{}
			}
			j.savedSnaps[j.saveGen] = snap
		}
	}
	j.ackDirty = false // the snapshot holds the cursor
	j.saveOnAck = 0    // and what waited for an acknowledgement
	j.outcomesOwed = time.Time{}
	j.snapDue = time.Time{} // and a turn's end waiting for its turn
	j.snappedAt = time.Now()
	if j.intents != nil {
		if j.snapCovers == nil {
			j.snapCovers = map[uint64]logCover{}
		}
		j.snapCovers[j.saveGen] = logCover{intents: j.st.LastControllerCommandSeq, outcomes: j.st.LastOutcomeSeq}
	}
	if j.saver == nil {
		j.onSaved(saveResult{gen: j.saveGen, err: j.store.Write(b)})
		return j.saveGen, j.saveErr
	}
	j.saver.submit(b, j.saveGen)
	return j.saveGen, nil
}

// waitSaved blocks until snapshot gen is durable.
func (j *journal) waitSaved(gen uint64) error {
	for j.saveErr == nil && j.savedGen < gen {
		j.onSaved(<-j.saver.done)
	}
	return j.saveErr
}

// onSaved records a written snapshot and sends the answers it made
// durable. A failed write is fatal: nothing more is answered.
func (j *journal) onSaved(res saveResult) {
	if j.saveErr != nil {
		return
	}
	if res.err != nil {
		j.saveErr = fmt.Errorf("runner_state_write_failed: %w", res.err)
		j.answers = nil
		j.log.Error("cannot persist runner state", "err", res.err)
		j.host.journalFailed()
		return
	}
	j.savedGen = max(j.savedGen, res.gen)
	if j.saved != nil {
		snap := j.savedSnaps[res.gen]
		delete(j.savedSnaps, res.gen)
		if snap == nil {
			snap = j.st
		}
		j.saved(snap)
	}
	if j.intents != nil {
		covers := j.snapCovers[res.gen]
		for g := range j.snapCovers {
			if g <= res.gen {
				delete(j.snapCovers, g)
			}
		}
		if covers.intents >= j.intentsTo && covers.outcomes >= j.outcomesTo && j.intents.Size() >= intentLogResetBytes {
			if err := j.intents.Reset(); err != nil {
				j.log.Warn("cannot empty the intent log", "err", err)
			}
		}
	}
	j.flushAnswers()
}

// intentLogResetBytes: the intent log is emptied (once a durable state
// covers it) from this size on.
const intentLogResetBytes = 64 << 10

// logCover is what a snapshot's state covers of the intent log: the
// intents up to a controller seq, the outcome records up to a seq.
type logCover struct{ intents, outcomes uint64 }

// journalOutcomes makes the outcomes of the commands that just ran (recs,
// final) durable before they are answered: one outcome record appended to
// the intent log (one fdatasync) with the state the commands left (see
// runnerstate.OutcomeBatch). The state document follows lazily: a later
// snapshot covers the record (lastOutcomeSeq), and until then a restart
// applies it over the document.
func (j *journal) journalOutcomes(recs []*runnerstate.CommandRecord, withInput bool) error {
	st := j.st
	b := &runnerstate.OutcomeBatch{Seq: st.LastOutcomeSeq + 1, Commands: recs, CurrentRun: st.CurrentRun,
		ActiveTurn: st.ActiveTurn, LastTurnID: st.LastTurnID}
	if withInput {
		b.SessionInput = st.SessionInput
	}
	in := statedir.IntentOf(recs[len(recs)-1])
	in.Outcomes = b
	if err := j.appendLog("command outcomes", in); err != nil {
		return err
	}
	st.LastOutcomeSeq = b.Seq
	j.outcomesTo = b.Seq
	if j.outcomesOwed.IsZero() {
		j.outcomesOwed = time.Now()
	}
	return nil
}

// appendLog appends ins to the intent log (one fdatasync). A failed append
// fails the journal as a failed snapshot does: nothing waiting is answered.
func (j *journal) appendLog(what string, ins ...statedir.Intent) error {
	if err := j.intents.Append(ins...); err != nil {
		err = fmt.Errorf("runner_state_write_failed: intent log: %w", err)
		j.saveErr = err
		j.answers = nil
		j.log.Error("cannot journal "+what, "err", err)
		j.host.journalFailed()
		return err
	}
	return nil
}

// journalIntents makes the intents of commands about to run durable before
// their effects: appended to the intent log (one fdatasync), or without a
// log by saving the state.
func (j *journal) journalIntents(ins []statedir.Intent) error {
	if j.intents == nil {
		return j.save()
	}
	if err := j.appendLog("command intents", ins...); err != nil {
		return err
	}
	for _, in := range ins {
		j.intentsTo = max(j.intentsTo, in.ControllerSeq)
	}
	return nil
}

// flushAnswers sends the waiting answers whose snapshot is durable. Each
// answer leaves the queue before it is sent: a send that fails drops the
// connection, which saves the state, whose settlement comes back here
// (re-entrantly) and must find only the answers not yet taken.
func (j *journal) flushAnswers() {
	for len(j.answers) > 0 && j.answers[0].gen <= j.savedGen {
		a := j.answers[0]
		j.answers = j.answers[1:]
		j.host.sendResult(a.rec)
	}
}

// answerWhenSaved sends recs (in order, after every answer already
// waiting) once snapshot gen is durable.
func (j *journal) answerWhenSaved(gen uint64, recs []*runnerstate.CommandRecord) {
	for _, rec := range recs {
		j.answers = append(j.answers, pendingAnswer{gen: gen, rec: rec})
	}
	j.flushAnswers()
}

// settleSaves waits for every snapshot asked for (and so sends every answer
// waiting for one).
func (j *journal) settleSaves() error {
	if j.saver == nil {
		return j.saveErr
	}
	return j.waitSaved(j.saveGen)
}
