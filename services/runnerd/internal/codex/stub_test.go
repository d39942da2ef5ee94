package codex

// A scripted JSON-RPC peer for the unit tests: the test binary re-executes
// itself with CODEX_STUB_SCENARIO set and TestMain runs runStub instead of
// the tests. Turn behaviour is keyed on markers in the prompt text.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

const (
	stubScenarioEnv = "CODEX_STUB_SCENARIO"
	stubEnvDumpEnv  = "CODEX_STUB_ENV_DUMP" // write {"env":[...],"cwd":...} here at startup
	stubRecordEnv   = "CODEX_STUB_RECORD"   // append every received line here
	stubPIDFileEnv  = "CODEX_STUB_PIDFILE"  // write own pid here at startup
	stubChildEnv    = "CODEX_STUB_CHILD"    // grandchild pid is written here (scenario group)
)

func TestMain(m *testing.M) {
	if sc := os.Getenv(stubScenarioEnv); sc != "" {
		os.Exit(runStub(sc))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

type stubPeer struct {
	scenario string
	in       chan map[string]any
	outMu    sync.Mutex
	out      *bufio.Writer
	record   *os.File

	threadID  string
	resumed   bool
	history   []any // turns reported by thread/read
	turnSeq   int
	msgSeq    int
	total     [3]int64 // input, cached, output
	lastUsage [3]int64
}

func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

func runStub(scenario string) int {
	if p := os.Getenv(stubPIDFileEnv); p != "" {
		_ = os.WriteFile(p, []byte(fmt.Sprint(os.Getpid())), 0o600)
	}
	if p := os.Getenv(stubEnvDumpEnv); p != "" {
		cwd, _ := os.Getwd()
		b, _ := json.Marshal(map[string]any{"env": os.Environ(), "cwd": cwd})
		_ = os.WriteFile(p, b, 0o600)
	}
	switch scenario {
	case "sleeper":
		signal.Ignore(syscall.SIGTERM)
		sleepForever()
	case "stderr":
		big := strings.Repeat("x", 100_000)
		fmt.Fprintln(os.Stderr, big)
		for i := 0; i < 200; i++ {
			fmt.Fprintf(os.Stderr, "\x1b[33m WARN\x1b[0m stderr line %d\n", i)
		}
		fmt.Fprintln(os.Stderr, "request failed: Authorization: Bearer abc.def-secret OPENAI_API_KEY=sk-secret123456 done")
		fmt.Fprintln(os.Stderr, "stderr-done")
	}
	st := &stubPeer{scenario: scenario, in: make(chan map[string]any, 16), out: bufio.NewWriter(os.Stdout)}
	if p := os.Getenv(stubRecordEnv); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err == nil {
			st.record = f
		}
	}
	go st.readIn()
	for msg := range st.in {
		st.handle(msg)
	}
	if scenario == "group" {
		sleepForever() // ignore stdin EOF; only signals end this process
	}
	return 0
}

func (st *stubPeer) readIn() {
	br := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if st.record != nil {
				_, _ = st.record.Write(line)
			}
			var m map[string]any
			dec := json.NewDecoder(strings.NewReader(string(line)))
			dec.UseNumber()
			if dec.Decode(&m) == nil {
				st.in <- m
			}
		}
		if err != nil {
			close(st.in)
			return
		}
	}
}

func (st *stubPeer) sendRaw(line string) {
	st.outMu.Lock()
	defer st.outMu.Unlock()
	_, _ = st.out.WriteString(line)
	_ = st.out.Flush()
}

func (st *stubPeer) send(v any) {
	b, _ := json.Marshal(v)
	st.sendRaw(string(b) + "\n")
}

func (st *stubPeer) respond(id any, result any) { st.send(map[string]any{"id": id, "result": result}) }

func (st *stubPeer) respondErr(id any, code int, msg string) {
	st.send(map[string]any{"id": id, "error": map[string]any{"code": code, "message": msg}})
}

func (st *stubPeer) notify(method string, params map[string]any) {
	st.send(map[string]any{"method": method, "params": params, "emittedAtMs": time.Now().UnixMilli()})
}

