package fakecodex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tether-run/tether/pkg/askuser"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// Server requests (server -> client) the fake can make, each answered by the
// client before the turn goes on:
//
//   - command approval (item/commandExecution/requestApproval) before a
//     commandExecution item: Options.EmitCommandApproval, or "[shell]" in the
//     prompt;
//   - user input (item/tool/requestUserInput): Options.EmitUserInput, or
//     "[ask]" in the prompt;
//   - dynamic tool call (item/tool/call): Options.EmitToolCall, or "[dyn]" in
//     the prompt;
//   - a governed wait: a call of the built-in tether_ask_user tool asking
//     one single-select question (AskUserTitle), on "[wait]" in the prompt;
//   - a stale tool call naming the thread's last stored turn, right after
//     each thread/resume: Options.EmitToolCallOnResume.
//
// Request ids are the server's own integers, from 0 per process, as with the
// real server. Each answer is written to the call log as
// approval-response:<decision>, user-input-response:<id>=<a>[,<b>][;…] or
// tool-response:<text>|failure.

const (
	reqApproval  = "approval"
	reqUserInput = "user-input"
	reqToolCall  = "tool"
	reqAskUser   = "ask-user"

	// AskUserTitle is the title of the fake's tether_ask_user call.
	AskUserTitle = "the fake's color choice"

	// FakeShellCommand is the command the fake asks approval for.
	FakeShellCommand = "/bin/bash -lc 'mkdir -p approved-dir && echo hello-from-fake-shell'"
	// FakeShellOutput is what an approved FakeShellCommand prints.
	FakeShellOutput = "hello-from-fake-shell\n"
)

// pendingReq is a server request waiting for the client's answer.
type pendingReq struct {
	kind     string
	at       *activeTurn // nil for the stale tool call after a resume
	threadID string
	turnID   string
	itemID   string
	tool     string
}

// requestPhases lists the server requests a turn makes before its reply,
// from the options and the markers in the turn's first user message.
func (s *Server) requestPhases(prompt string) []string {
	var out []string
	if s.opts.EmitCommandApproval || strings.Contains(prompt, "[shell]") {
		out = append(out, reqApproval)
	}
	if s.opts.EmitUserInput || strings.Contains(prompt, "[ask]") {
		out = append(out, reqUserInput)
	}
	if s.opts.EmitToolCall || strings.Contains(prompt, "[dyn]") {
		out = append(out, reqToolCall)
	}
	if strings.Contains(prompt, "[wait]") {
		out = append(out, reqAskUser)
	}
	return out
}

// continueTurn makes the turn's next server request, or streams its reply
// once none is left.
func (s *Server) continueTurn(at *activeTurn) error {
	if len(at.phases) == 0 {
		return s.beginReply(at)
	}
	kind := at.phases[0]
	at.phases = at.phases[1:]
	id := s.nextReqID
	s.nextReqID++
	th, t := at.thread, at.turn
	itemID := fmt.Sprintf("call-%s-%d", t.ID, id)
	pr := &pendingReq{kind: kind, at: at, threadID: th.ID, turnID: t.ID, itemID: itemID}
	s.pending[id] = pr
	at.waitingID, at.waiting = id, true
	switch kind {
	case reqApproval:
		if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: th.ID, Status: codexwire.ActiveStatus("waitingOnApproval")}); err != nil {
			return err
		}
		if err := s.notify(codexwire.NotifyItemStarted, codexwire.ItemStarted{ThreadID: th.ID, TurnID: t.ID, StartedAtMs: s.nowMs(), Item: rawItem(commandItem(itemID, th.Cwd, "inProgress", nil, ""))}); err != nil {
			return err
		}
		return s.write(serverRequestMsg{ID: id, Method: codexwire.RequestCommandApproval, Params: commandApprovalParams(th, t.ID, itemID)})
	case reqUserInput:
		return s.write(serverRequestMsg{ID: id, Method: codexwire.RequestUserInput, Params: codexwire.UserInputParams{
			ThreadID: th.ID, TurnID: t.ID, ItemID: itemID, IsBlocking: true,
			Questions: []codexwire.InputQuestion{{
				ID: "color", Header: "Color", Question: "Which color should the fake use?",
				Options: []codexwire.InputOption{{Label: "red", Description: "a warm color"}, {Label: "blue", Description: "a cold color"}},
			}},
		}})
	default:
		args := lookupArguments
		pr.tool = dynamicToolName(th)
		if kind == reqAskUser {
			pr.kind, pr.tool, args = reqToolCall, askuser.ToolName, askUserArguments()
		}
		if err := s.notify(codexwire.NotifyItemStarted, codexwire.ItemStarted{ThreadID: th.ID, TurnID: t.ID, StartedAtMs: s.nowMs(), Item: rawItem(dynamicToolItem(itemID, pr.tool, "inProgress", nil, nil))}); err != nil {
			return err
		}
		return s.write(serverRequestMsg{ID: id, Method: codexwire.RequestToolCall, Params: codexwire.ToolCallParams{
			ThreadID: th.ID, TurnID: t.ID, CallID: itemID, Tool: pr.tool, Arguments: args,
		}})
	}
}

