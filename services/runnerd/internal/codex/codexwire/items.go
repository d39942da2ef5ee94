package codexwire

import "encoding/json"

// ItemStarted is the params of item/started.
type ItemStarted struct {
	Item        json.RawMessage `json:"item"`
	ThreadID    string          `json:"threadId"`
	TurnID      string          `json:"turnId"`
	StartedAtMs int64           `json:"startedAtMs"`
}

// ItemCompleted is the params of item/completed.
type ItemCompleted struct {
	Item              json.RawMessage `json:"item"`
	ThreadID          string          `json:"threadId"`
	TurnID            string          `json:"turnId"`
	ContentTokenCount *int64          `json:"contentTokenCount"`
	CompletedAtMs     int64           `json:"completedAtMs"`
}

// UserMessageItem is an item of type userMessage.
type UserMessageItem struct {
	Type          string      `json:"type"`
	ID            string      `json:"id"`
	ClientID      *string     `json:"clientId"`
	Content       []UserInput `json:"content"`
	StartedAtMs   int64       `json:"startedAtMs"`
	CompletedAtMs *int64      `json:"completedAtMs"`
}

// AgentMessageItem is an item of type agentMessage (Text is empty until
// the item completes; deltas carry it meanwhile).
type AgentMessageItem struct {
	Type           string          `json:"type"`
	Moderation     json.RawMessage `json:"moderation"`
	ID             string          `json:"id"`
	Text           string          `json:"text"`
	Phase          *string         `json:"phase"`
	MemoryCitation json.RawMessage `json:"memoryCitation"`
	Delivery       *string         `json:"delivery"`
	Questions      json.RawMessage `json:"questions"`
	StartedAtMs    int64           `json:"startedAtMs"`
	CompletedAtMs  *int64          `json:"completedAtMs"`
}

// CommandExecutionItem is an item of type commandExecution (status
// inProgress, completed, failed or declined).
type CommandExecutionItem struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	PluginID         *string         `json:"pluginId"`
	ScriptPath       *string         `json:"scriptPath"`
	Command          string          `json:"command"`
	Cwd              string          `json:"cwd"`
	ProcessID        *string         `json:"processId"`
	Source           string          `json:"source"`
	Status           string          `json:"status"`
	CommandActions   []CommandAction `json:"commandActions"`
	AggregatedOutput *string         `json:"aggregatedOutput"`
	ExitCode         *int            `json:"exitCode"`
	DurationMs       *int64          `json:"durationMs"`
	StartedAtMs      *int64          `json:"startedAtMs"`
	CompletedAtMs    *int64          `json:"completedAtMs"`
}

// CommandAction is what the server understood a command to do.
type CommandAction struct {
	Type    string `json:"type"` // read, listFiles, search, unknown
	Command string `json:"command"`
}

// DynamicToolCallItem is an item of type dynamicToolCall: a call of one of
// the thread's dynamic tools, answered by the client (item/tool/call).
type DynamicToolCallItem struct {
	Type          string          `json:"type"`
	ID            string          `json:"id"`
	Namespace     *string         `json:"namespace"`
	Tool          string          `json:"tool"`
	Arguments     json.RawMessage `json:"arguments"` // the tool's own
	Status        string          `json:"status"`
	ContentItems  []ContentItem   `json:"contentItems"`
	Success       *bool           `json:"success"`
	DurationMs    *int64          `json:"durationMs"`
	StartedAtMs   *int64          `json:"startedAtMs"`
	CompletedAtMs *int64          `json:"completedAtMs"`
}

// PlanItem is an item of type plan: the plan document of plan mode.
type PlanItem struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Text string `json:"text"`
}

// Item is the part of any item tether reads: its kind and id, and the
// fields of the kinds it interprets (agentMessage and plan text,
// commandExecution status and exit code, dynamicToolCall tool and
// success, mcpToolCall server and tool).
type Item struct {
	Type      string  `json:"type"`
	ID        string  `json:"id"`
	Text      string  `json:"text"`
	Status    string  `json:"status"`
	ExitCode  *int64  `json:"exitCode"`
	Tool      string  `json:"tool"`
	Namespace *string `json:"namespace"`
	Server    string  `json:"server"`
	Success   *bool   `json:"success"`
}

