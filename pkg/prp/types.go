package prp

// The PRP command and event types more than one package names, each
// defined here once (packages that name them keep their own identifiers as
// aliases of these).

// CommandSchema is the schema every command names.
const CommandSchema = "tether.prp.command.v1"

// Command types: the controller's commands to a runner.
const (
	CommandRunAttach     = "run.attach"
	CommandTurnStart     = "turn.start"
	CommandTurnSteer     = "turn.steer"
	CommandTurnInterrupt = "turn.interrupt"
	// CommandSessionClose closes the session; the runner exits.
	CommandSessionClose = "session.close"
	// CommandRunnerSuspend stops the provider cleanly, keeps its thread
	// and exits once the outbox is acknowledged (SPEC R5).
	CommandRunnerSuspend = "runner.suspend"
	// CommandRunnerCheckpoint stages an online checkpoint.
	CommandRunnerCheckpoint = "runner.checkpoint"
	CommandRequestResolve   = "request.resolve"
	CommandToolResult       = "tool.result"
)

// Event types.
const (
	// EventRunTerminal ends a run's event stream.
	EventRunTerminal = "run.terminal"
	// EventRunPlanUpdated carries a turn's plan.
	EventRunPlanUpdated = "run.plan_updated"
	// EventCommandExecuted reports that runnerd executed a command's
	// effect (SPEC X1).
	EventCommandExecuted = "command.executed"
	// EventTurnStarted begins a provider turn.
	EventTurnStarted = "turn.started"
	// EventHarnessDiagnostic reports a provider's diagnostic.
	EventHarnessDiagnostic = "harness.diagnostic"
	// EventHarnessReady reports the provider process a runner spawned
	// (pid, pgid, start ticks).
	EventHarnessReady = "harness.ready"
	// EventTurnCompleted, EventTurnFailed, EventTurnInterrupted and
	// EventTurnCancelled end a provider turn (TurnEndTypes).
	EventTurnCompleted   = "turn.completed"
	EventTurnFailed      = "turn.failed"
	EventTurnInterrupted = "turn.interrupted"
	EventTurnCancelled   = "turn.cancelled"
	// EventSessionContinuityBreak is the control event of the run that
	// applied an operator's ReplaceSession (a fresh provider session, SPEC
	// F3).
	EventSessionContinuityBreak = "session.continuity_break"
	// EventSessionAuthorityRotated, EventSessionClosed and
	// EventSessionCloseFailed are the control events of a run that took a
	// scope over or closed its warm session (SPEC E10).
	EventSessionAuthorityRotated = "session.authority_rotated"
	EventSessionClosed           = "session.closed"
	EventSessionCloseFailed      = "session.close_failed"
	// EventToolInput is a dynamic tool call's input (tether_ask_user opens
	// an interaction with it, SPEC E4).
	EventToolInput = "semantic_tool.input"
	// The lifecycle of a provider's runtime request (a question the agent
	// asked mid-turn, SPEC E5); every one starts with
	// RuntimeRequestEventPrefix.
	EventRuntimeRequestCreated   = "runtime_request.created"
	EventRuntimeRequestResolved  = "runtime_request.resolved"
	EventRuntimeRequestExpired   = "runtime_request.expired"
	EventRuntimeRequestCancelled = "runtime_request.cancelled"
	RuntimeRequestEventPrefix    = "runtime_request."
)

// Events runnerd itself emits, each with its typed payload
// (tether/prp/v1/payloads.proto).
const (
	// EventTurnLost reports a turn lost with its provider (TurnLost).
	EventTurnLost = "turn.lost"
	// EventRunAttached reports an attached run (RunAttached).
	EventRunAttached = "run.attached"
	// EventHarnessExited reports the provider process gone (HarnessExited).
	EventHarnessExited = "harness.exited"
	// EventProviderRestarting reports a provider restart
	// (ProviderRestarting).
	EventProviderRestarting = "provider.restarting"
	// EventRunnerSuspended and EventRunnerStopped report the runner's
	// lifecycle (RunnerLifecycle).
	EventRunnerSuspended = "runner.suspended"
	EventRunnerStopped   = "runner.stopped"
	// EventRunnerReconciled reports a recovered runnerd (RunnerReconciled).
	EventRunnerReconciled = "runner.reconciled"
	// EventRunnerBackpressure reports the outbox's backpressure
	// (RunnerBackpressure).
	EventRunnerBackpressure = "runner.backpressure"
	// A dynamic tool call's answer and its execution's end (the provider
	// driver's payloads).
	EventToolResult             = "semantic_tool.result"
	EventToolExecutionCompleted = "tool.execution.completed"
	EventToolExecutionStarted   = "tool.execution.started"
)

// TurnEndTypes are the event types that end a provider turn.
func TurnEndTypes() []string {
	return []string{EventTurnCompleted, EventTurnFailed, EventTurnInterrupted, EventTurnCancelled}
}

// IsTurnEnd reports whether typ ends a provider turn (TurnEndTypes).
func IsTurnEnd(typ string) bool {
	switch typ {
	case EventTurnCompleted, EventTurnFailed, EventTurnInterrupted, EventTurnCancelled:
		return true
	}
	return false
}

// ClientName is the name runnerd gives itself to a provider (codex's
// clientInfo, ACP's clientInfo).
const ClientName = "tether-runnerd"

// RuntimeRequestSchema is the schema of a runtime request's payload
// (runtime_request.created), whichever provider driver announces it.
const RuntimeRequestSchema = "tether.runtime_request.v2"
