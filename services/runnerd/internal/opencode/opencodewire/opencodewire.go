// Package opencodewire defines the part of the HTTP and server-sent-events
// API of `opencode serve` (OpenCode 1.18.17) that tether uses: sessions,
// messages and their parts, the events of GET /event, permission requests
// and the request bodies. The OpenCode driver and the fake OpenCode server
// both use it. Shapes follow reference/opencode-acpx.md §3.
//
// A message's info and a part are unions (a user or an assistant message;
// a text, tool, step-start or step-finish part): one struct each, whose
// fields of the other kinds stay empty and are omitted.
package opencodewire

import "encoding/json"

// Event types of GET /event.
const (
	EventServerConnected   = "server.connected"
	EventServerHeartbeat   = "server.heartbeat"
	EventSessionCreated    = "session.created"
	EventSessionStatus     = "session.status"
	EventSessionIdle       = "session.idle"
	EventSessionError      = "session.error"
	EventMessageUpdated    = "message.updated"
	EventPartUpdated       = "message.part.updated"
	EventPartDelta         = "message.part.delta"
	EventPermissionAsked   = "permission.asked"
	EventPermissionReplied = "permission.replied"
)

// Part types.
const (
	PartText       = "text"
	PartTool       = "tool"
	PartStepStart  = "step-start"
	PartStepFinish = "step-finish"
)

// Error names (ErrorInfo.Name).
const (
	ErrMessageAborted = "MessageAbortedError"
	ErrAPI            = "APIError"
	ErrNotFound       = "NotFoundError"
	ErrBusy           = "BusyError"
	ErrBadRequest     = "BadRequest"
)

// Event is one server-sent event (data only): Properties depend on Type.
type Event struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Properties json.RawMessage `json:"properties"`
}

// ---- sessions ----

// Session is a session as POST /session and GET /session/{id} return it.
type Session struct {
	ID        string      `json:"id"`
	Slug      string      `json:"slug"`
	ProjectID string      `json:"projectID"`
	Directory string      `json:"directory"`
	Title     string      `json:"title"`
	Version   string      `json:"version"`
	Time      SessionTime `json:"time"`
}

// SessionTime is when a session was created and last updated (Unix ms).
type SessionTime struct {
	Created int64 `json:"created"`
	Updated int64 `json:"updated"`
}

// CreateSessionRequest is the body of POST /session.
type CreateSessionRequest struct {
	Title string `json:"title,omitempty"`
}

// Status is a session's status: busy, idle or retry.
type Status struct {
	Type string `json:"type"`
}

// ---- messages ----

// ModelRef names a model.
type ModelRef struct {
	ProviderID string `json:"providerID"`
	ModelID    string `json:"modelID"`
}

// MessageInfo is a message: a user message (Model) or an assistant message
// (ParentID, ModelID, ProviderID, Mode; Tokens, Cost and Finish or Error
// once it ends).
type MessageInfo struct {
	ID         string      `json:"id"`
	SessionID  string      `json:"sessionID"`
	Role       string      `json:"role"` // user, assistant
	Time       MessageTime `json:"time"`
	Model      *ModelRef   `json:"model,omitempty"`
	ParentID   string      `json:"parentID,omitempty"`
	ModelID    string      `json:"modelID,omitempty"`
	ProviderID string      `json:"providerID,omitempty"`
	Mode       string      `json:"mode,omitempty"`
	Tokens     *Tokens     `json:"tokens,omitempty"`
	Cost       *float64    `json:"cost,omitempty"`
	Finish     string      `json:"finish,omitempty"` // stop, tool-calls, …
	Error      *ErrorInfo  `json:"error,omitempty"`
}

// MessageTime is when a message was created and completed (Unix ms).
type MessageTime struct {
	Created   int64 `json:"created"`
	Completed int64 `json:"completed,omitempty"`
}

// Tokens is the usage of an assistant message or a step.
type Tokens struct {
	Input     int64       `json:"input"`
	Output    int64       `json:"output"`
	Reasoning int64       `json:"reasoning"`
	Cache     CacheTokens `json:"cache"`
}

// CacheTokens are the prompt cache's reads and writes.
type CacheTokens struct {
	Read  int64 `json:"read"`
	Write int64 `json:"write"`
}

// ErrorInfo is a named error: a message's or a session's, and the body of
// an HTTP error answer.
type ErrorInfo struct {
	Name string    `json:"name"`
	Data ErrorData `json:"data"`
}

// ErrorData is an error's details.
type ErrorData struct {
	Message     string `json:"message"`
	IsRetryable *bool  `json:"isRetryable,omitempty"`
}

// NewError is an error named name with message.
func NewError(name, message string) ErrorInfo {
	return ErrorInfo{Name: name, Data: ErrorData{Message: message}}
}

// Message is a message with its parts (GET /session/{id}/message lists
// them).
type Message struct {
	Info  MessageInfo `json:"info"`
	Parts []Part      `json:"parts"`
}

