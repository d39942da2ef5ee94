// Package runnerstate is the disk contract of runner/runner-state.json: the
// runner state document runnerd writes and the gateway and the durable
// scope rules read. It is the one schema of that file.
package runnerstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// StateSchema names the runner state document.
const StateSchema = "tether.runner.durable.state.v1"

// Dir is the runner directory inside a scope's state root, and StateFile
// the state document's name inside it.
const (
	Dir       = "runner"
	StateFile = "runner-state.json"
)

// Path is the state document's path under a scope's state root.
func Path(stateRoot string) string { return filepath.Join(stateRoot, Dir, StateFile) }

// MaxProcessedCommands bounds the command journal.
const MaxProcessedCommands = 128

// Lifecycle values.
const (
	LifecycleConnecting         = "connecting"
	LifecycleReady              = "ready"
	LifecycleBackpressure       = "backpressure"
	LifecycleDraining           = "draining"
	LifecycleSuspended          = "suspended"
	LifecycleStopped            = "stopped"
	LifecycleRevoked            = "revoked"
	LifecycleRecoverableFailure = "recoverable_failure"
	LifecycleUnrecoverable      = "unrecoverable"
)

// Command statuses.
const (
	StatusPending       = "pending"
	StatusCompleted     = "completed"
	StatusFailed        = "failed"
	StatusRejected      = "rejected"
	StatusIndeterminate = "indeterminate"
	// StatusUnexecuted: a command a restart cut short whose effect provably
	// never happened (SPEC R8); it runs when the controller resends it.
	StatusUnexecuted = "unexecuted"
)

// Identity is the identity tuple the state is bound to.
type Identity struct {
	RunnerInstanceID    string `json:"runnerInstanceId"`
	EnvironmentLeaseID  string `json:"environmentLeaseId"`
	NormalizedSessionID string `json:"normalizedSessionId"`
	SessionScope        string `json:"sessionScope"`
}

