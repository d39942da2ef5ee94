package opencode

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

var fakeBin string

func TestMain(m *testing.M) {
	fakeBin = filepath.Join(testbin.MustDir("github.com/tether-run/tether/services/runnerd/tools/fake-opencode"), "fake-opencode")
	testbin.Main(m)
}

// recorder collects a session's events and lets a test wait for one.
type recorder struct {
	mu     sync.Mutex
	events []provider.Event
	signal chan struct{}
}

func newRecorder() *recorder { return &recorder{signal: make(chan struct{}, 1)} }

func (r *recorder) emit(ev provider.Event) {
	if ev.Body != nil {
		ev.Payload = bodyMap(ev.Body)
	}
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

func (r *recorder) of(typ string) []provider.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []provider.Event
	for _, e := range r.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// await waits until an event of typ matching ok has been emitted.
func (r *recorder) await(t *testing.T, typ string, ok func(provider.Event) bool) provider.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		for _, e := range r.of(typ) {
			if ok == nil || ok(e) {
				return e
			}
		}
		select {
		case <-r.signal:
		case <-deadline:
			t.Fatalf("no %s event", typ)
		}
	}
}

type bundle struct {
	stateDir, workspace, callLog, envLog string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	base := t.TempDir()
	b := &bundle{stateDir: filepath.Join(base, "state"), workspace: filepath.Join(base, "ws"),
		callLog: filepath.Join(base, "calls.log"), envLog: filepath.Join(base, "env.log")}
	require.NoError(t, os.MkdirAll(b.stateDir, 0o700))
	require.NoError(t, os.MkdirAll(b.workspace, 0o700))
	return b
}

func (b *bundle) config(mode string) provider.Config {
	return provider.Config{
		Kind: "opencode", Command: fakeBin, Args: []string{"--call-log", b.callLog, "--env-log", b.envLog},
		Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.stateDir, "TETHER_WORKSPACE_CWD=" + b.workspace,
			"OPENAI_API_KEY=sk-run", "OPENCODE_CONFIG_CONTENT={\"permission\":\"allow\"}"},
		Dir: b.workspace, StateDir: b.stateDir, Model: "mock/mock-model", PermissionMode: mode,
		StartupTimeout: 30 * time.Second, RequestTimeout: 30 * time.Second,
	}
}

func start(t *testing.T, cfg provider.Config) (*Session, *recorder) {
	t.Helper()
	rec := newRecorder()
	p, err := Start(context.Background(), cfg, rec.emit)
	require.NoError(t, err)
	s := p.(*Session)
	t.Cleanup(func() { _ = s.Close(context.Background(), 5*time.Second) })
	return s, rec
}

func turnResult(t *testing.T, s *Session) provider.TurnResult {
	t.Helper()
	select {
	case r := <-s.TurnDone():
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no turn result")
	}
	return provider.TurnResult{}
}

func (b *bundle) processStarts(t *testing.T) int {
	data, err := os.ReadFile(b.callLog)
	require.NoError(t, err)
	return strings.Count(string(data), "process-start")
}

func TestR10_WarmTurnsOnOneServerAndSessionReuseHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, rec := start(t, b.config("ask"))
	sid, resumed, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	require.False(t, resumed)
	ctx := context.Background()
	var prev int64
	for i, prompt := range []string{"remember alpha", "remember beta", "[history] what did I say?"} {
		id, err := s.StartTurn(ctx, prompt)
		require.NoError(t, err)
		res := turnResult(t, s)
		require.Equal(t, id, res.TurnID)
		require.Equal(t, "completed", res.Status, res.ErrorMessage)
		if i < 2 {
			assert.Equal(t, "ECHO: "+prompt, res.FinalMessage)
		} else {
			assert.Equal(t, "HISTORY: remember alpha | remember beta", res.FinalMessage)
		}
		assert.Positive(t, res.Usage.OutputTokens)
		require.NotNil(t, res.Total)
		assert.Greater(t, res.Total.InputTokens, prev, "the session total grows")
		prev = res.Total.InputTokens
	}
	assert.Equal(t, 1, b.processStarts(t), "one server for the three turns")
	assert.Len(t, rec.of("turn.started"), 3)
	assert.Len(t, rec.of("turn.completed"), 3)
	assert.NotEmpty(t, rec.of("item.delta"), "deltas are streamed")
	u := rec.await(t, "usage.reported", nil)
	assert.Positive(t, u.Payload["costUsd"])
	started := rec.await(t, "session.started", nil)
	assert.Equal(t, sid, started.Payload["threadId"])
	// The history is OpenCode's: one session.
	data, err := os.ReadFile(b.callLog)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(data), "session.create"))
}

