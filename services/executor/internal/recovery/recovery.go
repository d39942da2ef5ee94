// Package recovery holds the pure rules of bounded native-session recovery
// (SPEC E11): which failure cause an execution error carries, whether the run
// is retried or stops, and who owns the follow-up once it stops.
//
// Nothing here touches storage or clocks; callers pass the attempt number and
// the current time and persist what they get back.
package recovery

import (
	"time"

	"github.com/tether-run/tether/pkg/failure"
)

// Phases a failed attempt can end in.
const (
	PhaseRetryableFailure = "retryable_failure"
	PhaseTerminalFailure  = "terminal_failure"
)

// Failure codes the disposition assigns itself.
const (
	// CodeInterrupted marks an attempt that failed but will be retried.
	CodeInterrupted = "native_session_interrupted"
	// CodeRetryExhausted marks a run whose last permitted attempt failed.
	CodeRetryExhausted = "native_session_retry_exhausted"
)

// Causes with special meaning for the disposition.
const (
	CodeEventReplayConflict          = "native_event_replay_conflict"
	CodeProviderArtifactIncompatible = "runner_remote_provider_artifact_incompatible"
)

// MaxAttempts is the number of attempts a run gets; the failure of attempt
// MaxAttempts is terminal.
const MaxAttempts = 3

// RetryDelay is how long after a retryable failure the next attempt may start.
const RetryDelay = 30 * time.Second

// knownSourceCodes are the stable causes preserved from a failed attempt's
// error. Anything else is reported as "" (no recognised cause).
var knownSourceCodes = map[string]bool{
	"provider_frame_too_large":           true,
	"native_runner_process_exited":       true,
	"provider_transport_failed":          true,
	"planning_mode_unsupported":          true,
	CodeEventReplayConflict:              true,
	"provider_process_exited":            true,
	"provider_stdout_closed":             true,
	"provider_process_status_failed":     true,
	"provider_initialize_timeout":        true,
	"provider_initialize_protocol_error": true,
	"provider_request_timeout":           true,
	CodeProviderArtifactIncompatible:     true,
	// The gateway refused the executor's grant (SPEC S1): a key or gateway
	// id mismatch, e.g. mid-rotation; retried like any attach failure.
	"gateway_grant_invalid": true,
}

// nonRetryable causes end the run at once under their own code: replaying
// would diverge from recorded history, or the provider artifact can never be
// launched by this runner.
var nonRetryable = map[string]bool{
	CodeEventReplayConflict:          true,
	CodeProviderArtifactIncompatible: true,
}

// SourceCode returns the stable cause carried by err: its leading `code:`
// token (or, for a failure.Error / gRPC status, its ErrorInfo reason) when
// that is one of the known source codes, otherwise "". The empty result means
// "no recognised cause"; callers that need a non-empty error code for an
// unrecognised failure record CodeInterrupted.
func SourceCode(err error) string {
	if err == nil {
		return ""
	}
	if code := failure.CodeOf(err); knownSourceCodes[code] {
		return code
	}
	return SourceCodeOf(err.Error())
}

// SourceCodeOf is SourceCode for an error message.
func SourceCodeOf(msg string) string {
	if code := failure.LeadingCode(msg); knownSourceCodes[code] {
		return code
	}
	return ""
}

// Retryable reports whether a failure with this source code may be retried
// (subject to MaxAttempts). Unknown and empty codes are retryable.
func Retryable(code string) bool { return !nonRetryable[code] }

// Decision is what happens to a run after a failed attempt.
type Decision struct {
	Phase       string `json:"phase"`
	FailureCode string `json:"failureCode"`
	// NextAttemptAt is set only for a retryable failure.
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
}

// Retry reports whether the decision schedules another attempt.
func (d Decision) Retry() bool { return d.Phase == PhaseRetryableFailure }

// Disposition decides the outcome of failed attempt number attempt (1-based)
// at now, given the failure's source code ("" when none was recognised), with
// the standard RetryDelay.
func Disposition(attempt int, now time.Time, sourceCode string) Decision {
	return DispositionWithDelay(attempt, now, sourceCode, RetryDelay)
}

// DispositionWithDelay is Disposition with an explicit retry delay.
func DispositionWithDelay(attempt int, now time.Time, sourceCode string, delay time.Duration) Decision {
	if !Retryable(sourceCode) {
		return Decision{Phase: PhaseTerminalFailure, FailureCode: sourceCode}
	}
	if attempt >= MaxAttempts {
		return Decision{Phase: PhaseTerminalFailure, FailureCode: CodeRetryExhausted}
	}
	next := now.Add(delay)
	return Decision{Phase: PhaseRetryableFailure, FailureCode: CodeInterrupted, NextAttemptAt: &next}
}

// Recovery owner kinds.
const (
	OwnerAgent = "agent"
	OwnerBoard = "board"
)

// IssueStatusInReview is the issue status set when recovery is exhausted.
const IssueStatusInReview = "in_review"

// Owner is who is responsible for recovering a failed run.
type Owner struct {
	Kind string `json:"kind"`
	// AgentID is set only when Kind is OwnerAgent.
	AgentID string `json:"agentId,omitempty"`
}

// Record is the recovery state projected from a failed attempt (see
// Projection), stored with the run as JSON and shown by GetRun.
//
// Where the original contract uses null, Go uses "" and the JSON omits the
// field: IssueStatus is "" when the issue status stays unchanged, and
// RecoveryActionOwnerAgentID is "" when the board owns recovery.
type Record struct {
	Exhausted                  bool   `json:"exhausted"`
	IssueStatus                string `json:"issueStatus,omitempty"`
	RecoveryOwner              Owner  `json:"recoveryOwner"`
	RecoveryActionOwnerType    string `json:"recoveryActionOwnerType"`
	RecoveryActionOwnerAgentID string `json:"recoveryActionOwnerAgentId,omitempty"`
	RecoveryActionCause        string `json:"recoveryActionCause"`
	SupersedeOnIdentityChange  bool   `json:"supersedeOnIdentityChange"`
}

// Projection projects a decision's phase and failure code for the run's
// agent. A retryable failure stays with the agent and leaves the issue alone;
// any terminal failure is escalated to the board and moves the issue to
// in_review, so a provider that keeps failing is never left owning its own
// recovery.
func Projection(phase, failureCode, agentID string) Record {
	p := Record{
		Exhausted:                 phase == PhaseTerminalFailure,
		RecoveryActionCause:       failureCode,
		SupersedeOnIdentityChange: true,
	}
	if p.Exhausted {
		p.IssueStatus = IssueStatusInReview
		p.RecoveryOwner = Owner{Kind: OwnerBoard}
		p.RecoveryActionOwnerType = OwnerBoard
		return p
	}
	p.RecoveryOwner = Owner{Kind: OwnerAgent, AgentID: agentID}
	p.RecoveryActionOwnerType = OwnerAgent
	p.RecoveryActionOwnerAgentID = agentID
	return p
}
