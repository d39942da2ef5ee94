package store

import "github.com/tether-run/tether/pkg/failure"

// The plain records the store reads and writes on behalf of the executor's
// domain packages. They are defined here, data only, so that the store
// imports no domain package (issue #34); the domain packages that work on
// them (audit, runtimeq, secrets) name them by aliases.

// Coordinator phases of a failed attempt (the recovery rules decide which,
// SPEC E11).
const (
	PhaseRetryableFailure = "retryable_failure"
	PhaseTerminalFailure  = "terminal_failure"
)

// Audit actions of a run's cancellation (SPEC P2, X1).
const (
	ActionCancellationIntent = "native.cancellation_intent_recorded"
	ActionCancellationAck    = "native.cancellation_acknowledged"
)

// AuditHistory is what the audit reads (AuditRows): runs, their events
// (any order), their activities, and the session checkpoints recorded.
type AuditHistory struct {
	Runs        []AuditRun
	Events      []AuditEvent
	Activities  []AuditActivity
	Checkpoints []AuditCheckpoint
}

// AuditRun is one run as stored.
type AuditRun struct {
	ID string
	// State is queued, running, succeeded, failed or cancelled.
	State string
	// Attempt is the coordinator's attempt: the run's final one once it
	// ended.
	Attempt uint64
	// EventCount is the run's stored event count.
	EventCount uint64
	// Scope is the run's session scope and Seq its submission order; the
	// wedged-session rule reads them with the failure of a failed run.
	Scope                       string
	Seq                         uint64
	FailureCode, FailureMessage string
	// RunnerInstanceID is the runner that served the run ("" if none did).
	RunnerInstanceID string
}

// Ended reports whether the run has its outcome.
func (r AuditRun) Ended() bool {
	return r.State == StateSucceeded || r.State == StateFailed || r.State == StateCancelled
}

// AuditEvent is one event row.
type AuditEvent struct {
	RunID  string
	Seq    uint64
	Type   string
	Writer uint64
	// CommandID and CommandType are set for command.executed.
	CommandID, CommandType string
	// TurnID is the provider turn of a turn event (prp.IsTurnEnd, and
	// turn.started).
	TurnID string
	// Detail is set for session.continuity_break: who replaced the
	// session, and why.
	Detail string
	// Source and SourceSeq are the event's source instance and its seq
	// there (empty: not known).
	Source    string
	SourceSeq uint64
	// EventRunID is the run the event itself names, read for turn.started
	// and command.executed ("" when not read).
	EventRunID string
}

// AuditActivity is one audit entry of a run.
type AuditActivity struct {
	RunID, Action string
}

// AuditCheckpoint is one recorded session checkpoint
// (executor.session_checkpoints).
type AuditCheckpoint struct {
	ID    string
	Scope string
	// LastRunID is the run whose idle period the checkpoint ended: the
	// checkpoint holds the thread up to that run's turn.
	LastRunID string
}

// SealedSecret is one stored secret version (SPEC S3).
type SealedSecret struct {
	// KeyID is the key that wrapped DataKey.
	KeyID string
	// DataKey is the version's data key, sealed with the key-encryption
	// key.
	DataKey []byte
	// Value is the value, sealed with the data key.
	Value []byte
}

// InteractionSpec is a durable interaction to open (idempotently, by key):
// a tether_ask_user call, or a runtime question's fallback (SPEC E4, E5).
type InteractionSpec struct {
	Kind               string           `json:"kind"`
	IdempotencyKey     string           `json:"idempotencyKey"`
	SourceRunID        string           `json:"sourceRunId"`
	Title              string           `json:"title"`
	Summary            string           `json:"summary"`
	ContinuationPolicy string           `json:"continuationPolicy"`
	Payload            QuestionsPayload `json:"payload"`
}

// QuestionsPayload is an ask_user_questions interaction's payload.
type QuestionsPayload struct {
	Version                int    `json:"version"`
	Title                  string `json:"title,omitempty"`
	SubmitLabel            string `json:"submitLabel,omitempty"`
	SupersedeOnUserComment bool   `json:"supersedeOnUserComment"`
	RuntimeRequestID       string `json:"runtimeRequestId"`
	// QuestionSet is the provider's question set, unchanged (a copy).
	QuestionSet map[string]any `json:"questionSet"`
	Questions   []Question     `json:"questions"`
}

// Question is one question of an interaction.
type Question struct {
	ID            string   `json:"id"`
	Prompt        string   `json:"prompt"`
	Required      bool     `json:"required"`
	SelectionMode string   `json:"selectionMode"`
	Options       []Option `json:"options"`
}

// Option is one answer option.
type Option struct {
	ID          string `json:"id"`
	Label       string `json:"label"`
	Description string `json:"description,omitempty"`
	FreeText    bool   `json:"freeText,omitempty"`
}

// Answer answers one question: option ids, and the text of a free-text
// option.
type Answer struct {
	QuestionID string   `json:"questionId"`
	OptionIDs  []string `json:"optionIds"`
	Text       string   `json:"text,omitempty"`
}

// AnswerError is an answer that does not fit the interaction's questions.
type AnswerError struct{ Reason string }

func (e *AnswerError) Error() string {
	return failure.Message(failure.InteractionAnswerInvalid, e.Reason)
}

// RuntimeInputMetric is one runtime input lifecycle observation (SPEC
// E5). Its dimensions carry no request content: an outcome from a fixed
// set, and identifiers that pass a strict pattern.
type RuntimeInputMetric struct {
	Outcome   string `json:"outcome"`
	Adapter   string `json:"adapter"`
	RequestID string `json:"requestId"`
}
