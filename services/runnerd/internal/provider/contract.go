package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"
)

// Event priorities (PRP): P0 is never dropped, P2 may be coalesced.
const (
	P0 uint32 = 0
	P1 uint32 = 1
	P2 uint32 = 2
)

// Provider is one supervised provider session: a driver's Start returns
// it (codex, acp, opencode; tests inject fakes), the runner drives it.
type Provider interface {
	Process() ProcessInfo
	OpenThread(ctx context.Context, threadID string) (id string, resumed bool, err error)
	StartTurn(ctx context.Context, text string) (turnID string, err error)
	TurnDone() <-chan TurnResult
	Steer(ctx context.Context, turnID, text string) error
	Interrupt(ctx context.Context, turnID string) error
	Exited() <-chan struct{}
	ExitErr() error
	Close(ctx context.Context, grace time.Duration) error
}

// TurnReconciler is implemented by providers that can settle a turn that
// was active when the provider (or runnerd) was lost, by reading the
// resumed thread (codex thread/read): outcome is retained (the provider
// still runs it), terminalized (its TurnResult arrives on TurnDone; status
// is the provider's) or missing (with a provider_turn_missing error).
//
// LastTurn returns the resumed thread's newest turn id ("" for none): a
// turn.start a runnerd restart cut short started a turn exactly when the
// thread's newest turn is not one runnerd knows.
type TurnReconciler interface {
	ReconcileTurn(ctx context.Context, turnID string) (outcome, status string, err error)
	LastTurn(ctx context.Context) (string, error)
}

// TurnDropper is implemented by providers that can remove a turn from
// the thread's history (SPEC R12): a turn cut off by a provider loss is
// dropped before the controller retries it, so that the provider's history
// holds the user's message once (codex thread/revert, OpenCode's message
// delete). DropTurn removes turnID and nothing before it.
type TurnDropper interface {
	DropTurn(ctx context.Context, turnID string) error
}

// What happened to a lost turn in the provider's history (turn.lost
// payload providerHistory, SPEC R12).
const (
	// HistoryDropped: the cut-off turn was removed; the retry's prompt is
	// in the history once.
	HistoryDropped = "dropped"
	// HistoryKept: the provider cannot drop it (or dropping failed): the
	// history holds the cut-off prompt and the retry's.
	HistoryKept = "kept"
	// HistoryAbsent: the provider never recorded the turn.
	HistoryAbsent = "absent"
)

// TurnStartLost is what a provider's StartTurn returns when the provider
// was lost while the turn was being started (the process exited or the
// transport broke during the start request, SPEC R7): the prompt may or
// may not have reached it under TurnID, which the provider can look up
// after a restart (OpenCode: the user message id tether chose). runnerd
// records the turn as started and, the provider's exit seen, restarts the
// provider and reconciles TurnID (TurnReconciler): found, the provider's
// record settles it; missing, it is lost and the controller retries it.
type TurnStartLost struct {
	TurnID string
	Err    error
}

func (e *TurnStartLost) Error() string {
	return fmt.Sprintf("provider lost while starting turn %s: %v", e.TurnID, e.Err)
}

func (e *TurnStartLost) Unwrap() error { return e.Err }

// ReattachReconciler is implemented by providers whose re-attach after a
// runnerd restart does not replay what the provider did meanwhile (the
// OpenCode event stream): runnerd reconciles the active turn on the
// re-attached provider (TurnReconciler) instead of waiting for its end.
type ReattachReconciler interface {
	ReconcileOnReattach() bool
}

// StartFunc spawns a provider. emit is called in order from one goroutine
// and must not block for long (runnerd queues events without blocking).
type StartFunc func(ctx context.Context, cfg Config, emit func(Event)) (Provider, error)

// Config is what a driver needs to start its provider.
type Config struct {
	// Kind is the launch profile name (providerlaunch.Name of the run's
	// provider): the registry key the StartFunc was chosen by.
	Kind    string
	Command string
	Args    []string
	Env     []string // complete allow-listed environment (SPEC E2)
	Dir     string   // workspace cwd
	// StateDir is the scope root (runnerd's --state-dir); a driver keeps
	// its provider's home under StateDir/<its profile directory>
	// (codex-home, opencode, acpx: SPEC B2).
	StateDir  string
	CodexHome string
	// HomeTemplate, when set, is the operator's directory of launch-only
	// provider files (runnerd --provider-home-template; opencode:
	// opencode.json with the provider definitions) the driver copies into
	// the provider's home before each start; they never travel in backups.
	HomeTemplate                   string
	Model, ApprovalPolicy, Sandbox string
	// PermissionMode (opencode: allow|ask|deny; acpx: approve-all|
	// approve-reads|deny-all) and Agent (acpx: claude|codex) are the run's
	// provider settings for the non-codex drivers.
	PermissionMode, Agent string
	// DynamicTools are the run's caller-implemented tools (codex
	// thread/start dynamicTools); calls are answered with tool.result.
	DynamicTools []DynamicTool
	// ToolTimeout bounds a dynamic tool call's wait for tool.result
	// (semantic_tool_timeout); zero: no bound.
	ToolTimeout                    time.Duration
	StartupTimeout, RequestTimeout time.Duration
	Logger                         *slog.Logger

	// Hosted: run the provider under a provider host that survives a
	// runnerd crash (see the provhost package), with its socket and files
	// in HostDir. Reattach: connect to the host left by a previous runnerd
	// (fail if it is gone) and resume after ResumeAfter; otherwise start a
	// new host whose seqs continue after ResumeAfter.
	Hosted        bool
	HostDir       string
	Reattach      bool
	ResumeAfter   uint64
	DetachTimeout time.Duration
	CloseGrace    time.Duration
}

// Event is one provider observation, as a PRP event type and payload.
type Event struct {
	Type     string
	TurnID   string
	ItemID   string
	Priority uint32
	// Body is the typed payload (tether/prp/v1/payloads.proto) of an
	// event the control plane interprets (runtime requests, tool calls);
	// Payload, when Body is nil, the object of a provider's own item.
	Body    proto.Message
	Payload map[string]any
	// Cursor is a provider host mark: every provider line through this
	// host seq has been emitted (with this event, if it has a Type).
	Cursor uint64
	// More: further events of the same provider line follow at once, the
	// last with the line's cursor. The runner takes a line's events
	// together (eventQueue.drain): a loop that journaled part of a line
	// without its cursor, killed before the rest, would have the host
	// replay the line and journal that part twice.
	More bool
}

// ErrorCode returns the stable code of a provider error (an *Error), or "".
func ErrorCode(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
