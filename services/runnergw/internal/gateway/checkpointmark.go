package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// A scope's local runner state may be older than the scope: a gateway that
// was lost and came back with its disk holds the roots of scopes that were
// failed over and ran elsewhere since. When such a scope is placed here
// again, its Open carries its current checkpoint, and that checkpoint —
// not the local root — is the scope's state (no runner attached since it
// was taken). The checkpoint mark tells the two apart without a download:
// this gateway writes it when it checkpoints a suspended runner or restores
// a checkpoint, naming the checkpoint and the digest of the runner state
// document at that moment. Local state that is not exactly the checkpoint's
// (another checkpoint, or a runner state changed since) is moved aside and
// the checkpoint restored.

// checkpointMarkFile lives in the scope's root, outside the checkpointed
// directories.
const checkpointMarkFile = "checkpoint-mark.json"

type checkpointMark struct {
	CheckpointID      string `json:"checkpointId"`
	RunnerStateSHA256 string `json:"runnerStateSha256"`
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// markCheckpoint records that the scope's runner state is now checkpoint
// id's.
func markCheckpoint(scopeDir, id string) error {
	state, err := readScopeFile(scopeDir, durable.RunnerDir, filepath.Base(runnerstate.Path(scopeDir)), durable.MaxIdentityBytes)
	if err != nil {
		return err
	}
	b, err := json.Marshal(checkpointMark{CheckpointID: id, RunnerStateSHA256: digest(state)})
	if err != nil {
		return err
	}
	return writeScopeFile(scopeDir, "", checkpointMarkFile, b)
}

// olderStateOf reports whether the scope's runner state on disk is provably
// older than the checkpoint of spec, so that the checkpoint, not the local
// root, is the scope's state (SPEC F9). It reads the local root's runner
// identity, its checkpoint mark and how far it produced (its state
// document and outbox, runnerstate.ProducedThrough) and decides by order
// (StaleRoot), never by mere difference.
func (g *Gateway) olderStateOf(sc string, spec *gatewayv1.RestoreSpec, prior []*gatewayv1.PriorRun) bool {
	dir := g.stateDir(sc)
	st, produced, ok := runnerstate.ProducedThrough(dir)
	if !ok {
		return false
	}
	m, _ := readMark(dir)
	servedBefore := servedScope(st.Identity.RunnerInstanceID, spec, prior)
	return StaleRoot(LocalRoot{ServedBefore: servedBefore,
		RunnerInstanceID: st.Identity.RunnerInstanceID, SessionScope: st.Identity.SessionScope,
		NormalizedSessionID: st.Identity.NormalizedSessionID, Produced: produced,
		MarkedCheckpoint: m.CheckpointID, RunServedElsewhere: runServedElsewhere(dir, st.Identity.RunnerInstanceID, prior),
	}, sc, spec)
}

// runServedElsewhere reports whether the run the scope root's control plane
// names (under the root's runner inst) is, by the executor's records (the
// Open's prior runs), terminal and served by another runner instance: the
// root's runner was cut off in that run before the executor recorded it
// (its host died right after the launch), and a later attempt ran the run
// on another runner, which the scope went on with.
func runServedElsewhere(dir, inst string, prior []*gatewayv1.PriorRun) bool {
	id, _, err := durable.ReadControlPlaneIdentity(dir)
	if err != nil || id == nil || id.RunID == "" || inst == "" || id.RunnerInstanceID != inst {
		return false
	}
	for _, p := range prior {
		if p.GetRunId() == id.RunID {
			return p.GetTerminal() && p.GetRunnerInstanceId() != "" && p.GetRunnerInstanceId() != inst
		}
	}
	return false
}

// servedScope reports whether runner instance id served runs of the scope
// by the executor's records: the Open's restore names it among the scope's
// runners, or one of its prior runs does.
func servedScope(id string, spec *gatewayv1.RestoreSpec, prior []*gatewayv1.PriorRun) bool {
	if id == "" {
		return false
	}
	if slices.Contains(spec.GetServedRunnerIds(), id) {
		return true
	}
	return slices.ContainsFunc(prior, func(p *gatewayv1.PriorRun) bool { return p.GetRunnerInstanceId() == id })
}

// LocalRoot is what the gateway knows of a scope's root on its disk.
type LocalRoot struct {
	RunnerInstanceID    string
	SessionScope        string
	NormalizedSessionID string
	// Produced is the highest source seq the root's runner produced.
	Produced uint64
	// MarkedCheckpoint is the checkpoint this gateway last took or
	// restored into the root (checkpoint-mark.json), empty when none.
	MarkedCheckpoint string
	// ServedBefore: the executor's records of the scope's earlier runs
	// (the Open's RestoreSpec.served_runner_ids or prior runs) name the
	// root's runner as one that served them.
	ServedBefore bool
	// RunServedElsewhere: the run the root's control plane names is, by
	// the executor's records, terminal and served by another runner (the
	// root's runner was cut off in it before it was recorded).
	RunServedElsewhere bool
}

// StaleRoot decides whether local, the root of scope sc, is provably older
// than the checkpoint of spec (the scope's current checkpoint, or the one
// a run in flight started from), by recorded order (SPEC F9, R13):
//
//   - The same runner instance: the checkpoint is the root's state when
//     this gateway never took or restored it into this root (the mark names
//     another checkpoint or none: the scope moved and the checkpoint was
//     taken elsewhere since), or when the root produced fewer events than
//     the executor holds from that runner (spec.MinSourceSeq: the runner
//     continued on another gateway). A root that descends from the
//     checkpoint and produced at least what the executor holds is the
//     newest copy of the thread (e.g. runnerd killed during the first turn
//     after the checkpoint, its turn.start journaled): it is kept, and its
//     journal resumed, so no journaled command runs twice.
//   - Another runner instance that served earlier runs of the scope (the
//     executor's records say so): a root left behind by a move (a fresh
//     runner elsewhere took the scope over, e.g. after ReplaceSession); the
//     checkpoint names the scope's current runner, so the root is set aside
//     and the checkpoint restored.
//   - Another runner instance the records do not name, whose root's
//     control plane names a run the records hold as ended and served by
//     another runner: the root's runner was launched for that run and cut
//     off (its host died) before the executor recorded it, and a later
//     attempt ran the run elsewhere; the scope went on from there. The
//     root is a branch nothing continues: set aside, the checkpoint
//     restored (not quarantined by the durable-state rules as a prior run
//     ended with its runner not suspended, which failed the run).
//   - A root of a runner the records do not name otherwise, or of another
//     scope or session, is not judged here: the durable-state rules refuse
//     it (quarantined, nothing starts; SPEC C3).
func StaleRoot(local LocalRoot, sc string, spec *gatewayv1.RestoreSpec) bool {
	stamp := spec.GetStamp()
	if local.SessionScope != "" && local.SessionScope != sc {
		return false
	}
	if a, b := local.NormalizedSessionID, stamp.GetNormalizedSessionId(); a != "" && b != "" && a != b {
		return false
	}
	if local.RunnerInstanceID != stamp.GetRunnerInstanceId() {
		return local.RunnerInstanceID != "" && (local.ServedBefore || local.RunServedElsewhere)
	}
	// A root still exactly at the checkpoint is the checkpoint only while
	// the executor holds nothing newer from its runner: when it holds more
	// (a run went on from the same checkpoint on another gateway, and that
	// gateway was lost in turn), resuming this root would reuse those
	// source seqs for other events (native_event_replay_conflict on every
	// later run). It is restored instead, continuing above MinSourceSeq.
	if local.MarkedCheckpoint != spec.GetCheckpointId() {
		return true
	}
	return local.Produced < spec.GetMinSourceSeq()
}

// readMark reads the scope's checkpoint mark (zero when none).
func readMark(scopeDir string) (checkpointMark, error) {
	var m checkpointMark
	b, err := os.ReadFile(filepath.Join(scopeDir, checkpointMarkFile))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}