// lookupArguments are the arguments of the fake's dynamic tool calls.
var lookupArguments = json.RawMessage(`{"key":"alpha"}`)

// fakeShellActions is what the fake says FakeShellCommand does.
var fakeShellActions = []codexwire.CommandAction{{Type: "unknown", Command: "mkdir -p approved-dir"}}

func commandApprovalParams(th *threadState, turnID, itemID string) codexwire.CommandApprovalParams {
	amendment := []string{"mkdir", "-p", "approved-dir"}
	withAmendment, _ := json.Marshal(codexwire.AcceptWithExecpolicyAmendment{
		AcceptWithExecpolicyAmendment: codexwire.ExecpolicyAmendment{ExecpolicyAmendment: amendment}})
	return codexwire.CommandApprovalParams{
		Kind: "command", ThreadID: th.ID, TurnID: turnID, ItemID: itemID, EnvironmentID: "local",
		Command: FakeShellCommand, Cwd: th.Cwd, CommandActions: fakeShellActions,
		ProposedExecpolicyAmendment: amendment,
		AvailableDecisions:          []json.RawMessage{json.RawMessage(`"accept"`), withAmendment, json.RawMessage(`"cancel"`)},
	}
}

// emitStaleToolCall sends, after a resume, a tool call naming the thread's
// last stored turn, which is no longer active.
func (s *Server) emitStaleToolCall(th *threadState) error {
	turnID := "provider-turn-0"
	if n := len(th.Turns); n > 0 {
		turnID = th.Turns[n-1].ID
	}
	id := s.nextReqID
	s.nextReqID++
	callID := fmt.Sprintf("call-resume-%d", id)
	tool := dynamicToolName(th)
	s.pending[id] = &pendingReq{kind: reqToolCall, threadID: th.ID, turnID: turnID, itemID: callID, tool: tool}
	return s.write(serverRequestMsg{ID: id, Method: codexwire.RequestToolCall, Params: codexwire.ToolCallParams{
		ThreadID: th.ID, TurnID: turnID, CallID: callID, Tool: tool, Arguments: lookupArguments,
	}})
}

// askUserArguments are the arguments of the fake's tether_ask_user call.
func askUserArguments() json.RawMessage {
	type option struct {
		ID    string `json:"id"`
		Label string `json:"label"`
	}
	type question struct {
		ID      string   `json:"id"`
		Prompt  string   `json:"prompt"`
		Options []option `json:"options"`
	}
	b, _ := json.Marshal(struct {
		Title     string     `json:"title"`
		Questions []question `json:"questions"`
	}{AskUserTitle, []question{{ID: "color", Prompt: "Which color should the fake use?",
		Options: []option{{ID: "red", Label: "red"}, {ID: "blue", Label: "blue"}}}}})
	return b
}

// dynamicToolName is the first of the thread's tools other than the
// built-in tether_ask_user, else mock_lookup.
func dynamicToolName(th *threadState) string {
	var tools []struct {
		Name string `json:"name"`
	}
	if len(th.DynamicTools) > 0 && json.Unmarshal(th.DynamicTools, &tools) == nil {
		for _, t := range tools {
			if t.Name != "" && t.Name != askuser.ToolName {
				return t.Name
			}
		}
	}
	return "mock_lookup"
}

func commandItem(id, cwd, status string, exitCode *int, output string) codexwire.CommandExecutionItem {
	item := codexwire.CommandExecutionItem{
		Type: codexwire.ItemCommandExecution, ID: id, Command: FakeShellCommand, Cwd: cwd, Status: status,
		Source: "agent", ExitCode: exitCode, CommandActions: fakeShellActions,
	}
	if output != "" {
		item.AggregatedOutput = &output
	}
	return item
}

func dynamicToolItem(id, tool, status string, success *bool, content []codexwire.ContentItem) codexwire.DynamicToolCallItem {
	return codexwire.DynamicToolCallItem{
		Type: codexwire.ItemDynamicToolCall, ID: id, Tool: tool, Arguments: lookupArguments,
		Status: status, Success: success, ContentItems: content,
	}
}

// requestResolved is the params of serverRequest/resolved for request id.
func requestResolved(threadID string, id int) codexwire.ServerRequestResolved {
	return codexwire.ServerRequestResolved{ThreadID: threadID, RequestID: json.RawMessage(strconv.Itoa(id))}
}

