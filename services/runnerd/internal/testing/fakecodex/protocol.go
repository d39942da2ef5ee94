package fakecodex

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// Wire shapes of codex app-server 0.169.0 as far as the fake produces them.
// Field names and nesting follow the recorded transcripts; fields the fake
// has no meaningful value for are emitted as null like the real server does.

const (
	cliVersion         = "0.169.0"
	modelContextWindow = 258400
	errCodeInvalidReq  = -32600

	statusInProgress  = codexwire.TurnInProgress
	statusCompleted   = codexwire.TurnCompleted
	statusInterrupted = codexwire.TurnInterrupted
	statusFailed      = codexwire.TurnFailed

	itemUserMessage  = codexwire.ItemUserMessage
	itemAgentMessage = codexwire.ItemAgentMessage
)

// supportedMethods lists the client requests the fake understands, in the
// order used for the "unknown variant" error text.
var supportedMethods = []string{
	codexwire.MethodInitialize,
	codexwire.MethodThreadStart,
	codexwire.MethodThreadResume,
	codexwire.MethodThreadRead,
	codexwire.MethodThreadRevert,
	codexwire.MethodTurnStart,
	codexwire.MethodTurnSteer,
	codexwire.MethodTurnInterrupt,
}

// inbound is any line a client may send: a request (method+id), a
// notification (method only) or a response to a server request (id and
// result or error, no method).
type inbound struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

func (m *inbound) hasID() bool {
	return len(m.ID) > 0 && string(m.ID) != "null"
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

func invalidRequest(format string, args ...any) *rpcError {
	return &rpcError{Code: errCodeInvalidReq, Message: fmt.Sprintf(format, args...)}
}

func missingField(name string) *rpcError {
	return invalidRequest("Invalid request: missing field `%s`", name)
}

func unknownVariant(method string) *rpcError {
	quoted := make([]string, len(supportedMethods))
	for i, m := range supportedMethods {
		quoted[i] = "`" + m + "`"
	}
	return invalidRequest("Invalid request: unknown variant `%s`, expected one of %s", method, strings.Join(quoted, ", "))
}

type responseMsg struct {
	ID     json.RawMessage `json:"id"`
	Result any             `json:"result"`
}

type errorMsg struct {
	ID    json.RawMessage `json:"id"`
	Error *rpcError       `json:"error"`
}

type notificationMsg struct {
	Method      string `json:"method"`
	Params      any    `json:"params"`
	EmittedAtMs int64  `json:"emittedAtMs"`
}

// params decodes a request's params into an object keyed by field name, so
// handlers can report missing fields the way the real server does.
type params map[string]json.RawMessage

func parseParams(raw json.RawMessage) (params, *rpcError) {
	p := params{}
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, invalidRequest("Invalid request: %v", err)
	}
	return p, nil
}

func (p params) has(name string) bool {
	v, ok := p[name]
	return ok && string(v) != "null"
}

func (p params) str(name string) (string, *rpcError) {
	v, ok := p[name]
	if !ok || string(v) == "null" {
		return "", missingField(name)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", invalidRequest("Invalid request: invalid type for `%s`: expected a string", name)
	}
	return s, nil
}

func (p params) optStr(name, def string) (string, *rpcError) {
	if !p.has(name) {
		return def, nil
	}
	return p.str(name)
}

func (p params) optBool(name string) (bool, *rpcError) {
	if !p.has(name) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(p[name], &b); err != nil {
		return false, invalidRequest("Invalid request: invalid type for `%s`: expected a boolean", name)
	}
	return b, nil
}

// inputTexts decodes `input: [{type:"text", text}]`.
func (p params) inputTexts() ([]string, *rpcError) {
	raw, ok := p["input"]
	if !ok || string(raw) == "null" {
		return nil, missingField("input")
	}
	var items []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalidRequest("Invalid request: invalid type for `input`: expected a sequence")
	}
	texts := make([]string, 0, len(items))
	for _, it := range items {
		if it.Type != "text" || it.Text == nil {
			return nil, invalidRequest("Invalid request: fake codex app-server accepts only text input items, got `%s`", it.Type)
		}
		texts = append(texts, *it.Text)
	}
	if len(texts) == 0 {
		return nil, invalidRequest("Invalid request: input must not be empty")
	}
	return texts, nil
}

// ---- outbound object builders ----

func threadStatus(active bool) codexwire.ThreadStatus {
	if active {
		return codexwire.ActiveStatus()
	}
	return codexwire.IdleStatus()
}

func sandboxObject(mode string) codexwire.SandboxPolicy {
	no := new(bool)
	switch mode {
	case "workspace-write":
		return codexwire.SandboxPolicy{Type: "workspaceWrite", WritableRoots: []string{},
			NetworkAccess: no, ExcludeTmpdirEnvVar: no, ExcludeSlashTmp: no}
	case "danger-full-access":
		return codexwire.SandboxPolicy{Type: "dangerFullAccess"}
	default:
		return codexwire.SandboxPolicy{Type: "readOnly", NetworkAccess: no}
	}
}

func int64p(v int64) *int64 { return &v }

// rawItem encodes an item for a turn's item list.
func rawItem(item any) json.RawMessage {
	b, err := json.Marshal(item)
	if err != nil {
		panic(err) // the item types always encode
	}
	return b
}

func userMessageObject(it *itemState, completed bool) codexwire.UserMessageItem {
	content := make([]codexwire.UserInput, 0, len(it.Texts))
	for _, t := range it.Texts {
		content = append(content, codexwire.UserInput{Type: "text", Text: t, TextElements: []json.RawMessage{}})
	}
	obj := codexwire.UserMessageItem{Type: codexwire.ItemUserMessage, ID: it.ID, Content: content, StartedAtMs: it.StartedAtMs}
	if completed {
		obj.CompletedAtMs = int64p(it.CompletedAtMs)
	}
	return obj
}

func agentMessageObject(it *itemState, completed bool) codexwire.AgentMessageItem {
	obj := codexwire.AgentMessageItem{Type: codexwire.ItemAgentMessage, ID: it.ID, StartedAtMs: it.StartedAtMs}
	if completed {
		obj.CompletedAtMs = int64p(it.CompletedAtMs)
		obj.Text = it.Text
	}
	return obj
}

func itemObject(it *itemState) json.RawMessage {
	if it.Type == itemAgentMessage {
		return rawItem(agentMessageObject(it, true))
	}
	return rawItem(userMessageObject(it, true))
}

// historyTurn renders a stored turn for thread/resume and thread/read.
func historyTurn(t *turnState, withItems bool) codexwire.Turn {
	obj := codexwire.Turn{
		ID:         t.ID,
		RootTurnID: t.ID,
		Items:      []json.RawMessage{},
		ItemsView:  "notLoaded",
		Status:     t.Status,
		StartedAt:  int64p(t.StartedAtMs / 1000),
	}
	if withItems {
		obj.ItemsView = "full"
		for _, it := range t.Items {
			obj.Items = append(obj.Items, itemObject(it))
		}
	}
	if t.Status != statusInProgress && t.EndedAtMs > 0 {
		obj.CompletedAt = int64p(t.EndedAtMs / 1000)
		obj.DurationMs = int64p(t.EndedAtMs - t.StartedAtMs)
	}
	return obj
}

func tokenUsageParams(threadID, turnID string, u usageState) codexwire.TokenUsageUpdated {
	return codexwire.TokenUsageUpdated{ThreadID: threadID, TurnID: turnID,
		TokenUsage: codexwire.TokenUsage{Total: u.Total, Last: u.Last, ModelContextWindow: modelContextWindow}}
}