// ---- server requests ----

// CommandApprovalParams are the params of
// item/commandExecution/requestApproval. AvailableDecisions holds strings
// ("accept", "cancel", …) and single-key objects
// ({"acceptWithExecpolicyAmendment": {…}}).
type CommandApprovalParams struct {
	Kind                        string            `json:"kind"` // command
	ThreadID                    string            `json:"threadId"`
	TurnID                      string            `json:"turnId"`
	ItemID                      string            `json:"itemId"`
	StartedAtMs                 int64             `json:"startedAtMs,omitempty"`
	EnvironmentID               string            `json:"environmentId"`
	Command                     string            `json:"command"`
	Cwd                         string            `json:"cwd"`
	CommandActions              []CommandAction   `json:"commandActions"`
	ProposedExecpolicyAmendment []string          `json:"proposedExecpolicyAmendment"`
	AvailableDecisions          []json.RawMessage `json:"availableDecisions"`
}

// ExecpolicyAmendment is the object of an acceptWithExecpolicyAmendment
// decision.
type ExecpolicyAmendment struct {
	ExecpolicyAmendment []string `json:"execpolicy_amendment"`
}

// AcceptWithExecpolicyAmendment is that decision, as offered and as
// answered.
type AcceptWithExecpolicyAmendment struct {
	AcceptWithExecpolicyAmendment ExecpolicyAmendment `json:"acceptWithExecpolicyAmendment"`
}

// UserInputParams are the params of item/tool/requestUserInput.
type UserInputParams struct {
	ThreadID   string          `json:"threadId"`
	TurnID     string          `json:"turnId"`
	ItemID     string          `json:"itemId"`
	IsBlocking bool            `json:"isBlocking"`
	Questions  []InputQuestion `json:"questions"`
}

// InputQuestion is one question of a user input request.
type InputQuestion struct {
	ID       string        `json:"id"`
	Header   string        `json:"header"`
	Question string        `json:"question"`
	IsOther  bool          `json:"isOther"`
	IsSecret bool          `json:"isSecret"`
	Options  []InputOption `json:"options"`
}

// InputOption is one option of a question.
type InputOption struct {
	Label       string `json:"label"`
	Description string `json:"description"`
}

// UserInputResponse is the answer to a user input request: per question
// id, the answers given.
type UserInputResponse struct {
	Answers map[string]InputAnswer `json:"answers"`
}

// InputAnswer is the answers to one question.
type InputAnswer struct {
	Answers []string `json:"answers"`
}

// ToolCallParams are the params of item/tool/call.
type ToolCallParams struct {
	ThreadID  string          `json:"threadId"`
	TurnID    string          `json:"turnId"`
	CallID    string          `json:"callId"`
	Namespace *string         `json:"namespace"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"` // the tool's own
}

// ToolCallResponse is the answer to item/tool/call.
type ToolCallResponse struct {
	ContentItems []ContentItem `json:"contentItems"`
	Success      bool          `json:"success"`
}

// ContentItem is one part of a dynamic tool's output.
type ContentItem struct {
	Type     string `json:"type"` // inputText, inputImage, inputAudio
	Text     string `json:"text,omitempty"`
	ImageURL string `json:"imageUrl,omitempty"`
	AudioURL string `json:"audioUrl,omitempty"`
}

// PlainDecision is a DecisionResponse with decision d.
func PlainDecision(d string) DecisionResponse {
	b, _ := json.Marshal(d)
	return DecisionResponse{Decision: b}
}

// DecisionResponse answers an approval request: Decision is a string
// ("accept", "decline", "cancel", …) or a single-key object.
type DecisionResponse struct {
	Decision json.RawMessage `json:"decision"`
}

// ElicitationResponse answers an MCP server's elicitation request.
type ElicitationResponse struct {
	Action string `json:"action"`
}