// handleClientResponse handles the client's answer to a server request.
func (s *Server) handleClientResponse(m *inbound) error {
	id, err := strconv.Atoi(string(bytes.TrimSpace(m.ID)))
	pr := s.pending[id]
	if err != nil || pr == nil {
		s.logCall(toolResponseEntry(m))
		s.diag("response to unknown server request %s", string(m.ID))
		return nil
	}
	delete(s.pending, id)
	failed := len(m.Error) > 0 && string(m.Error) != "null"
	entry, outcome := responseOutcome(pr, m, failed)
	s.logCall(entry)
	at := pr.at
	if at == nil || !at.waiting || at.waitingID != id || s.active[pr.threadID] != at {
		return nil // stale call, or the turn moved on (steer, interrupt)
	}
	at.waiting = false
	if err := s.notify(codexwire.NotifyServerRequestResolved, requestResolved(pr.threadID, id)); err != nil {
		return err
	}
	at.outcomes = append(at.outcomes, outcome)
	th, t := at.thread, at.turn
	switch pr.kind {
	case reqApproval:
		if done, err := s.applyApproval(at, pr, strings.TrimPrefix(outcome, "approval: ")); done || err != nil {
			return err
		}
	case reqToolCall:
		var r struct {
			Success      *bool                   `json:"success"`
			ContentItems []codexwire.ContentItem `json:"contentItems"`
		}
		_ = json.Unmarshal(m.Result, &r)
		ok := !failed && r.Success != nil && *r.Success
		status := "completed"
		if !ok {
			status = "failed"
		}
		if err := s.notify(codexwire.NotifyItemCompleted, codexwire.ItemCompleted{ThreadID: th.ID, TurnID: t.ID, CompletedAtMs: s.nowMs(), Item: rawItem(dynamicToolItem(pr.itemID, pr.tool, status, &ok, r.ContentItems))}); err != nil {
			return err
		}
	}
	return s.continueTurn(at)
}

// responseOutcome is the call-log entry and the turn's outcome line of
// the client's answer m to server request pr.
func responseOutcome(pr *pendingReq, m *inbound, failed bool) (entry, outcome string) {
	switch pr.kind {
	case reqApproval:
		decision := "failure"
		if !failed {
			var r struct {
				Decision json.RawMessage `json:"decision"`
			}
			if json.Unmarshal(m.Result, &r) == nil && len(r.Decision) > 0 {
				var str string
				var obj map[string]json.RawMessage
				switch {
				case json.Unmarshal(r.Decision, &str) == nil:
					decision = str
				case json.Unmarshal(r.Decision, &obj) == nil && len(obj) == 1:
					for k := range obj {
						decision = k
					}
				}
			}
		}
		entry, outcome = "approval-response:"+decision, "approval: "+decision
	case reqUserInput:
		summary := "failure"
		if !failed {
			var r codexwire.UserInputResponse
			if json.Unmarshal(m.Result, &r) == nil {
				ids := make([]string, 0, len(r.Answers))
				for qid := range r.Answers {
					ids = append(ids, qid)
				}
				sort.Strings(ids)
				parts := make([]string, 0, len(ids))
				for _, qid := range ids {
					parts = append(parts, qid+"="+strings.Join(r.Answers[qid].Answers, ","))
				}
				summary = strings.Join(parts, ";")
			}
		}
		entry, outcome = "user-input-response:"+summary, "input: "+summary
	default:
		entry = toolResponseEntry(m)
		outcome = "tool: " + strings.TrimPrefix(entry, "tool-response:")
	}
	return entry, outcome
}

// applyApproval notifies what the client's decision on a command approval
// does to the command item; done: the turn was interrupted (cancel) and
// does not continue.
func (s *Server) applyApproval(at *activeTurn, pr *pendingReq, decision string) (done bool, _ error) {
	th, t := at.thread, at.turn
	if err := s.notify(codexwire.NotifyThreadStatusChanged, codexwire.ThreadStatusChanged{ThreadID: th.ID, Status: codexwire.ActiveStatus()}); err != nil {
		return false, err
	}
	switch decision {
	case "accept", "acceptForSession", "acceptWithExecpolicyAmendment":
		if err := s.notify(codexwire.NotifyCommandOutputDelta, codexwire.Delta{ThreadID: th.ID, TurnID: t.ID, ItemID: pr.itemID, Delta: FakeShellOutput}); err != nil {
			return false, err
		}
		exit := 0
		if err := s.notify(codexwire.NotifyItemCompleted, commandCompleted(s, th, t, commandItem(pr.itemID, th.Cwd, "completed", &exit, FakeShellOutput))); err != nil {
			return false, err
		}
	case "cancel":
		if err := s.notify(codexwire.NotifyItemCompleted, commandCompleted(s, th, t, commandItem(pr.itemID, th.Cwd, "declined", nil, ""))); err != nil {
			return false, err
		}
		// cancel also interrupts the turn.
		return true, s.interruptTurn(at)
	default:
		if err := s.notify(codexwire.NotifyItemCompleted, commandCompleted(s, th, t, commandItem(pr.itemID, th.Cwd, "declined", nil, ""))); err != nil {
			return false, err
		}
	}
	return false, nil
}

// commandCompleted is the item/completed of a command item.
func commandCompleted(s *Server, th *threadState, t *turnState, item codexwire.CommandExecutionItem) codexwire.ItemCompleted {
	return codexwire.ItemCompleted{ThreadID: th.ID, TurnID: t.ID, CompletedAtMs: s.nowMs(), Item: rawItem(item)}
}

// serverRequestMsg is a server -> client request (no "jsonrpc", like the
// real server).
type serverRequestMsg struct {
	Method string `json:"method"`
	ID     int    `json:"id"`
	Params any    `json:"params"`
}
