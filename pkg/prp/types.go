package prp

// The PRP command and event types more than one package names, each
// defined here once (packages that name them keep their own identifiers as
// aliases of these).

// Command types: the controller's commands to a runner.
const (
	CommandRunAttach      = "run.attach"
	CommandTurnStart      = "turn.start"
	CommandRequestResolve = "request.resolve"
	CommandToolResult     = "tool.result"
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
)

// ClientName is the name runnerd gives itself to a provider (codex's
// clientInfo, ACP's clientInfo).
const ClientName = "tether-runnerd"

// RuntimeRequestSchema is the schema of a runtime request's payload
// (runtime_request.created), whichever provider driver announces it.
const RuntimeRequestSchema = "tether.runtime_request.v2"