// Process identifies an OS process (pid reuse is caught by start ticks).
type Process struct {
	PID        int       `json:"pid"`
	PGID       int       `json:"pgid,omitempty"`
	StartTicks uint64    `json:"startTicks"`
	BootID     string    `json:"bootId,omitempty"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
}

// RunRef is the attached run.
type RunRef struct {
	RunID   string `json:"runId"`
	Attempt uint64 `json:"attempt"`
}

// Turn is the provider turn in progress.
type Turn struct {
	TurnID  string `json:"turnId"`
	RunID   string `json:"runId"`
	Attempt uint64 `json:"attempt"`
	// CommandID is the turn.start that started the turn: a controller
	// tells the loss of its own turn from that of an earlier generation's.
	CommandID string    `json:"commandId,omitempty"`
	StartedAt time.Time `json:"startedAt"`
}

// CommandRecord is one journaled command.
type CommandRecord struct {
	CommandID     string         `json:"commandId"`
	ControllerSeq uint64         `json:"controllerSeq"`
	CommandType   string         `json:"commandType"`
	RunID         string         `json:"runId,omitempty"`
	Attempt       uint64         `json:"attempt,omitempty"`
	Status        string         `json:"status"`
	Fingerprint   string         `json:"fingerprint"`
	Code          string         `json:"code,omitempty"`
	Message       string         `json:"message,omitempty"`
	Result        map[string]any `json:"result,omitempty"`
	ReceivedAt    time.Time      `json:"receivedAt"`

	// encoded caches the record's JSON once it is final (any status but
	// pending): a final record is never changed again, and the journal is
	// encoded on every save of the state.
	encoded []byte
}

// Reopen sets the outcome of a record a restart cut short (SPEC R8: the
// outcome its reconciliation found, or pending again when it runs after
// all), dropping the cached encoding of its former outcome.
func (r *CommandRecord) Reopen(status, code, msg string, result map[string]any) {
	r.Status, r.Code, r.Message, r.Result, r.encoded = status, code, msg, result, nil
}

// Final reports whether the record holds the command's outcome.
func (r *CommandRecord) Final() bool { return r.Status != StatusPending }

// CommandJournal is the journal of processed commands by command id. It
// encodes as a JSON object with sorted keys, each final record encoded once.
type CommandJournal map[string]*CommandRecord

// commandRecordJSON is CommandRecord without its methods (for encoding).
type commandRecordJSON CommandRecord

// MarshalJSON encodes the journal like encoding/json encodes a map, reusing
// the cached encoding of final records.
func (j CommandJournal) MarshalJSON() ([]byte, error) {
	if j == nil {
		return []byte("null"), nil
	}
	keys := make([]string, 0, len(j))
	for k := range j {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	buf := make([]byte, 0, 512*len(keys)+2)
	buf = append(buf, '{')
	for i, k := range keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		buf = append(append(buf, kb...), ':')
		rec := j[k]
		if rec == nil {
			buf = append(buf, "null"...)
			continue
		}
		enc := rec.encoded
		if enc == nil || !rec.Final() {
			if enc, err = json.Marshal((*commandRecordJSON)(rec)); err != nil {
				return nil, err
			}
			if rec.Final() {
				rec.encoded = enc
			}
		}
		buf = append(buf, enc...)
	}
	return append(buf, '}'), nil
}

// State is runner/runner-state.json.
type State struct {
	Schema                   string   `json:"schema"`
	Identity                 Identity `json:"identity"`
	Lifecycle                string   `json:"lifecycle"`
	LifecycleReason          string   `json:"lifecycleReason,omitempty"`
	NextSourceSeq            uint64   `json:"nextSourceSeq"`
	AckedSourceSeq           uint64   `json:"ackedSourceSeq"`
	LastControllerCommandSeq uint64   `json:"lastControllerCommandSeq"`
	// LastOutcomeSeq is the newest outcome record of the intent log the
	// document covers (see OutcomeBatch).
	LastOutcomeSeq   uint64   `json:"lastOutcomeSeq,omitempty"`
	ReconnectCount   uint64   `json:"reconnectCount"`
	RunnerProcess    *Process `json:"runnerProcess,omitempty"`
	ProviderProcess  *Process `json:"providerProcess,omitempty"`
	ProviderThreadID string   `json:"providerThreadId,omitempty"`
	// ProviderCursor is the provider host seq through which every provider
	// line's events are journaled (see the provhost package).
	ProviderCursor uint64  `json:"providerCursor,omitempty"`
	CurrentRun     *RunRef `json:"currentRun,omitempty"`
	ActiveTurn     *Turn   `json:"activeTurn,omitempty"`
	// LastTurnID is the newest provider turn a turn.start started on the
	// current thread; a fresh thread clears it (its turn ids may repeat an
	// earlier thread's).
	LastTurnID      string            `json:"lastTurnId,omitempty"`
	HighestAttempts map[string]uint64 `json:"highestAttempts,omitempty"`
	// AttemptRuns orders HighestAttempts' runs, oldest first: only the
	// MaxTrackedRuns most recently seen runs are kept (see NoteAttempt).
	AttemptRuns  []string        `json:"attemptRuns,omitempty"`
	SessionInput json.RawMessage `json:"sessionInput,omitempty"`
	// Backpressure is set while non-P0 events are rejected for lack of
	// outbox space; BackpressureDropped counts them.
	Backpressure        bool           `json:"backpressure,omitempty"`
	BackpressureDropped uint64         `json:"backpressureDropped,omitempty"`
	PeakOutboxBytes     uint64         `json:"peakOutboxBytes,omitempty"`
	ProcessedCommands   CommandJournal `json:"processedCommands,omitempty"`
	// OpenRequests are the runtime requests and tool calls announced to the
	// controller and not settled yet, by "request:<id>" / "tool:<callId>":
	// after a runnerd crash they are announced expired (SPEC R8).
	OpenRequests map[string]*OpenRequest `json:"openRequests,omitempty"`
	// LostTurns are the latest turns lost with their provider (turn.lost),
	// by turn id, at most MaxLostTurns: a controller that took the run over
	// and resends the command that started one learns it again (SPEC R7).
	LostTurns map[string]*LostTurn `json:"lostTurns,omitempty"`
	// LastTurnEvent is the newest turn whose turn.<status> event
	// (turn.completed, turn.failed or turn.interrupted) runnerd journaled.
	// A turn reconciled after a loss of its provider or of runnerd has
	// its result, not its event, delivered again: the event is journaled
	// once per turn (SPEC R7, X1). Set when the event is journaled, so
	// every later snapshot holds it; a restart also reads it from the
	// outbox (the event outlives no snapshot unacknowledged). A journaled
	// turn.started clears it: it names the newest turn only, and a
	// restarted provider may reuse a turn id.
	LastTurnEvent *TurnEvent `json:"lastTurnEvent,omitempty"`
	UpdatedAt     time.Time  `json:"updatedAt"`
}

// TurnUsage is a turn's own token usage.
type TurnUsage struct {
	InputTokens       int64 `json:"inputTokens"`
	CachedInputTokens int64 `json:"cachedInputTokens"`
	OutputTokens      int64 `json:"outputTokens"`
}

// TurnEvent is a journaled turn.<status> event: its turn, type and source
// seq.
type TurnEvent struct {
	TurnID    string `json:"turnId"`
	EventType string `json:"eventType"`
	SourceSeq uint64 `json:"sourceSeq"`
	// Usage is the turn's own token usage as the event reported it (its
	// payload's usage), nil when it reported none: a reconciled result,
	// which a provider's record may not carry usage for, settles the turn
	// with it (SPEC E1: the run.terminal's runDelta).
	Usage *TurnUsage `json:"usage,omitempty"`
}

// MaxLostTurns bounds State.LostTurns.
const MaxLostTurns = 16

// LostTurn is a turn lost with its provider: its run and the payload of its
// turn.lost event.
type LostTurn struct {
	RunID   string         `json:"runId"`
	Payload map[string]any `json:"payload"`
	LostAt  time.Time      `json:"lostAt"`
}

// NoteLostTurn records a lost turn, dropping the oldest beyond MaxLostTurns.
func (st *State) NoteLostTurn(turnID string, lt *LostTurn) {
	if st.LostTurns == nil {
		st.LostTurns = map[string]*LostTurn{}
	}
	st.LostTurns[turnID] = lt
	for len(st.LostTurns) > MaxLostTurns {
		oldest := ""
		for id, t := range st.LostTurns {
			if oldest == "" || t.LostAt.Before(st.LostTurns[oldest].LostAt) {
				oldest = id
			}
		}
		delete(st.LostTurns, oldest)
	}
}

// OpenRequest is one announced, unsettled runtime request or tool call: the
// run and turn it belongs to and the fields of its announcement its expiry
// repeats (the JSON of a prpv1.RuntimeRequestEvent or ToolCallEvent).
type OpenRequest struct {
	RunID  string          `json:"runId,omitempty"`
	TurnID string          `json:"turnId,omitempty"`
	ItemID string          `json:"itemId,omitempty"`
	Fields json.RawMessage `json:"fields"`
}

// NewState returns a fresh state for id.
func NewState(id Identity) *State {
	return &State{
		Schema:            StateSchema,
		Identity:          id,
		Lifecycle:         LifecycleConnecting,
		NextSourceSeq:     1,
		HighestAttempts:   map[string]uint64{},
		ProcessedCommands: CommandJournal{},
	}
}

// Encode bounds the command journal, stamps the state and encodes it as the
// document Write stores. Compact JSON: the document is rewritten on every
// save, so its size is on the hot path of every command.
func Encode(st *State) ([]byte, error) {
	st.pruneCommands()
	st.UpdatedAt = time.Now().UTC()
	// The journal is spliced in after the other fields: encoding/json would
	// re-scan (compact) its whole MarshalJSON output on every save.
	journal := st.ProcessedCommands
	st.ProcessedCommands = nil
	b, err := json.Marshal(st)
	st.ProcessedCommands = journal
	if err != nil {
		return nil, err
	}
	if len(journal) > 0 {
		j, err := journal.MarshalJSON()
		if err != nil {
			return nil, err
		}
		b = append(append(append(b[:len(b)-1], `,"processedCommands":`...), j...), '}')
	}
	return append(b, '\n'), nil
}

// pruneCommands keeps the MaxProcessedCommands most recent commands.
func (st *State) pruneCommands() {
	if len(st.ProcessedCommands) <= MaxProcessedCommands {
		return
	}
	recs := make([]*CommandRecord, 0, len(st.ProcessedCommands))
	for _, r := range st.ProcessedCommands {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].ControllerSeq != recs[j].ControllerSeq {
			return recs[i].ControllerSeq < recs[j].ControllerSeq
		}
		return recs[i].ReceivedAt.Before(recs[j].ReceivedAt)
	})
	for _, r := range recs[:len(recs)-MaxProcessedCommands] {
		delete(st.ProcessedCommands, r.CommandID)
	}
}

// MaxTrackedRuns bounds how many runs' highest attempts a runner keeps: a
// warm runner serves run after run, and its state document must not grow
// with each. Fencing an older run's stale attempt is the gateway's and the
// executor's lease's job as well; the runner keeps the recent ones.
const MaxTrackedRuns = 256

// NoteAttempt records attempt as run runID's highest seen (callers check
// that it is not lower) and forgets the least recently first-seen runs
// beyond MaxTrackedRuns.
func (st *State) NoteAttempt(runID string, attempt uint64) {
	if st.HighestAttempts == nil {
		st.HighestAttempts = map[string]uint64{}
	}
	if _, ok := st.HighestAttempts[runID]; !ok {
		st.AttemptRuns = append(st.AttemptRuns, runID)
	}
	st.HighestAttempts[runID] = attempt
	for len(st.AttemptRuns) > MaxTrackedRuns {
		delete(st.HighestAttempts, st.AttemptRuns[0])
		st.AttemptRuns = st.AttemptRuns[1:]
	}
}

// Decode parses a state document and fills what older documents lack.
func Decode(b []byte) (*State, error) {
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("runner state is not valid JSON: %w", err)
	}
	if st.Schema != StateSchema {
		return nil, fmt.Errorf("runner state has unknown schema %q", st.Schema)
	}
	if st.HighestAttempts == nil {
		st.HighestAttempts = map[string]uint64{}
	}
	if len(st.AttemptRuns) != len(st.HighestAttempts) {
		// A document from before AttemptRuns: its runs in a stable order.
		st.AttemptRuns = st.AttemptRuns[:0]
		for id := range st.HighestAttempts {
			st.AttemptRuns = append(st.AttemptRuns, id)
		}
		sort.Strings(st.AttemptRuns)
	}
	if st.ProcessedCommands == nil {
		st.ProcessedCommands = CommandJournal{}
	}
	if st.NextSourceSeq == 0 {
		st.NextSourceSeq = 1
	}
	return &st, nil
}

// Read reads the state document under a scope's state root as its readers
// (the gateway, the scope rules) see it: (nil, nil) when there is none. The
// schema is not enforced here; runnerd's own load is strict.
func Read(stateRoot string) (*State, error) {
	b, err := os.ReadFile(Path(stateRoot))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("runner state is not valid JSON: %w", err)
	}
	return &st, nil
}
