// Package codexwire defines the messages of the codex app-server JSON-RPC
// protocol (v2, as codex-cli 0.169.0 speaks it over stdio) that tether
// exchanges: the params and results of the client requests, the server's
// notifications, its requests to the client (approvals, user input, dynamic
// tool calls) and the items they carry. The codex driver and the fake
// codex app-server both use it, so the fake cannot drift from what the
// driver reads.
//
// Field names, nesting and nulls follow the recorded transcripts
// (reference/codex-transcripts): a field the real server sends as null is a
// pointer or json.RawMessage without omitempty, so a zero value is sent as
// null too. Items are polymorphic (their "type" names the kind) and pass
// through as json.RawMessage where a message carries one or a list of them;
// the Item type reads the fields common to the kinds tether interprets.
// The JSON-RPC envelope itself is not here.
package codexwire

import "encoding/json"

// Client request methods.
const (
	MethodInitialize    = "initialize"
	MethodThreadStart   = "thread/start"
	MethodThreadResume  = "thread/resume"
	MethodThreadRead    = "thread/read"
	MethodThreadRevert  = "thread/revert"
	MethodTurnStart     = "turn/start"
	MethodTurnSteer     = "turn/steer"
	MethodTurnInterrupt = "turn/interrupt"
)

// Server notification methods.
const (
	NotifyThreadStarted         = "thread/started"
	NotifyThreadStatusChanged   = "thread/status/changed"
	NotifyThreadReverted        = "thread/reverted"
	NotifyTurnStarted           = "turn/started"
	NotifyTurnCompleted         = "turn/completed"
	NotifyItemStarted           = "item/started"
	NotifyItemCompleted         = "item/completed"
	NotifyAgentMessageDelta     = "item/agentMessage/delta"
	NotifyCommandOutputDelta    = "item/commandExecution/outputDelta"
	NotifyTokenUsageUpdated     = "thread/tokenUsage/updated"
	NotifyPlanUpdated           = "turn/plan/updated"
	NotifyServerRequestResolved = "serverRequest/resolved"
	NotifyError                 = "error"
	NotifyWarning               = "warning"
	NotifyConfigWarning         = "configWarning"
	NotifyDeprecationNotice     = "deprecationNotice"
)

// Server request methods (server -> client, answered by the client).
const (
	RequestCommandApproval = "item/commandExecution/requestApproval"
	RequestFileApproval    = "item/fileChange/requestApproval"
	RequestUserInput       = "item/tool/requestUserInput"
	RequestToolCall        = "item/tool/call"
)

// Turn statuses.
const (
	TurnInProgress  = "inProgress"
	TurnCompleted   = "completed"
	TurnInterrupted = "interrupted"
	TurnFailed      = "failed"
)

// Item kinds (Item.Type).
const (
	ItemUserMessage      = "userMessage"
	ItemAgentMessage     = "agentMessage"
	ItemCommandExecution = "commandExecution"
	ItemDynamicToolCall  = "dynamicToolCall"
	ItemPlan             = "plan"
)

// ---- initialize ----

// InitializeParams are the params of initialize.
type InitializeParams struct {
	ClientInfo   ClientInfo    `json:"clientInfo"`
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}

// ClientInfo names the client; the server puts it into its user agent and
// each thread's originator.
type ClientInfo struct {
	Name    string `json:"name"`
	Title   string `json:"title,omitempty"`
	Version string `json:"version"`
}

// Capabilities the client opts into.
type Capabilities struct {
	ExperimentalAPI bool `json:"experimentalApi"`
}

// InitializeResponse is the result of initialize.
type InitializeResponse struct {
	UserAgent      string `json:"userAgent"`
	CodexHome      string `json:"codexHome"`
	PlatformFamily string `json:"platformFamily"`
	PlatformOs     string `json:"platformOs"`
}

// ---- threads ----

// ThreadStatus is a thread's status: idle, or active with flags
// (waitingOnApproval, waitingOnUserInput; an empty list is sent as []).
type ThreadStatus struct {
	Type        string   `json:"type"`
	ActiveFlags []string `json:"activeFlags,omitzero"`
}

// IdleStatus is the status of a thread without a running turn.
func IdleStatus() ThreadStatus { return ThreadStatus{Type: "idle"} }

// ActiveStatus is the status of a thread with a running turn.
func ActiveStatus(flags ...string) ThreadStatus {
	return ThreadStatus{Type: "active", ActiveFlags: append([]string{}, flags...)}
}

// SandboxPolicy is the sandbox a thread runs commands in: readOnly,
// workspaceWrite or dangerFullAccess, with the fields of its kind.
type SandboxPolicy struct {
	Type                string   `json:"type"`
	WritableRoots       []string `json:"writableRoots,omitzero"`
	NetworkAccess       *bool    `json:"networkAccess,omitempty"`
	ExcludeTmpdirEnvVar *bool    `json:"excludeTmpdirEnvVar,omitempty"`
	ExcludeSlashTmp     *bool    `json:"excludeSlashTmp,omitempty"`
}

