package scenario

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// target is one provider under test.
type target struct {
	name string
	// config returns the driver config of a new provider process; every
	// process of one suite run shares codexHome and workspace.
	config func(t *testing.T) codex.Config
	// historyReused checks that the model of turn `final` saw the earlier
	// prompts (the provider resent the thread's history).
	historyReused func(t *testing.T, final string, earlier []string)
	// userInputOptional: the target may never ask for user input (the real
	// codex decides whether request_user_input reaches the client).
	userInputOptional bool
	// turnTimeout bounds one turn.
	turnTimeout time.Duration
	// report receives a line per notable observation (printed by make
	// test-codex).
	report func(format string, args ...any)
}

// recorder collects driver events and wakes waiters.
type recorder struct {
	mu   sync.Mutex
	evs  []codex.Event
	wake chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{}, 1)} }

func (r *recorder) emit(e codex.Event) {
	if e.Body != nil {
		s, err := prp.Payload(e.Body)
		if err != nil {
			panic(err)
		}
		e.Payload = s.AsMap()
	}
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *recorder) since(n int) []codex.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs[min(n, len(r.evs)):])
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

// waitFor returns the first event after mark that matches, or false after d.
func (r *recorder) waitFor(mark int, d time.Duration, pred func(codex.Event) bool) (codex.Event, bool) {
	deadline := time.After(d)
	for {
		for _, e := range r.since(mark) {
			if pred(e) {
				return e, true
			}
		}
		select {
		case <-r.wake:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			return codex.Event{}, false
		}
	}
}

func ofType(typ string) func(codex.Event) bool {
	return func(e codex.Event) bool { return e.Type == typ }
}

type proc struct {
	s   *codex.Session
	rec *recorder
}

func startProc(t *testing.T, tg target) *proc {
	t.Helper()
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := codex.Start(ctx, tg.config(t), rec.emit)
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer ccancel()
		_ = s.Close(cctx, 2*time.Second)
	})
	return &proc{s: s, rec: rec}
}

func (p *proc) waitTurn(t *testing.T, tg target, turnID string) codex.TurnResult {
	t.Helper()
	select {
	case r := <-p.s.TurnDone():
		require.Equal(t, turnID, r.TurnID)
		return r
	case <-time.After(tg.turnTimeout):
		t.Fatalf("turn %s did not finish within %s; events: %v", turnID, tg.turnTimeout, types(p.rec.since(0)))
		return codex.TurnResult{}
	}
}