// Part is a part of a message: text (Text, Time), tool (Tool, CallID,
// State), step-start, or step-finish (Reason, Tokens, Cost).
type Part struct {
	ID        string     `json:"id"`
	SessionID string     `json:"sessionID"`
	MessageID string     `json:"messageID"`
	Type      string     `json:"type"`
	Text      *string    `json:"text,omitempty"`
	Time      *PartTime  `json:"time,omitempty"`
	Tool      string     `json:"tool,omitempty"`
	CallID    string     `json:"callID,omitempty"`
	State     *ToolState `json:"state,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Tokens    *Tokens    `json:"tokens,omitempty"`
	Cost      *float64   `json:"cost,omitempty"`
}

// PartTime is when a part started and ended (Unix ms).
type PartTime struct {
	Start int64 `json:"start"`
	End   int64 `json:"end,omitempty"`
}

// ToolState is a tool part's state: pending, running, completed (Output,
// Title, Metadata) or error (Error). Input and Metadata are the tool's own.
type ToolState struct {
	Status   string          `json:"status"`
	Input    json.RawMessage `json:"input"`
	Output   string          `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	Title    string          `json:"title,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Time     *PartTime       `json:"time,omitempty"`
}

// BashMetadata is the metadata of a completed bash tool part.
type BashMetadata struct {
	Output string `json:"output"`
	Exit   int    `json:"exit"`
}

// PromptRequest is the body of POST /session/{id}/prompt_async.
type PromptRequest struct {
	MessageID string      `json:"messageID,omitempty"`
	Parts     []TextInput `json:"parts"`
	Model     *ModelRef   `json:"model,omitempty"`
}

// TextInput is a text part of a prompt.
type TextInput struct {
	Type string `json:"type"` // text
	Text string `json:"text"`
}

// ---- event properties ----

// SessionRef is the properties of session.idle.
type SessionRef struct {
	SessionID string `json:"sessionID"`
}

// SessionCreated is the properties of session.created.
type SessionCreated struct {
	SessionID string  `json:"sessionID"`
	Info      Session `json:"info"`
}

// SessionStatus is the properties of session.status.
type SessionStatus struct {
	SessionID string `json:"sessionID"`
	Status    Status `json:"status"`
}

// SessionError is the properties of session.error.
type SessionError struct {
	SessionID string    `json:"sessionID"`
	Error     ErrorInfo `json:"error"`
}

// MessageUpdated is the properties of message.updated.
type MessageUpdated struct {
	SessionID string      `json:"sessionID"`
	Info      MessageInfo `json:"info"`
}

// PartUpdated is the properties of message.part.updated.
type PartUpdated struct {
	SessionID string `json:"sessionID"`
	Part      Part   `json:"part"`
}

// PartDelta is the properties of message.part.delta: Delta appended to
// the part's Field.
type PartDelta struct {
	SessionID string `json:"sessionID"`
	MessageID string `json:"messageID"`
	PartID    string `json:"partID"`
	Field     string `json:"field"`
	Delta     string `json:"delta"`
}

// ---- permissions ----

// PermissionRequest is a pending permission request: the properties of
// permission.asked and an entry of GET /permission.
type PermissionRequest struct {
	ID         string          `json:"id"`
	SessionID  string          `json:"sessionID"`
	Permission string          `json:"permission"` // bash, edit, webfetch, …
	Patterns   []string        `json:"patterns"`
	Metadata   json.RawMessage `json:"metadata,omitempty"` // the tool's own ({command} for bash)
	Always     []string        `json:"always"`
	Tool       *PermissionTool `json:"tool,omitempty"`
}

// PermissionTool is the tool call a permission request is about.
type PermissionTool struct {
	MessageID string `json:"messageID"`
	CallID    string `json:"callID"`
}

// PermissionReplied is the properties of permission.replied.
type PermissionReplied struct {
	SessionID string `json:"sessionID"`
	RequestID string `json:"requestID"`
	Reply     string `json:"reply"`
}

// PermissionReply is the body of POST /permission/{id}/reply.
type PermissionReply struct {
	Reply   string `json:"reply"` // once, always, reject
	Message string `json:"message,omitempty"`
}

// ---- configuration ----

// Config is the part of OpenCode's configuration file (OPENCODE_CONFIG)
// tether writes.
type Config struct {
	Schema           string            `json:"$schema"`
	Autoupdate       bool              `json:"autoupdate"`
	Share            string            `json:"share"` // manual, auto, disabled
	Snapshot         bool              `json:"snapshot"`
	Model            string            `json:"model,omitempty"`       // provider/model
	SmallModel       string            `json:"small_model,omitempty"` // for titles and summaries
	EnabledProviders []string          `json:"enabled_providers,omitempty"`
	Permission       *PermissionConfig `json:"permission,omitempty"`
}

// PermissionConfig is the permission (allow, ask, deny) of each tool
// family.
type PermissionConfig struct {
	Bash     string `json:"bash"`
	Edit     string `json:"edit"`
	Webfetch string `json:"webfetch"`
}