// Thread is a thread as thread/start, thread/resume, thread/read and
// thread/started describe it.
type Thread struct {
	ID            string       `json:"id"`
	SessionID     string       `json:"sessionId"`
	ForkedFromID  *string      `json:"forkedFromId"`
	Preview       string       `json:"preview"`
	Ephemeral     bool         `json:"ephemeral"`
	HistoryMode   string       `json:"historyMode"`
	ModelProvider string       `json:"modelProvider"`
	Model         string       `json:"model"`
	CreatedAt     int64        `json:"createdAt"`
	UpdatedAt     int64        `json:"updatedAt"`
	Status        ThreadStatus `json:"status"`
	Path          *string      `json:"path"`
	Cwd           string       `json:"cwd"`
	CliVersion    string       `json:"cliVersion"`
	Originator    string       `json:"originator"`
	Source        string       `json:"source"`
	Name          *string      `json:"name"`
	Turns         []Turn       `json:"turns"`
}

// ThreadResponse is the result of thread/start and thread/resume.
type ThreadResponse struct {
	Thread             Thread            `json:"thread"`
	Model              string            `json:"model"`
	ModelProvider      string            `json:"modelProvider"`
	ServiceTier        *string           `json:"serviceTier"`
	Cwd                string            `json:"cwd"`
	ApprovalPolicy     string            `json:"approvalPolicy"`
	ApprovalsReviewer  string            `json:"approvalsReviewer"`
	Sandbox            SandboxPolicy     `json:"sandbox"`
	ReasoningEffort    *string           `json:"reasoningEffort"`
	MultiAgentMode     string            `json:"multiAgentMode"`
	InstructionSources []json.RawMessage `json:"instructionSources"`
}

// ThreadReadParams are the params of thread/read.
type ThreadReadParams struct {
	ThreadID     string `json:"threadId"`
	IncludeTurns bool   `json:"includeTurns"`
}

// ThreadReadResponse is the result of thread/read.
type ThreadReadResponse struct {
	Thread Thread `json:"thread"`
}

// ThreadRevertParams are the params of thread/revert: the turn named and
// every later one are dropped from the thread's history.
type ThreadRevertParams struct {
	ThreadID     string `json:"threadId"`
	BeforeTurnID string `json:"beforeTurnId"`
}

// ThreadRevertResponse is the result of thread/revert.
type ThreadRevertResponse struct {
	Thread               Thread  `json:"thread"`
	ItemsBackwardsCursor *string `json:"itemsBackwardsCursor"`
	TurnsBackwardsCursor *string `json:"turnsBackwardsCursor"`
}

// ThreadStarted is the params of thread/started.
type ThreadStarted struct {
	Thread Thread `json:"thread"`
}

// ThreadStatusChanged is the params of thread/status/changed.
type ThreadStatusChanged struct {
	ThreadID string       `json:"threadId"`
	Status   ThreadStatus `json:"status"`
}

// ThreadRef is the params of notifications that only name a thread
// (thread/reverted).
type ThreadRef struct {
	ThreadID string `json:"threadId"`
}

// ---- turns ----

// Turn is a turn as turn/start, turn/started, turn/completed and a
// thread's history describe it. Items are the turn's items (all of them,
// a summary or none: ItemsView says which).
type Turn struct {
	ID          string            `json:"id"`
	RootTurnID  string            `json:"rootTurnId"`
	Items       []json.RawMessage `json:"items"`
	ItemsView   string            `json:"itemsView"`
	Status      string            `json:"status"`
	Error       *TurnError        `json:"error"`
	StartedAt   *int64            `json:"startedAt"`
	CompletedAt *int64            `json:"completedAt"`
	DurationMs  *int64            `json:"durationMs"`
}

// TurnError is why a turn (or, in an error notification, a model request)
// failed. CodexErrorInfo is a string or an object naming the error kind.
type TurnError struct {
	Message           string          `json:"message"`
	CodexErrorInfo    json.RawMessage `json:"codexErrorInfo,omitempty"`
	AdditionalDetails *string         `json:"additionalDetails,omitempty"`
}

// UserInput is one input item of turn/start and turn/steer (text only, as
// tether sends it), and one content part of a userMessage item.
type UserInput struct {
	Type         string            `json:"type"` // text
	Text         string            `json:"text"`
	TextElements []json.RawMessage `json:"text_elements,omitzero"`
}

// TextInput is the input of one text.
func TextInput(text string) []UserInput { return []UserInput{{Type: "text", Text: text}} }

// CollaborationMode selects a turn's mode (plan or default) and its
// settings.
type CollaborationMode struct {
	Mode     string                `json:"mode"`
	Settings CollaborationSettings `json:"settings"`
}

// CollaborationSettings are a collaboration mode's settings.
type CollaborationSettings struct {
	Model                 string  `json:"model"`
	DeveloperInstructions *string `json:"developer_instructions"`
}

// TurnStartResponse is the result of turn/start.
type TurnStartResponse struct {
	Turn Turn `json:"turn"`
}