func TestR10_InterruptAbortsTheTurnAndTheSessionGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, rec := start(t, b.config("ask"))
	_, _, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()
	id, err := s.StartTurn(ctx, "[hold] wait for me")
	require.NoError(t, err)
	rec.await(t, "item.delta", func(e provider.Event) bool { return e.TurnID == id })
	require.NoError(t, s.Interrupt(ctx, id))
	res := turnResult(t, s)
	assert.Equal(t, "interrupted", res.Status)
	assert.Len(t, rec.of("turn.interrupted"), 1)
	_, err = s.StartTurn(ctx, "after")
	require.NoError(t, err)
	res = turnResult(t, s)
	assert.Equal(t, "completed", res.Status)
	assert.Equal(t, "ECHO: after", res.FinalMessage)
	// Steering is not offered.
	require.EqualValues(t, failure.SteeringUnsupported, provider.ErrorCode(s.Steer(ctx, id, "x")))
}

func TestR10_PermissionAskedIsARuntimeRequestAcceptedOrDeclined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, rec := start(t, b.config("ask"))
	_, _, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()

	id, err := s.StartTurn(ctx, "[shell] write the file")
	require.NoError(t, err)
	created := rec.await(t, "runtime_request.created", func(e provider.Event) bool { return e.TurnID == id })
	assert.Equal(t, "command_approval", created.Payload["kind"])
	assert.Equal(t, "approval", created.Payload["requestType"])
	assert.Contains(t, created.Payload["command"], "echo permitted > perm.txt")
	reqID := created.Payload["requestId"].(string)
	_, err = s.ResolveRequest(ctx, reqID, resolution(map[string]any{"decision": "bogus"}))
	require.EqualValues(t, failure.RuntimeRequestResolutionInvalid, provider.ErrorCode(err))
	out, err := s.ResolveRequest(ctx, reqID, resolution(map[string]any{"decision": "accept"}))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"decision": "accept"}, bodyMap(out)["resolution"])
	res := turnResult(t, s)
	assert.Equal(t, "completed", res.Status)
	assert.Equal(t, "TOOL RESULT: done-bash", res.FinalMessage)
	got, err := os.ReadFile(filepath.Join(b.workspace, "perm.txt"))
	require.NoError(t, err)
	assert.Equal(t, "permitted\n", string(got))
	_, err = s.ResolveRequest(ctx, reqID, resolution(map[string]any{"decision": "accept"}))
	require.EqualValues(t, failure.RuntimeRequestNotPending, provider.ErrorCode(err))
	done := rec.await(t, "item.completed", func(e provider.Event) bool {
		return e.TurnID == id && e.Payload["kind"] == "commandExecution"
	})
	assert.Equal(t, "completed", done.Payload["status"])
	assert.EqualValues(t, 0, done.Payload["exitCode"])

	// Declined: the tool call fails, the model is told and the turn goes on.
	id, err = s.StartTurn(ctx, "[bash] echo declined > no.txt")
	require.NoError(t, err)
	created = rec.await(t, "runtime_request.created", func(e provider.Event) bool { return e.TurnID == id })
	_, err = s.ResolveRequest(ctx, created.Payload["requestId"].(string), resolution(map[string]any{"decision": "decline"}))
	require.NoError(t, err)
	res = turnResult(t, s)
	assert.Equal(t, "completed", res.Status)
	assert.Contains(t, res.FinalMessage, DeclineMessage)
	assert.NoFileExists(t, filepath.Join(b.workspace, "no.txt"))
	assert.Len(t, rec.of("runtime_request.resolved"), 2)
}

