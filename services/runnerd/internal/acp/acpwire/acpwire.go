// Package acpwire defines the messages of the Agent Client Protocol (ACP,
// protocol version 1: JSON-RPC 2.0 over stdio) that tether exchanges with
// an ACP agent (codex-acp, claude-agent-acp): the params and results of
// initialize, session/new, session/load, session/set_mode,
// session/set_model, session/prompt and session/cancel, the session/update
// notifications and the agent's session/request_permission. The ACP driver
// and the fake ACP agent both use it. The JSON-RPC envelope itself is not
// here.
package acpwire

import "encoding/json"

// ProtocolVersion is the ACP version tether speaks.
const ProtocolVersion = 1

// Methods.
const (
	MethodInitialize        = "initialize"
	MethodSessionNew        = "session/new"
	MethodSessionLoad       = "session/load"
	MethodSessionSetMode    = "session/set_mode"
	MethodSessionSetModel   = "session/set_model"
	MethodSessionPrompt     = "session/prompt"
	MethodSessionCancel     = "session/cancel"
	MethodSessionUpdate     = "session/update"
	MethodRequestPermission = "session/request_permission"
)

// Session update kinds (SessionUpdate.SessionUpdate).
const (
	UpdateUserMessageChunk  = "user_message_chunk"
	UpdateAgentMessageChunk = "agent_message_chunk"
	UpdateToolCall          = "tool_call"
	UpdateToolCallUpdate    = "tool_call_update"
	UpdatePlan              = "plan"
	UpdateUsage             = "usage_update"
	UpdateAvailableCommands = "available_commands_update"
	UpdateCurrentMode       = "current_mode_update"
)

// Stop reasons of a prompt.
const (
	StopEndTurn   = "end_turn"
	StopCancelled = "cancelled"
	StopRefusal   = "refusal"
)

// ---- initialize ----

// InitializeParams are the params of initialize.
type InitializeParams struct {
	ProtocolVersion    int                `json:"protocolVersion"`
	ClientCapabilities ClientCapabilities `json:"clientCapabilities"`
	ClientInfo         *Implementation    `json:"clientInfo,omitempty"`
}

// ClientCapabilities are what the client offers the agent.
type ClientCapabilities struct {
	FS       FSCapabilities `json:"fs"`
	Terminal bool           `json:"terminal"`
}

// FSCapabilities are the file system methods the client serves.
type FSCapabilities struct {
	ReadTextFile  bool `json:"readTextFile"`
	WriteTextFile bool `json:"writeTextFile"`
}

// Implementation names a client or an agent.
type Implementation struct {
	Name    string `json:"name"`
	Title   string `json:"title,omitempty"`
	Version string `json:"version"`
}

// InitializeResponse is the result of initialize.
type InitializeResponse struct {
	ProtocolVersion   int               `json:"protocolVersion"`
	AgentInfo         *Implementation   `json:"agentInfo,omitempty"`
	AgentCapabilities AgentCapabilities `json:"agentCapabilities"`
	AuthMethods       []json.RawMessage `json:"authMethods"`
	Meta              *AgentMeta        `json:"_meta,omitempty"`
}

// AgentCapabilities are what the agent supports.
type AgentCapabilities struct {
	LoadSession        bool               `json:"loadSession"`
	PromptCapabilities PromptCapabilities `json:"promptCapabilities"`
	MCPCapabilities    MCPCapabilities    `json:"mcpCapabilities"`
}

// PromptCapabilities are the content kinds a prompt may hold beside text.
type PromptCapabilities struct {
	Image           bool `json:"image"`
	EmbeddedContext bool `json:"embeddedContext"`
}

// MCPCapabilities are the MCP transports the agent connects to.
type MCPCapabilities struct {
	HTTP bool `json:"http"`
	SSE  bool `json:"sse"`
}

// AgentMeta is the agent's _meta extension of initialize (steering: whether
// a prompt may be sent while one runs).
type AgentMeta struct {
	Steering *Supported `json:"steering,omitempty"`
}

// Supported says whether an extension is supported.
type Supported struct {
	Supported bool `json:"supported"`
}

// ---- sessions ----

// NewSessionParams are the params of session/new.
type NewSessionParams struct {
	Cwd        string            `json:"cwd"`
	MCPServers []json.RawMessage `json:"mcpServers"`
}

// LoadSessionParams are the params of session/load (the agent replays
// the session's history as session/update before answering).
type LoadSessionParams struct {
	SessionID  string            `json:"sessionId"`
	Cwd        string            `json:"cwd"`
	MCPServers []json.RawMessage `json:"mcpServers"`
}

// SessionResponse is the result of session/new and session/load: the
// session's id (session/new) and its modes and models.
type SessionResponse struct {
	SessionID string             `json:"sessionId,omitempty"`
	Modes     *SessionModeState  `json:"modes,omitempty"`
	Models    *SessionModelState `json:"models,omitempty"`
}

// SessionModeState lists a session's modes and the current one.
type SessionModeState struct {
	CurrentModeID  string        `json:"currentModeId"`
	AvailableModes []SessionMode `json:"availableModes"`
}

// SessionMode is one mode.
type SessionMode struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// SessionModelState lists a session's models and the current one.
type SessionModelState struct {
	CurrentModelID  string      `json:"currentModelId"`
	AvailableModels []ModelInfo `json:"availableModels"`
}

