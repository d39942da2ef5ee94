package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/atomicfile"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/runnerstate"
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
	state, err := os.ReadFile(runnerstate.Path(scopeDir))
	if err != nil {
		return err
	}
	b, err := json.Marshal(checkpointMark{CheckpointID: id, RunnerStateSHA256: digest(state)})
	if err != nil {
		return err
	}
	return atomicfile.Write(scopeDir, checkpointMarkFile, b, 0o600)
}

// olderStateOf reports whether the scope's runner state on disk is an
// older state of the runner spec's checkpoint was taken from (the same
// runner instance) rather than exactly that checkpoint: it ran elsewhere
// since, and the checkpoint is the scope's state. Local state of another
// runner identity is not: the durable-state rules judge it (it is
// quarantined and nothing starts, SPEC C3).
func (g *Gateway) olderStateOf(sc string, spec *gatewayv1.RestoreSpec) bool {
	dir := g.stateDir(sc)
	state, err := os.ReadFile(runnerstate.Path(dir))
	if err != nil {
		return false
	}
	st, err := runnerstate.Decode(state)
	if err != nil || st.Identity.RunnerInstanceID != spec.GetStamp().GetRunnerInstanceId() {
		return false
	}
	return spec.GetMinSourceSeq() > 0 || !isMarked(dir, state, spec.GetCheckpointId())
}

// isMarked reports whether state (the scope's runner state document) is
// exactly checkpoint id's, as this gateway marked it.
func isMarked(scopeDir string, state []byte, id string) bool {
	b, err := os.ReadFile(filepath.Join(scopeDir, checkpointMarkFile))
	if err != nil {
		return false
	}
	var m checkpointMark
	if json.Unmarshal(b, &m) != nil || m.CheckpointID == "" || m.CheckpointID != id {
		return false
	}
	return digest(state) == m.RunnerStateSHA256
}