func TestR10_ResumeTheSameSessionAfterTheServerWasKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, rec := start(t, b.config("allow"))
	sid, _, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.StartTurn(ctx, "first words")
	require.NoError(t, err)
	require.Equal(t, "completed", turnResult(t, s).Status)

	// Killed mid-turn: the session ends with the server's own cause and
	// leaves the turn to runnerd's reconciliation (SPEC R7): no
	// turn.failed, no result.
	id, err := s.StartTurn(ctx, "[hold] cut me off")
	require.NoError(t, err)
	rec.await(t, "item.delta", func(e provider.Event) bool { return e.TurnID == id })
	require.NoError(t, syscall.Kill(-s.Process().PGID, syscall.SIGKILL))
	<-s.Exited()
	assert.Contains(t, s.ExitErr().Error(), "killed by signal SIGKILL")
	assert.EqualValues(t, failure.ProviderProcessExited, provider.ErrorCode(s.ExitErr()))
	assert.Empty(t, rec.of("turn.failed"))
	select {
	case r := <-s.TurnDone():
		t.Fatalf("a lost server's turn got a result: %+v", r)
	default:
	}

	// A new server resumes the session: the killed turn reads back cut off,
	// an unknown turn is missing, and the history goes on.
	s2, rec2 := start(t, b.config("allow"))
	got, resumed, err := s2.OpenThread(ctx, sid)
	require.NoError(t, err)
	require.True(t, resumed)
	require.Equal(t, sid, got)
	outcome, status, err := s2.ReconcileTurn(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, provider.ReconcileTerminalized, outcome)
	assert.Equal(t, "interrupted", status)
	res := turnResult(t, s2)
	assert.Equal(t, "interrupted", res.Status)
	assert.Equal(t, true, rec2.await(t, "turn.interrupted", nil).Payload["reconciled"])
	outcome, _, err = s2.ReconcileTurn(ctx, "msg_unknown")
	assert.Equal(t, provider.ReconcileMissing, outcome)
	assert.EqualValues(t, failure.ProviderTurnMissing, provider.ErrorCode(err))
	last, err := s2.LastTurn(ctx)
	require.NoError(t, err)
	assert.Equal(t, id, last)
	_, err = s2.StartTurn(ctx, "[history] again")
	require.NoError(t, err)
	res = turnResult(t, s2)
	assert.Equal(t, "HISTORY: first words | [hold] cut me off", res.FinalMessage)
	assert.Equal(t, 2, b.processStarts(t))

	// A session the server does not know cannot be resumed.
	_, _, err = s2.OpenThread(ctx, "ses_gone")
	assert.EqualValues(t, failure.ProviderThreadResumeFailed, provider.ErrorCode(err))
}

// A runnerd that dies leaves the server running; the next runnerd
// re-attaches to it (no new process), reconciles the turn it was driving
// (still running: retained) and gets its end.
func TestR10_ARestartedRunnerdReattachesToTheServerAndKeepsTheTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("ask")
	old, rec := start(t, cfg)
	sid, _, err := old.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()
	id, err := old.StartTurn(ctx, "[shell] during the restart")
	require.NoError(t, err)
	rec.await(t, "runtime_request.created", nil)
	old.evCancel() // the old runnerd is gone: its event stream with it

	cfg.Reattach = true
	s, rec2 := start(t, cfg)
	assert.Equal(t, old.Process().PID, s.Process().PID, "the same server")
	_, resumed, err := s.OpenThread(ctx, sid)
	require.NoError(t, err)
	require.True(t, resumed)
	outcome, _, err := s.ReconcileTurn(ctx, id)
	require.NoError(t, err)
	require.Equal(t, provider.ReconcileRetained, outcome)
	// The open permission (expired by the new runnerd) is announced afresh
	// under a new request id.
	first := rec.await(t, "runtime_request.created", nil)
	created := rec2.await(t, "runtime_request.created", nil)
	require.True(t, strings.HasPrefix(created.Payload["requestId"].(string), first.Payload["requestId"].(string)+"@"), "%v", created.Payload["requestId"])
	_, err = s.ResolveRequest(ctx, created.Payload["requestId"].(string), resolution(map[string]any{"decision": "accept"}))
	require.NoError(t, err)
	res := turnResult(t, s)
	assert.Equal(t, id, res.TurnID)
	assert.Equal(t, "completed", res.Status)
	assert.Equal(t, "TOOL RESULT: done-bash", res.FinalMessage)
	assert.Equal(t, 1, b.processStarts(t))
}