// TurnSteerResponse is the result of turn/steer.
type TurnSteerResponse struct {
	TurnID string `json:"turnId"`
}

// TurnInterruptParams are the params of turn/interrupt.
type TurnInterruptParams struct {
	ThreadID string `json:"threadId"`
	TurnID   string `json:"turnId"`
}

// TurnNotification is the params of turn/started and turn/completed.
type TurnNotification struct {
	ThreadID string `json:"threadId"`
	Turn     Turn   `json:"turn"`
}

// PlanUpdated is the params of turn/plan/updated.
type PlanUpdated struct {
	ThreadID    string     `json:"threadId"`
	TurnID      string     `json:"turnId"`
	Explanation *string    `json:"explanation"`
	Plan        []PlanStep `json:"plan"`
}

// PlanStep is one step of a turn's plan (status pending, inProgress or
// completed).
type PlanStep struct {
	Step   string `json:"step"`
	Status string `json:"status"`
}

// ---- usage ----

// TokenUsageUpdated is the params of thread/tokenUsage/updated: the
// thread's running total and the last model request's usage.
type TokenUsageUpdated struct {
	ThreadID   string     `json:"threadId"`
	TurnID     string     `json:"turnId"`
	TokenUsage TokenUsage `json:"tokenUsage"`
}

// TokenUsage is a thread's usage.
type TokenUsage struct {
	Total              TokenCounts `json:"total"`
	Last               TokenCounts `json:"last"`
	ModelContextWindow int64       `json:"modelContextWindow"`
}

// TokenCounts is one usage breakdown.
type TokenCounts struct {
	TotalTokens           int64 `json:"totalTokens"`
	InputTokens           int64 `json:"inputTokens"`
	CachedInputTokens     int64 `json:"cachedInputTokens"`
	CacheWriteInputTokens int64 `json:"cacheWriteInputTokens"`
	OutputTokens          int64 `json:"outputTokens"`
	ReasoningOutputTokens int64 `json:"reasoningOutputTokens"`
}

// Add adds o to c.
func (c *TokenCounts) Add(o TokenCounts) {
	c.TotalTokens += o.TotalTokens
	c.InputTokens += o.InputTokens
	c.CachedInputTokens += o.CachedInputTokens
	c.CacheWriteInputTokens += o.CacheWriteInputTokens
	c.OutputTokens += o.OutputTokens
	c.ReasoningOutputTokens += o.ReasoningOutputTokens
}

// ---- other notifications ----

// ServerRequestResolved is the params of serverRequest/resolved: the
// server request with RequestID no longer waits for an answer.
type ServerRequestResolved struct {
	ThreadID  string          `json:"threadId"`
	RequestID json.RawMessage `json:"requestId"`
}

// Delta is the params of item/agentMessage/delta and
// item/commandExecution/outputDelta.
type Delta struct {
	ThreadID string `json:"threadId"`
	TurnID   string `json:"turnId"`
	ItemID   string `json:"itemId"`
	Delta    string `json:"delta"`
}

// ErrorNotification is the params of error: a model request failed
// (WillRetry: the server retries it).
type ErrorNotification struct {
	Error     TurnError `json:"error"`
	WillRetry bool      `json:"willRetry"`
	ThreadID  string    `json:"threadId"`
	TurnID    string    `json:"turnId"`
}

// DeprecationNotice is the params of deprecationNotice.
type DeprecationNotice struct {
	Summary string  `json:"summary"`
	Details *string `json:"details"`
}

// ---- request params ----

// ThreadStartParams are the params of thread/start (empty fields take the
// server's defaults). DynamicTools are the client's tool definitions
// ({type:"function", name, description, inputSchema} or a namespace).
type ThreadStartParams struct {
	Cwd            string            `json:"cwd,omitempty"`
	ApprovalPolicy string            `json:"approvalPolicy,omitempty"`
	Sandbox        string            `json:"sandbox,omitempty"`
	Model          string            `json:"model,omitempty"`
	DynamicTools   []json.RawMessage `json:"dynamicTools,omitempty"`
}

// ThreadResumeParams are the params of thread/resume. ExcludeTurns skips
// the (deprecated) full-history hydration.
type ThreadResumeParams struct {
	ThreadID     string            `json:"threadId"`
	ExcludeTurns bool              `json:"excludeTurns"`
	DynamicTools []json.RawMessage `json:"dynamicTools,omitempty"`
}

// TurnStartParams are the params of turn/start.
type TurnStartParams struct {
	ThreadID          string             `json:"threadId"`
	Input             []UserInput        `json:"input"`
	CollaborationMode *CollaborationMode `json:"collaborationMode,omitempty"`
}

// TurnSteerParams are the params of turn/steer: the input joins the
// active turn if it is still ExpectedTurnID.
type TurnSteerParams struct {
	ThreadID       string      `json:"threadId"`
	ExpectedTurnID string      `json:"expectedTurnId"`
	Input          []UserInput `json:"input"`
}
