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

// MaxAttempts is the number of attempts a run gets; the failure of attempt
// MaxAttempts is terminal.
const MaxAttempts = 3

// RetryDelay is how long after a retryable failure the next attempt may start.
const RetryDelay = 30 * time.Second

// SourceCode returns the stable cause carried by err (its failure reason)
// when the registry classes it as a failure source of bounded recovery
// (failure.AttemptRetry or failure.AttemptTerminal), otherwise "". The empty
// result means "no recognised cause"; callers that need a non-empty error
// code for an unrecognised failure record failure.NativeSessionInterrupted.
func SourceCode(err error) failure.Reason {
	switch code := failure.CodeOf(err); code.Retry() {
	case failure.AttemptRetry, failure.AttemptTerminal:
		return code
	}
	return ""
}

// Retryable reports whether a failure with this source code may be retried
// (subject to MaxAttempts). Unknown and empty codes are retryable.
func Retryable(code failure.Reason) bool { return code.Retry() != failure.AttemptTerminal }

// Decision is what happens to a run after a failed attempt.
type Decision struct {
	Phase       string         `json:"phase"`
	FailureCode failure.Reason `json:"failureCode"`
	// NextAttemptAt is set only for a retryable failure.
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
}

// Retry reports whether the decision schedules another attempt.
func (d Decision) Retry() bool { return d.Phase == PhaseRetryableFailure }

// Disposition decides the outcome of failed attempt number attempt (1-based)
// at now, given the failure's source code ("" when none was recognised), with
// the standard RetryDelay.
func Disposition(attempt int, now time.Time, sourceCode failure.Reason) Decision {
	return DispositionWithDelay(attempt, now, sourceCode, RetryDelay)
}

// DispositionWithDelay is Disposition with an explicit retry delay.
func DispositionWithDelay(attempt int, now time.Time, sourceCode failure.Reason, delay time.Duration) Decision {
	if !Retryable(sourceCode) {
		return Decision{Phase: PhaseTerminalFailure, FailureCode: sourceCode}
	}
	if attempt >= MaxAttempts {
		return Decision{Phase: PhaseTerminalFailure, FailureCode: failure.NativeSessionRetryExhausted}
	}
	next := now.Add(delay)
	return Decision{Phase: PhaseRetryableFailure, FailureCode: failure.NativeSessionInterrupted, NextAttemptAt: &next}
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