func types(evs []codex.Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// turn runs one plain turn to its end.
func (p *proc) turn(t *testing.T, tg target, text string) (codex.TurnResult, []codex.Event) {
	t.Helper()
	mark := p.rec.len()
	id, err := p.s.StartTurn(context.Background(), text)
	require.NoError(t, err)
	res := p.waitTurn(t, tg, id)
	return res, p.rec.since(mark)
}

func commandItems(evs []codex.Event) []codex.Event {
	var out []codex.Event
	for _, e := range evs {
		if e.Type == "item.completed" && e.Payload["kind"] == "commandExecution" {
			out = append(out, e)
		}
	}
	return out
}

// runSuite drives the whole scenario sequence against tg.
func runSuite(t *testing.T, tg target, workspace string) {
	report := tg.report
	if report == nil {
		report = func(string, ...any) {}
	}
	ctx := context.Background()
	p1 := startProc(t, tg)
	threadID, resumed, err := p1.s.OpenThread(ctx, "")
	require.NoError(t, err)
	require.False(t, resumed)
	pid1 := p1.s.Process().PID
	report("thread %s on provider pid %d", threadID, pid1)

	// 1. Three warm turns on one process; history reused.
	prompts := []string{"first warm turn alpha", "second warm turn beta", "third warm turn gamma"}
	var finals []string
	for i, prompt := range prompts {
		start := time.Now()
		res, evs := p1.turn(t, tg, prompt)
		require.Equal(t, codex.TurnCompleted, res.Status, "turn %d: %s %s", i+1, res.ErrorCode, res.ErrorMessage)
		assert.Contains(t, res.FinalMessage, prompt)
		assert.NotEmpty(t, filter(evs, ofType("usage.reported")), "usage.reported in turn %d", i+1)
		assert.Positive(t, res.Usage.InputTokens+res.Usage.OutputTokens, "turn usage")
		// SPEC E1: the turn's usage is its delta; the thread's total is
		// reported beside it and, after the first turn, is larger.
		if assert.NotNil(t, res.Total, "turn %d: thread total", i+1) {
			assert.GreaterOrEqual(t, res.Total.InputTokens, res.Usage.InputTokens, "turn %d", i+1)
			if i > 0 {
				assert.Greater(t, res.Total.InputTokens, res.Usage.InputTokens, "turn %d: the delta is not the thread total", i+1)
			}
		}
		var totalIn int64
		if res.Total != nil {
			totalIn = res.Total.InputTokens
		}
		finals = append(finals, res.FinalMessage)
		report("warm turn %d: %q in %s (usage in=%d out=%d; thread total in=%d)", i+1, res.FinalMessage, time.Since(start).Round(time.Millisecond),
			res.Usage.InputTokens, res.Usage.OutputTokens, totalIn)
	}
	tg.historyReused(t, finals[2], prompts[:2])
	assert.Equal(t, pid1, p1.s.Process().PID)

	// 2. Steer during a slow turn.
	mark := p1.rec.len()
	turnID, err := p1.s.StartTurn(ctx, "[slow] tell me slowly")
	require.NoError(t, err)
	_, ok := p1.rec.waitFor(mark, tg.turnTimeout, ofType("item.delta"))
	require.True(t, ok, "a delta of the slow turn")
	require.NoError(t, p1.s.Steer(ctx, turnID, "steer: also mention bananas"))
	res := p1.waitTurn(t, tg, turnID)
	require.Equal(t, codex.TurnCompleted, res.Status)
	assert.Contains(t, res.FinalMessage, "bananas")
	report("steer: %q", res.FinalMessage)

	// 3. Interrupt.
	mark = p1.rec.len()
	turnID, err = p1.s.StartTurn(ctx, "[slow] interrupt me")
	require.NoError(t, err)
	_, ok = p1.rec.waitFor(mark, tg.turnTimeout, ofType("item.delta"))
	require.True(t, ok)
	t0 := time.Now()
	require.NoError(t, p1.s.Interrupt(ctx, turnID))
	res = p1.waitTurn(t, tg, turnID)
	assert.Equal(t, codex.TurnInterrupted, res.Status)
	report("interrupt: turn ended %s after turn/interrupt", time.Since(t0).Round(time.Millisecond))

	// 4. Command approval: accept, then decline.
	for _, decision := range []string{"accept", "decline"} {
		mark = p1.rec.len()
		turnID, err = p1.s.StartTurn(ctx, "[shell] please make the directory ("+decision+")")
		require.NoError(t, err)
		created, ok := p1.rec.waitFor(mark, tg.turnTimeout, ofType("runtime_request.created"))
		require.True(t, ok, "approval request (%s); events %v", decision, types(p1.rec.since(mark)))
		assert.Equal(t, codex.KindCommandApproval, created.Payload["kind"])
		assert.Equal(t, turnID, created.TurnID)
		reqID, _ := created.Payload["requestId"].(string)
		require.NotEmpty(t, reqID)
		_, err = p1.s.ResolveRequest(ctx, reqID, provider.Resolution{Decision: decision})
		require.NoError(t, err)
		res = p1.waitTurn(t, tg, turnID)
		require.Equal(t, codex.TurnCompleted, res.Status, "%s: %s", decision, res.ErrorMessage)
		evs := p1.rec.since(mark)
		require.Len(t, filter(evs, ofType("runtime_request.resolved")), 1)
		items := commandItems(evs)
		require.NotEmpty(t, items, "a commandExecution item")
		want := "completed"
		if decision == "decline" {
			want = "declined"
		}
		assert.Equal(t, want, items[len(items)-1].Payload["status"])
		report("approval %s: request %s, command %v → item %v, reply %q", decision, reqID, created.Payload["command"], items[len(items)-1].Payload["status"], res.FinalMessage)
	}
	if _, err := os.Stat(filepath.Join(workspace, "approved-dir")); err == nil {
		report("approved command ran: %s exists", filepath.Join(workspace, "approved-dir"))
	}

	// 5. User input.
	mark = p1.rec.len()
	// codex offers request_user_input to the model in plan mode only.
	turnID, err = p1.s.StartTurnWith(ctx, "[ask] which color do you want", codex.TurnOptions{CollaborationMode: "plan"})
	require.NoError(t, err)
	wait := tg.turnTimeout
	created, ok := p1.rec.waitFor(mark, wait, func(e codex.Event) bool {
		return e.Type == "runtime_request.created" || (e.TurnID == turnID && strings.HasPrefix(e.Type, "turn.") && e.Type != "turn.started")
	})
	if ok && created.Type == "runtime_request.created" {
		assert.Equal(t, codex.KindUserInput, created.Payload["kind"])
		reqID, _ := created.Payload["requestId"].(string)
		_, err = p1.s.ResolveRequest(ctx, reqID, provider.Resolution{HasAnswers: true, Answers: map[string][]string{"color": {"red"}}})
		require.NoError(t, err)
		res = p1.waitTurn(t, tg, turnID)
		require.Equal(t, codex.TurnCompleted, res.Status, res.ErrorMessage)
		assert.Contains(t, res.FinalMessage, "red")
		report("user input: request %s answered color=red → %q", reqID, res.FinalMessage)
	} else {
		if !tg.userInputOptional {
			t.Fatalf("no user input request; events %v", types(p1.rec.since(mark)))
		}
		res = p1.waitTurn(t, tg, turnID)
		report("user input: the provider did not ask the client (turn %s: %q); see README", res.Status, res.FinalMessage)
	}

	// 6. Dynamic tool call, answered by the built-in handler.
	res, evs := p1.turn(t, tg, "[dyn] look up alpha")
	require.Equal(t, codex.TurnCompleted, res.Status, res.ErrorMessage)
	in := filter(evs, ofType("semantic_tool.input"))
	require.Len(t, in, 1)
	assert.Equal(t, "mock_lookup", in[0].Payload["tool"])
	out := filter(evs, ofType("semantic_tool.result"))
	require.Len(t, out, 1)
	assert.Equal(t, true, out[0].Payload["success"])
	assert.Contains(t, res.FinalMessage, "lookup(alpha) = 42")
	report("dynamic tool: %s → %q", in[0].Payload["callId"], res.FinalMessage)

	// 6b. A provider plan update (E3): the model's update_plan becomes a
	// run.plan_updated event with the plan's steps. codex refuses
	// update_plan in plan mode, which the user-input turn left on.
	mark = p1.rec.len()
	turnID, err = p1.s.StartTurnWith(ctx, "[plan] plan the change", codex.TurnOptions{CollaborationMode: "default"})
	require.NoError(t, err)
	res = p1.waitTurn(t, tg, turnID)
	evs = p1.rec.since(mark)
	require.Equal(t, codex.TurnCompleted, res.Status, res.ErrorMessage)
	plans := filter(evs, ofType(codex.EventPlanUpdated))
	require.NotEmpty(t, plans, "a plan update; events %v", types(evs))
	assert.Equal(t, "turn_plan", plans[0].Payload["source"])
	steps, _ := plans[0].Payload["steps"].([]any)
	require.NotEmpty(t, steps)
	report("plan update: %v", plans[0].Payload)
	assert.Equal(t, pid1, p1.s.Process().PID, "all of the above on one provider process")

	// 7. Kill the provider mid-turn; resume in a new process; reconcile the
	// killed turn; one more turn.
	mark = p1.rec.len()
	turnID, err = p1.s.StartTurn(ctx, "[slow] this turn will be killed")
	require.NoError(t, err)
	_, ok = p1.rec.waitFor(mark, tg.turnTimeout, ofType("item.delta"))
	require.True(t, ok)
	require.NoError(t, syscall.Kill(-p1.s.Process().PGID, syscall.SIGKILL))
	res = p1.waitTurn(t, tg, turnID)
	assert.Equal(t, codex.TurnFailed, res.Status)
	assert.Equal(t, failure.ProviderProcessExited, res.ErrorCode)
	<-p1.s.Exited()
	report("killed provider pid %d mid-turn %s: %s", pid1, turnID, res.ErrorMessage)

	p2 := startProc(t, tg)
	require.NotEqual(t, pid1, p2.s.Process().PID)
	tid, resumed, err := p2.s.OpenThread(ctx, threadID)
	require.NoError(t, err)
	require.True(t, resumed)
	require.Equal(t, threadID, tid)
	rec, err := p2.s.ReconcileTurn(ctx, turnID)
	require.NoError(t, err)
	assert.Equal(t, codex.ReconcileTerminalized, rec.Outcome)
	assert.Equal(t, codex.TurnInterrupted, rec.Status)
	killed := p2.waitTurn(t, tg, turnID)
	assert.Equal(t, codex.TurnInterrupted, killed.Status)
	_, err = p2.s.ReconcileTurn(ctx, "no-such-turn")
	assert.Equal(t, failure.ProviderTurnMissing, codex.CodeOf(err))
	report("resumed thread in pid %d; killed turn reconciled as %s (%s)", p2.s.Process().PID, rec.Status, rec.Outcome)

	res, _ = p2.turn(t, tg, "after resume delta")
	require.Equal(t, codex.TurnCompleted, res.Status, res.ErrorMessage)
	assert.Contains(t, res.FinalMessage, "after resume delta")
	tg.historyReused(t, res.FinalMessage, prompts)
	report("turn after resume: %q", res.FinalMessage)
}

func filter(evs []codex.Event, pred func(codex.Event) bool) []codex.Event {
	var out []codex.Event
	for _, e := range evs {
		if pred(e) {
			out = append(out, e)
		}
	}
	return out
}