// ModelInfo is one model.
type ModelInfo struct {
	ModelID string `json:"modelId"`
	Name    string `json:"name"`
}

// SetModeParams are the params of session/set_mode.
type SetModeParams struct {
	SessionID string `json:"sessionId"`
	ModeID    string `json:"modeId"`
}

// SetModelParams are the params of session/set_model.
type SetModelParams struct {
	SessionID string `json:"sessionId"`
	ModelID   string `json:"modelId"`
}

// SessionRef is the params of session/cancel.
type SessionRef struct {
	SessionID string `json:"sessionId"`
}

// ---- prompts ----

// PromptParams are the params of session/prompt.
type PromptParams struct {
	SessionID string         `json:"sessionId"`
	Prompt    []ContentBlock `json:"prompt"`
}

// ContentBlock is a piece of content; tether sends and reads text.
type ContentBlock struct {
	Type string `json:"type"` // text, image, resource, …
	Text string `json:"text"`
}

// TextBlock is a text content block.
func TextBlock(text string) ContentBlock { return ContentBlock{Type: "text", Text: text} }

// PromptResponse is the result of session/prompt.
type PromptResponse struct {
	StopReason string       `json:"stopReason"`
	Usage      *PromptUsage `json:"usage,omitempty"`
}

// PromptUsage is a prompt's token usage.
type PromptUsage struct {
	InputTokens      int64 `json:"inputTokens"`
	OutputTokens     int64 `json:"outputTokens"`
	TotalTokens      int64 `json:"totalTokens"`
	CachedReadTokens int64 `json:"cachedReadTokens,omitempty"`
}

// ---- session/update ----

// SessionNotification is the params of session/update.
type SessionNotification struct {
	SessionID string        `json:"sessionId"`
	Update    SessionUpdate `json:"update"`
}

// SessionUpdate is one update; SessionUpdate names its kind and the other
// fields are those of the kind:
//
//	user_message_chunk, agent_message_chunk  MessageID, Content (a ContentBlock)
//	tool_call, tool_call_update              ToolCallID, Title, Kind, Status, RawInput, RawOutput, Meta
//	plan                                     Entries
//	usage_update                             Used, Size, Cost
//	available_commands_update                AvailableCommands
//
// Content stays raw: a message chunk's is one content block, a tool call's
// a list of tool call contents. RawInput, RawOutput and Meta are the
// agent's own.
type SessionUpdate struct {
	SessionUpdate     string            `json:"sessionUpdate"`
	MessageID         string            `json:"messageId,omitempty"`
	Content           json.RawMessage   `json:"content,omitempty"`
	ToolCallID        string            `json:"toolCallId,omitempty"`
	Title             string            `json:"title,omitempty"`
	Kind              string            `json:"kind,omitempty"`
	Status            string            `json:"status,omitempty"`
	RawInput          json.RawMessage   `json:"rawInput,omitempty"`
	RawOutput         json.RawMessage   `json:"rawOutput,omitempty"`
	Entries           []PlanEntry       `json:"entries,omitzero"`
	Used              *int64            `json:"used,omitempty"`
	Size              *int64            `json:"size,omitempty"`
	Cost              *Cost             `json:"cost,omitempty"`
	AvailableCommands []json.RawMessage `json:"availableCommands,omitzero"`
	Meta              json.RawMessage   `json:"_meta,omitempty"`
}

// MessageChunk is a message chunk update of kind with text.
func MessageChunk(kind, messageID, text string) SessionUpdate {
	b, _ := json.Marshal(TextBlock(text))
	return SessionUpdate{SessionUpdate: kind, MessageID: messageID, Content: b}
}

// Text is the text of a message chunk's content ("" for other content).
func (u SessionUpdate) Text() string {
	var b ContentBlock
	if json.Unmarshal(u.Content, &b) != nil || b.Type != "text" {
		return ""
	}
	return b.Text
}

// PlanEntry is one entry of a plan update (priority high, medium, low;
// status pending, in_progress, completed).
type PlanEntry struct {
	Content  string `json:"content"`
	Priority string `json:"priority"`
	Status   string `json:"status"`
}

// Cost is a session's cumulative cost.
type Cost struct {
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
}

// ---- session/request_permission ----

// RequestPermissionParams are the params of session/request_permission.
type RequestPermissionParams struct {
	SessionID string             `json:"sessionId"`
	ToolCall  ToolCallRef        `json:"toolCall"`
	Options   []PermissionOption `json:"options"`
}

// ToolCallRef is the tool call a permission request is about.
type ToolCallRef struct {
	ToolCallID string          `json:"toolCallId"`
	Title      string          `json:"title,omitempty"`
	Kind       string          `json:"kind,omitempty"`
	Status     string          `json:"status,omitempty"`
	RawInput   json.RawMessage `json:"rawInput,omitempty"`
}

// PermissionOption is one answer the agent offers (kind allow_once,
// allow_always, reject_once, reject_always).
type PermissionOption struct {
	OptionID string `json:"optionId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
}

// RequestPermissionResponse answers session/request_permission.
type RequestPermissionResponse struct {
	Outcome PermissionOutcome `json:"outcome"`
}

// PermissionOutcome is "selected" (with OptionID) or "cancelled".
type PermissionOutcome struct {
	Outcome  string `json:"outcome"`
	OptionID string `json:"optionId,omitempty"`
}
