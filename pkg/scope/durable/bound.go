package durable

import (
	"encoding/json"
	"path/filepath"

	"github.com/tether-run/tether/pkg/runnerstate"
)

// A warm run on a live runner is bound to the scope without rewriting the
// control plane (SPEC P4: that rewrite was two fsyncs on every warm turn's
// critical path). The gateway authorises the run exactly as before (the
// live process is the proof of ownership, the previous run's attachment
// has ended) and forwards its run.attach, which runnerd journals in its
// intent log (fdatasync, the same sync as the turn's turn.start) before any
// of its effects, and keeps in its state document. So the run that holds a
// scope is the control plane's, unless the runner of the control plane's
// identity journaled a later run.attach: one with a controller seq above
// the control plane's attachSeq (the runner's seq when the control plane
// was last bound; a runner's seqs only grow, and a restore or a new runner
// state comes with a new Bind). Then it is the run of the latest such
// run.attach. Every reader of the binding (Prepare, ReadControlPlaneIdentity,
// so the gateway's previous-run bookkeeping) applies this rule.

// journalRead is what the binding rule needs of the runner's journal.
type journalRead struct {
	// lastSeq is the highest controller seq the runner journaled.
	lastSeq uint64
	// attachSeq and attachRun name the latest run.attach above the
	// caller's floor (attachRun empty: none).
	attachSeq uint64
	attachRun string
}

// readJournal reads root's runner state document and intent log (either
// may be missing or torn: what is readable counts) for the run.attach
// commands journaled above floor.
func readJournal(root string, floor uint64) journalRead {
	dir := filepath.Join(root, RunnerDir)
	var j journalRead
	j.attachSeq = floor
	var st runnerstate.State
	if raw, err := readBounded(filepath.Join(dir, RunnerStateFile)); err == nil && json.Unmarshal(raw, &st) == nil {
		j.lastSeq = st.LastControllerCommandSeq
		oldest := uint64(0)
		for _, c := range st.ProcessedCommands {
			if c == nil {
				continue
			}
			if oldest == 0 || c.ControllerSeq < oldest {
				oldest = c.ControllerSeq
			}
			if c.CommandType == runnerstate.CmdRunAttach && c.RunID != "" && c.ControllerSeq > j.attachSeq {
				j.attachSeq, j.attachRun = c.ControllerSeq, c.RunID
			}
		}
		// The journal keeps the most recent commands only: when those
		// after the floor were pruned, the run attached last is the
		// document's current run.
		if j.attachRun == "" && st.CurrentRun != nil && st.CurrentRun.RunID != "" && oldest > floor+1 && st.LastControllerCommandSeq > floor {
			j.attachRun = st.CurrentRun.RunID
		}
	}
	if raw, err := readBounded(filepath.Join(dir, runnerstate.IntentLogFile)); err == nil {
		for _, in := range runnerstate.ParseIntents(raw) {
			j.lastSeq = max(j.lastSeq, in.ControllerSeq)
			// Intents the document covers are in it already.
			if in.ControllerSeq > st.LastControllerCommandSeq && in.CommandType == runnerstate.CmdRunAttach &&
				in.RunID != "" && in.ControllerSeq > j.attachSeq {
				j.attachSeq, j.attachRun = in.ControllerSeq, in.RunID
			}
		}
	}
	return j
}

// boundIdentity applies the binding rule to root's control-plane identity
// id, bound at attachSeq; the runner state must be id's (checked by the
// caller, ReadRunnerLifecycle).
func boundIdentity(root string, id Identity, attachSeq uint64) Identity {
	if j := readJournal(root, attachSeq); j.attachRun != "" {
		id.RunID = j.attachRun
	}
	return id
}

// journalSeq is the highest controller seq root's runner journaled: a
// Bind's attachSeq.
func journalSeq(root string) uint64 { return readJournal(root, 0).lastSeq }
