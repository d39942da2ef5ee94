package runner

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// journal is runnerd's durable memory of one state dir: the outbox of
// events (appended and fsynced before anything is sent), the intent log of
// commands about to run and of the outcomes of those that ran, the state
// document (snapshots written by the saver, saver.go), the command answers
// waiting for a durable snapshot, and the events held back for the next
// batch. Which events to emit and
// what a failure means are the Runner's; the journal reaches back only
// through journalHost. The loop goroutine owns it.
type journal struct {
	log   *slog.Logger
	host  journalHost
	st    *runnerstate.State
	saved func(*runnerstate.State) // Config.StateSaved (tests)
	// savedSnaps holds, while a saved hook is set, each pending snapshot
	// as encoded, so that the hook sees what was written rather than the
	// live state (which may have moved on by the time the write is done).
	savedSnaps map[uint64]*runnerstate.State

	store   *statedir.Store
	outbox  *statedir.Outbox
	intents *statedir.IntentLog // nil: intents are made durable by saving the state
	saver   *stateSaver         // nil: snapshots are written synchronously

	// Snapshots: saveGen is the newest asked for, savedGen the newest
	// durable; saveErr is a failed write (fatal).
	saveGen, savedGen uint64
	saveErr           error
	answers           []pendingAnswer
	// intentsTo is the newest controller seq in the intent log and
	// outcomesTo its newest outcome record; snapCovers maps a snapshot to
	// what its state covers, so the log is emptied once a durable one
	// covers it all.
	intentsTo, outcomesTo uint64
	snapCovers            map[uint64]logCover
	// outcomesOwed is when the state first held outcomes only the intent
	// log has (zero: none): a snapshot follows lazily (Runner.checkTimers).
	outcomesOwed time.Time
	// ackDirty: the acknowledged cursor moved since the last snapshot. It
	// is persisted lazily (see Runner.applyAck).
	ackDirty bool
	// saveOnAck: a snapshot is due once the controller acknowledged this
	// source seq (0: none; see Runner.saveWhenAcked); owedSince is when
	// it was asked for.
	saveOnAck uint64
	owedSince time.Time
	// snappedAt is when the newest snapshot was asked for; snapDue, when
	// not zero, is when a turn's end that was acknowledged within
	// Config.TurnSnapshotEvery of it is saved (see Runner.saveTurnEnd).
	snappedAt time.Time
	snapDue   time.Time

	// hold: events emitted now are held (held, no source seq yet) and
	// journaled with the next batch — the provider events after a turn
	// starts, or before the next state save at the latest (see
	// onCommands).
	hold bool
	held []pendingEvent
	// cursor is the provider host cursor of the batch being journaled (it
	// goes on the batch's last record).
	cursor uint64
}

// journalHost is what the journal needs from the runner it serves.
type journalHost interface {
	// flushHeld journals the held events (the state about to be saved
	// follows from them).
	flushHeld()
	// sendResult sends a command's answer (its outcome is durable).
	sendResult(rec *runnerstate.CommandRecord)
	// journalFailed ends the runner at once: it can no longer remember.
	journalFailed()
}

// openJournal opens the intent log and the outbox of store's dir for st,
// the state loaded from it: commands journaled in the intent log after the
// last save are replayed into st, a torn outbox tail is truncated, and st's
// cursors move past what the outbox holds.
func openJournal(store *statedir.Store, st *runnerstate.State, cfg *Config, host journalHost) (*journal, error) {
	j := &journal{log: cfg.Logger, host: host, st: st, saved: cfg.StateSaved, store: store}
	il, intents, err := statedir.OpenIntentLog(store.Dir)
	if err != nil {
		return nil, fmt.Errorf("intent log: %w", err)
	}
	j.intents = il
	if n := statedir.ReplayIntents(st, intents); n > 0 {
		j.log.Info("commands journaled in the intent log after the last state save", "commands", n)
	}
	ob, dropped, err := statedir.OpenOutbox(store.Dir, st.AckedSourceSeq)
	if err != nil {
		_ = il.Close()
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if dropped > 0 {
		j.log.Warn("outbox had a torn tail; truncated", "bytes", dropped)
	}
	ob.AfterSync = cfg.OutboxSynced
	j.outbox = ob
	st.NextSourceSeq = max(st.NextSourceSeq, ob.LastSeq()+1, st.AckedSourceSeq+1)
	st.ProviderCursor = max(st.ProviderCursor, ob.ProviderCursor())
	return j, nil
}

// startSaving hands snapshots to a saver goroutine from now on.
func (j *journal) startSaving() { j.saver = startSaver(j.store) }

// results delivers the saver's written snapshots (nil without a saver).
func (j *journal) results() <-chan saveResult {
	if j.saver == nil {
		return nil
	}
	return j.saver.done
}

// close stops the saver (after the loop waited for its snapshots) and
// closes the files.
func (j *journal) close() {
	if j.saver != nil {
		j.saver.stop()
		j.saver = nil
	}
	if j.outbox != nil {
		_ = j.outbox.Close()
	}
	if j.intents != nil {
		_ = j.intents.Close()
	}
}

// save writes the state and waits until it is durable.
func (j *journal) save() error {
	gen, err := j.saveAsync()
	if err != nil {
		return err
	}
	return j.waitSaved(gen)
}

// append journals recs (one fsync); the provider host cursor of the batch
// goes on its last record.
func (j *journal) append(recs []statedir.Record) error {
	if j.cursor > 0 {
		recs[len(recs)-1].ProviderCursor = j.cursor
	}
	return j.outbox.Append(recs...)
}
