// Package provider is runnerd's provider contract: the interface every
// driver (codex, acp, opencode; the runner's tests' fakes) implements
// itself (Provider and the optional TurnReconciler, TurnDropper,
// ReattachReconciler and RuntimeRequestProvider), what a driver is started
// with (Config, by a StartFunc of runnerd's registry), what it emits
// (Event) and what it reports: the result of a finished turn, its usage and
// artifacts, the provider process's identity and failures with stable
// codes. The runner consumes these values as they are, with no conversion.
package provider

import (
	"time"

	"github.com/tether-run/tether/pkg/failure"
)

// Turn statuses in TurnResult.Status.
const (
	TurnCompleted   = "completed"
	TurnFailed      = "failed"
	TurnInterrupted = "interrupted"
)

// Outcomes of reconciling a turn that was active when the provider (or
// runnerd) was lost.
const (
	// ReconcileRetained: the provider still runs the turn; the session now
	// tracks it as active and its end arrives on TurnDone as usual.
	ReconcileRetained = "retained"
	// ReconcileTerminalized: the provider recorded the turn as finished; the
	// driver emitted its turn.<status> event (payload reconciled:true) and
	// delivered its TurnResult on TurnDone.
	ReconcileTerminalized = "terminalized"
	// ReconcileMissing: the thread does not know the turn; the driver
	// returns a provider_turn_missing error with it. The failure is
	// recoverable (the turn was never recorded, so a retry may start it).
	ReconcileMissing = "missing"
)

// TurnResult is delivered once per finished turn.
type TurnResult struct {
	TurnID       string
	Status       string // TurnCompleted | TurnFailed | TurnInterrupted
	FinalMessage string
	// Usage is the turn's own usage (the growth of the thread's total).
	Usage Usage
	// Total is the thread's cumulative usage when the turn ended; nil when
	// the provider reported none.
	Total *Usage
	// Cost is the turn's own cost as the provider reported it (ACP agents:
	// the growth of the session's cumulative cost); nil when none was.
	Cost         *Cost
	ErrorCode    string
	ErrorMessage string
	// Artifacts are the turn's semantic result artifacts (its plan),
	// reported on its run.terminal as artifacts: [{kind, ref}].
	Artifacts []Artifact
}

// Usage is the token usage of one turn.
type Usage struct {
	InputTokens, CachedInputTokens, OutputTokens int64
}

// Cost is an amount of money in a currency, as a provider reports it (never
// converted: SPEC E1 counts USD only).
type Cost struct {
	Amount   float64
	Currency string
}

// Artifact is one semantic result artifact of a turn.
type Artifact struct {
	Kind, Ref string
}

// ProcessInfo identifies a provider process. StartTicks is field 22 of
// /proc/<pid>/stat (start time in clock ticks since boot); together with
// PID it protects liveness checks against PID reuse.
type ProcessInfo struct {
	PID        int
	PGID       int
	StartTicks uint64
	StartedAt  time.Time
}

// Error is a provider failure with a stable code (SPEC.md): the runner
// reports Code as the command's or turn's failure code.
type Error struct {
	Code, Message string
}

func (e *Error) Error() string { return failure.Message(failure.Reason(e.Code), e.Message) }

// FailureReason implements failure.Reasoned.
func (e *Error) FailureReason() failure.Reason { return failure.Reason(e.Code) }