func (st *stubPeer) handle(msg map[string]any) {
	method, _ := msg["method"].(string)
	id := msg["id"]
	params, _ := msg["params"].(map[string]any)
	switch method {
	case "initialize":
		switch st.scenario {
		case "init_hang":
			return
		case "init_error":
			st.respondErr(id, -32600, "Invalid request: missing field `clientInfo`")
		case "init_bad":
			st.respond(id, "not-an-object")
		case "init_null":
			st.respond(id, nil)
		default:
			st.respond(id, map[string]any{"userAgent": "stub/0.0.0", "platformOs": "linux"})
		}
	case "initialized":
		switch st.scenario {
		case "exit_after_init":
			os.Exit(7)
		case "close_stdout":
			st.outMu.Lock()
			_ = os.Stdout.Close()
			sleepForever()
		case "group":
			signal.Ignore(syscall.SIGTERM)
			exe, _ := os.Executable()
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), stubScenarioEnv+"=sleeper")
			cmd.Stdout = os.Stdout // the grandchild holds the stdout pipe too
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err == nil {
				_ = os.WriteFile(os.Getenv(stubChildEnv), []byte(fmt.Sprint(cmd.Process.Pid)), 0o600)
			}
		}
	case "thread/start":
		switch st.scenario {
		case "oversize":
			st.sendRaw(`{"method":"warning","params":{"message":"` + strings.Repeat("a", 5<<20) + `"}}` + "\n")
			return
		case "malformed":
			st.sendRaw("{this is not json\n")
			return
		}
		st.threadID = "thr-1"
		st.notify("configWarning", map[string]any{"summary": "stub config warning", "details": nil})
		st.respond(id, map[string]any{
			"thread": map[string]any{"id": st.threadID, "sessionId": "sess-1", "status": map[string]any{"type": "idle"}},
			"model":  "stub-model",
		})
		st.notify("thread/started", map[string]any{"thread": map[string]any{"id": st.threadID}})
	case "thread/resume":
		tid, _ := params["threadId"].(string)
		switch tid {
		case "thr-mismatch":
			st.respond(id, map[string]any{"thread": map[string]any{"id": "thr-someone-else"}})
		case "thr-missing":
			st.respondErr(id, -32600, "no rollout found for thread id thr-missing")
		default:
			st.threadID, st.resumed = tid, true
			if tid == "thr-hist" {
				st.history = []any{
					map[string]any{"id": "turn-old-1", "status": "completed", "items": []any{
						map[string]any{"type": "userMessage", "id": "u1"},
						map[string]any{"type": "agentMessage", "id": "m1", "text": "old answer"},
					}},
					map[string]any{"id": "turn-old-2", "status": "interrupted", "items": []any{}},
					map[string]any{"id": "turn-old-3", "status": "failed", "items": []any{}, "error": map[string]any{"message": "model failed"}},
					map[string]any{"id": "turn-old-4", "status": "inProgress", "items": []any{}},
				}
			}
			st.notify("deprecationNotice", map[string]any{"summary": "stub deprecation", "details": nil})
			st.respond(id, map[string]any{"thread": map[string]any{"id": tid, "sessionId": tid}})
		}
	case "turn/start":
		input, _ := params["input"].([]any)
		text := ""
		if len(input) > 0 {
			first, _ := input[0].(map[string]any)
			text, _ = first["text"].(string)
		}
		st.runTurn(id, text)
	case "turn/steer", "turn/interrupt":
		st.respondErr(id, -32600, "no active turn")
	case "thread/read":
		if params["threadId"] != st.threadID {
			st.respondErr(id, -32600, fmt.Sprintf("thread not found: %v", params["threadId"]))
			return
		}
		st.respond(id, map[string]any{"thread": map[string]any{"id": st.threadID, "status": map[string]any{"type": "idle"}, "turns": st.history}})
	}
}