// The server gets the run's allow-listed environment with the driver's
// home, offline switches and credentials: the configured
// OPENCODE_CONFIG_CONTENT cannot override tether's permission mode; the
// config directory is seeded so no registry install runs; basic auth is
// required.
func TestR10_ServerHomeEnvironmentAndAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, _ := start(t, b.config("deny"))
	env, err := os.ReadFile(b.envLog)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(env)), "\n")
	vars := map[string]string{}
	for _, l := range lines {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	home := filepath.Join(b.stateDir, HomeDir)
	assert.Equal(t, home, vars["HOME"])
	assert.Equal(t, filepath.Join(home, "data"), vars["XDG_DATA_HOME"])
	assert.Equal(t, filepath.Join(home, "config"), vars["XDG_CONFIG_HOME"])
	assert.Equal(t, filepath.Join(home, "tether.json"), vars["OPENCODE_CONFIG"])
	assert.Equal(t, "1", vars["OPENCODE_DISABLE_AUTOUPDATE"])
	assert.Equal(t, "sk-run", vars["OPENAI_API_KEY"])
	assert.Equal(t, b.workspace, vars["TETHER_WORKSPACE_CWD"])
	assert.NotContains(t, vars, "OPENCODE_CONFIG_CONTENT")
	assert.Len(t, vars["OPENCODE_SERVER_PASSWORD"], 48)
	assert.FileExists(t, filepath.Join(home, "config/opencode/package.json"))
	assert.FileExists(t, filepath.Join(home, "config/opencode/package-lock.json"))
	assert.DirExists(t, filepath.Join(home, "config/opencode/node_modules"))
	tcfg, err := os.ReadFile(filepath.Join(home, "tether.json"))
	require.NoError(t, err)
	assert.Contains(t, string(tcfg), `"bash": "deny"`)
	assert.Contains(t, string(tcfg), `"model": "mock/mock-model"`)

	resp, err := http.Get(s.base + "/session/status")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// deny: the tool call fails without a request.
	_, _, err = s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	_, err = s.StartTurn(context.Background(), "[shell] not allowed")
	require.NoError(t, err)
	res := turnResult(t, s)
	assert.Equal(t, "completed", res.Status)
	assert.Contains(t, res.FinalMessage, "prevents you from using this specific tool call")
	assert.NoFileExists(t, filepath.Join(b.workspace, "perm.txt"))
}

// TestR10_ALateIdleOfAnAbortedTurnDoesNotEndTheNextTurn: OpenCode reports
// an aborted session idle twice, the second time after the aborted message
// was written, and that second idle may follow the next prompt (the fake
// holds it until then). The interrupted turn ends with its own message and
// the next turn is not ended by the stale idle (the make test-providers
// flake: "expected ECHO: after the interrupt, actual ”").
func TestR10_ALateIdleOfAnAbortedTurnDoesNotEndTheNextTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, rec := start(t, b.config("ask"))
	_, _, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 2 {
		id, err := s.StartTurn(ctx, "[hold] wait for me")
		require.NoError(t, err)
		rec.await(t, "item.delta", func(e provider.Event) bool { return e.TurnID == id })
		require.NoError(t, s.Interrupt(ctx, id))
		res := turnResult(t, s)
		require.Equal(t, "interrupted", res.Status, "round %d", i)
		require.Equal(t, id, res.TurnID)
		next, err := s.StartTurn(ctx, "after the interrupt")
		require.NoError(t, err)
		res = turnResult(t, s)
		require.Equal(t, next, res.TurnID)
		require.Equal(t, "completed", res.Status, "round %d", i)
		require.Equal(t, "ECHO: after the interrupt", res.FinalMessage, "round %d", i)
	}
}

