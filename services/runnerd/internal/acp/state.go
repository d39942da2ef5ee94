package acp

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/failure"
)

// The durable provider state (SPEC R11): one small JSON document in the
// driver's state directory, written atomically (fsynced) before each
// prompt is sent and after it ends. It is bounded: MaxTurnRecords turn
// records, each final message cut to MaxRecordedMessage bytes, and a
// document larger than MaxStateBytes is refused on read.
const (
	StateFile          = "acp-session.json"
	StateSchema        = "tether.acpx.session/v1"
	MaxTurnRecords     = 32
	MaxRecordedMessage = 4 << 10
	MaxStateBytes      = 256 << 10
)

// Identity is what a resume must match (SPEC R11: record id, agent session
// id, profile digest, workspace digest, model, permission mode). The field
// names are the ACPX provider session identity's (backup harness rules).
type Identity struct {
	Kind             string `json:"kind"` // "acpx"
	Agent            string `json:"agent"`
	RecordID         string `json:"acpxRecordId"`
	AgentSessionID   string `json:"agentSessionId"`
	BackendSessionID string `json:"backendSessionId"`
	ProfileDigest    string `json:"profileDigest"`
	WorkspaceDigest  string `json:"workspaceDigest"`
	RequestedModel   string `json:"requestedModel"`
	EffectiveModel   string `json:"effectiveModel"`
	PermissionMode   string `json:"permissionMode"`
}

// TurnRecord is what the state keeps of one turn.
type TurnRecord struct {
	TurnID       string `json:"turnId"`
	Status       string `json:"status"` // "started" until it ends, then the TurnResult status
	StopReason   string `json:"stopReason,omitempty"`
	FinalMessage string `json:"finalMessage,omitempty"`
	Usage        *Usage `json:"usage,omitempty"`
	// Total is the session's cumulative usage when the turn ended, and
	// Cost the turn's own cost as reported: a reconciled result carries
	// them as the live one did (SPEC E1).
	Total        *Usage    `json:"total,omitempty"`
	Cost         *TurnCost `json:"cost,omitempty"`
	ErrorCode    string    `json:"errorCode,omitempty"`
	ErrorMessage string    `json:"errorMessage,omitempty"`
	StartedAt    time.Time `json:"startedAt"`
}

// TurnCost is a turn's own cost in a currency.
type TurnCost struct {
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
}

// State is the document.
type State struct {
	Schema   string   `json:"schema"`
	Identity Identity `json:"identity"`
	// AgentMode is the mode the session was switched to ("" kept default).
	AgentMode string `json:"agentMode,omitempty"`
	TurnSeq   int64  `json:"turnSeq"`
	// Cumulative usage and cost of the session (all turns of all processes).
	Cumulative Usage   `json:"cumulative"`
	CostAmount float64 `json:"costAmount,omitempty"`
	Currency   string  `json:"costCurrency,omitempty"`
	// Turns are the newest MaxTurnRecords turns, oldest first.
	Turns     []TurnRecord `json:"turns"`
	UpdatedAt time.Time    `json:"updatedAt"`
}

// turn returns the record of turnID, nil when the state does not keep it.
func (s *State) turn(id string) *TurnRecord {
	for i := range s.Turns {
		if s.Turns[i].TurnID == id {
			return &s.Turns[i]
		}
	}
	return nil
}

// addTurn appends a record, dropping the oldest beyond the bound.
func (s *State) addTurn(r TurnRecord) {
	s.Turns = append(s.Turns, r)
	if n := len(s.Turns) - MaxTurnRecords; n > 0 {
		s.Turns = append([]TurnRecord(nil), s.Turns[n:]...)
	}
}

// ReadState reads dir's state; (nil, nil) when there is none.
func ReadState(dir string) (*State, error) {
	f, err := os.Open(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxStateBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxStateBytes {
		return nil, &Error{Code: failure.RunnerHarnessStateMismatch, Message: fmt.Sprintf("ACP state %s exceeds %d bytes", StateFile, MaxStateBytes)}
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil || s.Schema != StateSchema {
		return nil, &Error{Code: failure.RunnerHarnessStateMismatch, Message: "ACP state " + StateFile + " is not a " + StateSchema + " document"}
	}
	return &s, nil
}

func writeState(dir string, s *State) error {
	s.Schema = StateSchema
	s.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(dir, StateFile, b, 0o600)
}

// CheckIdentity compares the identity a resume wants with the recorded one
// and names the first field that differs (runner_harness_state_mismatch).
// The agent session id and the effective model are the agent's: they are
// checked against the agent's answer to session/load, not here.
func CheckIdentity(recorded, want Identity) error {
	for _, f := range []struct{ name, got, want string }{
		{"acpxRecordId", recorded.RecordID, want.RecordID},
		{"agent", recorded.Agent, want.Agent},
		{"profileDigest", recorded.ProfileDigest, want.ProfileDigest},
		{"workspaceDigest", recorded.WorkspaceDigest, want.WorkspaceDigest},
		{"requestedModel", recorded.RequestedModel, want.RequestedModel},
		{"permissionMode", recorded.PermissionMode, want.PermissionMode},
	} {
		if f.got != f.want {
			return &Error{Code: failure.RunnerHarnessStateMismatch,
				Message: fmt.Sprintf("ACP session record %s: %s is %q, the run wants %q", recorded.RecordID, f.name, f.got, f.want)}
		}
	}
	if recorded.AgentSessionID == "" {
		return &Error{Code: failure.RunnerHarnessStateMismatch, Message: "ACP session record " + recorded.RecordID + " has no agent session id"}
	}
	return nil
}

func newRecordID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "acpx-" + hex.EncodeToString(b)
}