func (st *stubPeer) usage(turnID string, in, cached, out int64, reemit bool) {
	if !reemit {
		st.lastUsage = [3]int64{in, cached, out}
		st.total[0] += in
		st.total[1] += cached
		st.total[2] += out
	}
	tot := func(v [3]int64) map[string]any {
		return map[string]any{"inputTokens": v[0], "cachedInputTokens": v[1], "outputTokens": v[2], "totalTokens": v[0] + v[2], "reasoningOutputTokens": 0}
	}
	st.notify("thread/tokenUsage/updated", map[string]any{"threadId": st.threadID, "turnId": turnID, "tokenUsage": map[string]any{
		"total": tot(st.total), "last": tot(st.lastUsage), "modelContextWindow": 258400,
	}})
}

func (st *stubPeer) item(method, turnID string, item map[string]any) {
	st.notify(method, map[string]any{"threadId": st.threadID, "turnId": turnID, "item": item})
}

func (st *stubPeer) agentMessage(turnID, text string, complete bool) map[string]any {
	st.msgSeq++
	mid := fmt.Sprintf("msg_%03d", st.msgSeq)
	st.item("item/started", turnID, map[string]any{"type": "agentMessage", "id": mid, "text": ""})
	for _, w := range strings.SplitAfter(text, " ") {
		st.notify("item/agentMessage/delta", map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": mid, "delta": w})
	}
	it := map[string]any{"type": "agentMessage", "id": mid, "text": text}
	if complete {
		st.item("item/completed", turnID, it)
	}
	return it
}

func (st *stubPeer) userMessage(turnID, text string) {
	st.msgSeq++
	it := map[string]any{"type": "userMessage", "id": fmt.Sprintf("user_%03d", st.msgSeq), "content": []any{map[string]any{"type": "text", "text": text}}}
	st.item("item/started", turnID, it)
	st.item("item/completed", turnID, it)
}

func (st *stubPeer) completeTurn(turnID, status string, items []any, turnErr any) {
	st.notify("thread/status/changed", map[string]any{"threadId": st.threadID, "status": map[string]any{"type": "idle"}})
	turn := map[string]any{"id": turnID, "items": items, "status": status, "error": turnErr}
	st.history = append(st.history, turn)
	st.notify("turn/completed", map[string]any{"threadId": st.threadID, "turn": turn})
}

// awaitResponse waits for the client's answer to server request id.
func (st *stubPeer) awaitResponse(id int) map[string]any {
	for msg := range st.in {
		if _, isReq := msg["method"]; isReq {
			continue
		}
		if n, ok := msg["id"].(json.Number); ok && n.String() == fmt.Sprint(id) {
			return msg
		}
	}
	os.Exit(0)
	return nil
}

func (st *stubPeer) runTurn(reqID any, text string) {
	st.turnSeq++
	turnID := fmt.Sprintf("turn-%d", st.turnSeq)
	if st.resumed && st.turnSeq == 1 {
		// Like codex after a resume: replay the persisted total, tagged with
		// an earlier turn, before the new turn starts.
		st.total = [3]int64{1000, 100, 50}
		st.lastUsage = [3]int64{400, 0, 20}
		st.usage("turn-old", 0, 0, 0, true)
	}
	st.notify("warning", map[string]any{"threadId": st.threadID, "message": "stub model metadata warning"})
	turnObj := map[string]any{"id": turnID, "items": []any{}, "status": "inProgress", "error": nil}
	started := func() {
		st.notify("thread/status/changed", map[string]any{"threadId": st.threadID, "status": map[string]any{"type": "active", "activeFlags": []any{}}})
		st.notify("turn/started", map[string]any{"threadId": st.threadID, "turn": turnObj})
	}
	if strings.Contains(text, "[turn-started-first]") {
		started()
		st.respond(reqID, map[string]any{"turn": turnObj})
	} else {
		st.respond(reqID, map[string]any{"turn": turnObj})
		started()
	}
	if strings.Contains(text, "[unknown-turn]") {
		st.notify("turn/completed", map[string]any{"threadId": st.threadID, "turn": map[string]any{"id": "turn-bogus", "items": []any{}, "status": "completed", "error": nil}})
	}
	if strings.Contains(text, "[foreign]") {
		st.notify("item/started", map[string]any{"threadId": "thr-foreign", "turnId": turnID, "item": map[string]any{"type": "agentMessage", "id": "msg_foreign"}})
	}
	st.userMessage(turnID, text)
	if strings.Contains(text, "[exit]") {
		os.Exit(3)
	}
	if strings.Contains(text, "[approval]") {
		st.item("item/started", turnID, map[string]any{"type": "commandExecution", "id": "call_1", "command": "/bin/bash -lc 'touch x'", "status": "inProgress"})
		reqs := []map[string]any{
			{"method": "item/commandExecution/requestApproval", "id": 0, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_1", "command": "/bin/bash -lc 'touch x'"}},
			{"method": "item/tool/call", "id": 1, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "callId": "call_2", "tool": "lookup", "arguments": map[string]any{"key": "a"}}},
			{"method": "currentTime/read", "id": 2, "params": map[string]any{"threadId": st.threadID}},
		}
		for i, r := range reqs {
			st.send(r)
			ans := st.awaitResponse(i)
			b, _ := json.Marshal(ans)
			st.notify("warning", map[string]any{"threadId": st.threadID, "message": "answer:" + string(b)})
		}
		st.item("item/completed", turnID, map[string]any{"type": "commandExecution", "id": "call_1", "status": "declined", "exitCode": nil})
	}
	if strings.Contains(text, "[input]") {
		st.item("item/started", turnID, map[string]any{"type": "toolCall", "id": "call_q"})
		st.send(map[string]any{"method": "item/tool/requestUserInput", "id": 0, "params": map[string]any{
			"threadId": st.threadID, "turnId": turnID, "itemId": "call_q", "isBlocking": true,
			"questions": []any{
				map[string]any{"id": "color", "header": "Color", "question": "Which color?", "isOther": false, "isSecret": false,
					"options": []any{map[string]any{"label": "red", "description": "warm"}, map[string]any{"label": "blue", "description": "cold"}}},
				map[string]any{"id": "name", "header": "Name", "question": "Your name?", "isOther": false, "isSecret": false, "options": nil},
			},
		}})
		ans := st.awaitResponse(0)
		b, _ := json.Marshal(ans)
		st.notify("warning", map[string]any{"threadId": st.threadID, "message": "answer:" + string(b)})
	}
	if strings.Contains(text, "[stale-tool]") {
		st.send(map[string]any{"method": "item/tool/call", "id": 5, "params": map[string]any{"threadId": st.threadID, "turnId": "turn-old", "callId": "call_old", "tool": "lookup", "arguments": map[string]any{"key": "z"}}})
		ans := st.awaitResponse(5)
		b, _ := json.Marshal(ans)
		st.notify("warning", map[string]any{"threadId": st.threadID, "message": "answer:" + string(b)})
	}
	if strings.Contains(text, "[tool-auto]") {
		st.send(map[string]any{"method": "item/tool/call", "id": 6, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "callId": "call_auto", "tool": "mock_lookup", "arguments": map[string]any{"key": "alpha"}}})
		ans := st.awaitResponse(6)
		b, _ := json.Marshal(ans)
		st.notify("warning", map[string]any{"threadId": st.threadID, "message": "answer:" + string(b)})
	}
	if strings.Contains(text, "[withdraw]") {
		st.send(map[string]any{"method": "item/commandExecution/requestApproval", "id": 0, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_w", "command": "rm -rf /"}})
		time.Sleep(50 * time.Millisecond)
		st.notify("serverRequest/resolved", map[string]any{"threadId": st.threadID, "requestId": 0})
	}
	if strings.Contains(text, "[approval-then-exit]") {
		st.send(map[string]any{"method": "item/commandExecution/requestApproval", "id": 0, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_x", "command": "ls"}})
		st.send(map[string]any{"method": "item/tool/requestUserInput", "id": 1, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_y",
			"questions": []any{map[string]any{"id": "q", "header": "Q", "question": "Why?"}}}})
		time.Sleep(100 * time.Millisecond)
		os.Exit(3)
	}
	if strings.Contains(text, "[approval-then-complete]") {
		st.send(map[string]any{"method": "item/commandExecution/requestApproval", "id": 0, "params": map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_x", "command": "ls"}})
	}
	if strings.Contains(text, "[fail]") {
		st.usage(turnID, 0, 0, 0, true)
		e := map[string]any{"message": "stream disconnected before completion: mock failure", "codexErrorInfo": "other"}
		st.notify("error", map[string]any{"error": e, "willRetry": false, "threadId": st.threadID, "turnId": turnID})
		st.completeTurn(turnID, "failed", []any{}, e)
		return
	}
	if strings.Contains(text, "[orphan]") {
		st.agentMessage(turnID, "partial never completed", false)
	}
	if strings.Contains(text, "[slow]") {
		st.slowTurn(turnID, text)
		return
	}
	msg := st.agentMessage(turnID, "ECHO: "+text, true)
	if strings.Contains(text, "[cmd]") {
		st.item("item/started", turnID, map[string]any{"type": "commandExecution", "id": "call_9", "status": "inProgress"})
		st.notify("item/commandExecution/outputDelta", map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": "call_9", "delta": "hello\n"})
		st.item("item/completed", turnID, map[string]any{"type": "commandExecution", "id": "call_9", "status": "completed", "exitCode": 0})
	}
	st.usage(turnID, 100, 10, 5, false)
	st.completeTurn(turnID, "completed", []any{msg}, nil)
	if strings.Contains(text, "[then-exit]") {
		os.Exit(0)
	}
}

// slowTurn streams a reply one delta every 30ms and reacts to steer and
// interrupt like codex: a steer abandons the streaming message (never
// completed) and answers the steer text; an interrupt ends the turn.
// With [deaf] it ignores both.
func (st *stubPeer) slowTurn(turnID, text string) {
	deaf := strings.Contains(text, "[deaf]")
	st.msgSeq++
	mid := fmt.Sprintf("msg_%03d", st.msgSeq)
	st.item("item/started", turnID, map[string]any{"type": "agentMessage", "id": mid, "text": ""})
	for i := 0; i < 20; i++ {
		st.notify("item/agentMessage/delta", map[string]any{"threadId": st.threadID, "turnId": turnID, "itemId": mid, "delta": fmt.Sprintf("w%d ", i)})
		select {
		case msg, ok := <-st.in:
			if !ok {
				os.Exit(0)
			}
			method, _ := msg["method"].(string)
			params, _ := msg["params"].(map[string]any)
			if deaf {
				continue
			}
			switch method {
			case "turn/interrupt":
				st.usage(turnID, 0, 0, 0, true)
				st.respond(msg["id"], map[string]any{})
				st.completeTurn(turnID, "interrupted", []any{}, nil)
				return
			case "turn/steer":
				if params["expectedTurnId"] != turnID {
					st.respondErr(msg["id"], -32600, fmt.Sprintf("expected active turn id `%v` but found `%s`", params["expectedTurnId"], turnID))
					continue
				}
				st.respond(msg["id"], map[string]any{"turnId": turnID})
				st.usage(turnID, 0, 0, 0, true) // aborted stream: unchanged totals re-emitted
				input, _ := params["input"].([]any)
				first, _ := input[0].(map[string]any)
				steerText, _ := first["text"].(string)
				st.userMessage(turnID, steerText)
				final := st.agentMessage(turnID, "ECHO: "+steerText, true)
				st.usage(turnID, 200, 0, 7, false)
				st.completeTurn(turnID, "completed", []any{final}, nil)
				return
			}
		case <-time.After(30 * time.Millisecond):
		}
	}
	it := map[string]any{"type": "agentMessage", "id": mid, "text": "slow reply"}
	st.item("item/completed", turnID, it)
	st.usage(turnID, 100, 10, 5, false)
	st.completeTurn(turnID, "completed", []any{it}, nil)
}