// TestR12_OpenCodeSessionUsageSurvivesServerRestartsAndARestoredHome: the
// session total a turn reports is the sum of every turn's usage of the
// session, across a server killed and restarted and a home restored into a
// new scope root (suspension): the driver reads it back from the session's
// history instead of counting from zero in memory.
func TestR12_OpenCodeSessionUsageSurvivesServerRestartsAndARestoredHome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("allow")
	s, _ := start(t, cfg)
	ctx := context.Background()
	sid, _, err := s.OpenThread(ctx, "")
	require.NoError(t, err)
	var sum provider.Usage
	turn := func(s *Session, text string) {
		t.Helper()
		_, err := s.StartTurn(ctx, text)
		require.NoError(t, err)
		res := turnResult(t, s)
		require.Equal(t, "completed", res.Status, res.ErrorMessage)
		require.Positive(t, res.Usage.OutputTokens)
		sum.InputTokens += res.Usage.InputTokens
		sum.CachedInputTokens += res.Usage.CachedInputTokens
		sum.OutputTokens += res.Usage.OutputTokens
		require.NotNil(t, res.Total)
		require.Equal(t, sum, *res.Total, "%q: the session total is the sum of the session's turns", text)
	}
	turn(s, "first words")
	turn(s, "second words")

	require.NoError(t, syscall.Kill(-s.Process().PGID, syscall.SIGKILL))
	<-s.Exited()
	s2, _ := start(t, cfg)
	_, _, err = s2.OpenThread(ctx, sid)
	require.NoError(t, err)
	turn(s2, "after the kill")

	require.NoError(t, s2.Close(ctx, 5*time.Second))
	restored := filepath.Join(t.TempDir(), "restored")
	copyTree(t, filepath.Join(b.stateDir, HomeDir), filepath.Join(restored, HomeDir))
	cfg.StateDir = restored
	s3, _ := start(t, cfg)
	_, _, err = s3.OpenThread(ctx, sid)
	require.NoError(t, err)
	turn(s3, "after the restore")
}

// TestR7_APromptCallCutWhileTheServerLivesIsSettledByTheMessageID: a
// prompt_async whose connection is cut while the server stays up
// (fake-opencode "[drop:prompt]": before the server took the prompt;
// "[drop:prompt-taken]": after) is settled by the message id tether chose:
// the driver finds the server alive, looks the id up in the session's
// history and sends the prompt once more only when it is not there. Each
// turn starts and completes once and the history holds each prompt once.
func TestR7_APromptCallCutWhileTheServerLivesIsSettledByTheMessageID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("ask")
	cfg.Args = append(cfg.Args, "--die-once-dir", t.TempDir())
	s, rec := start(t, cfg)
	_, _, err := s.OpenThread(context.Background(), "")
	require.NoError(t, err)
	ctx := context.Background()
	prompts := []string{"[drop:prompt] first", "[drop:prompt-taken] second"}
	for _, prompt := range prompts {
		id, err := s.StartTurn(ctx, prompt)
		require.NoError(t, err, prompt)
		res := turnResult(t, s)
		require.Equal(t, id, res.TurnID)
		require.Equal(t, "completed", res.Status, res.ErrorMessage)
		require.Equal(t, "ECHO: "+prompt, res.FinalMessage)
	}
	select {
	case <-s.Exited():
		t.Fatal("the server is not lost")
	default:
	}
	_, err = s.StartTurn(ctx, "[history] what was said?")
	require.NoError(t, err)
	res := turnResult(t, s)
	require.Equal(t, "HISTORY: "+strings.Join(prompts, " | "), res.FinalMessage, "each prompt once")
	assert.Len(t, rec.of("turn.started"), 3)
	calls, err := os.ReadFile(b.callLog)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(calls), "drop:prompt\n"), "the first call was cut")
	assert.Equal(t, 1, strings.Count(string(calls), "drop:prompt-taken\n"), "the second call's answer was cut")
	assert.Equal(t, 3, strings.Count(string(calls), "prompt ses_"), "the first prompt sent again, the second not")
	assert.Equal(t, 1, b.processStarts(t))
}

// bodyMap is a typed payload as the JSON object its event carries.
func bodyMap(b proto.Message) map[string]any {
	s, err := prp.Payload(b)
	if err != nil {
		panic(err)
	}
	return s.AsMap()
}

// resolution is a request.resolve resolution object as the drivers take it.
func resolution(m map[string]any) provider.Resolution {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return provider.ParseResolution(s)
}
