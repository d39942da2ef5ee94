package opencode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/services/runnerd/internal/provider"
	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

// Environment of the opt-in suite (make test-providers).
const (
	// envOpenCodeBin is the real opencode binary
	// (node_modules/opencode-linux-x64/bin/opencode).
	envOpenCodeBin = "TETHER_OPENCODE_BIN"
	// envStrace: "0" disables the connect() audit under strace; otherwise
	// it runs when strace is installed.
	envStrace = "TETHER_OPENCODE_STRACE"
)

// TestR10_ScenarioSuiteAgainstRealOpenCode drives the real OpenCode
// 1.18.17 offline against the loopback mock model (Chat Completions):
// three warm turns with history, an interrupt, a permission accepted and
// one declined, a SIGKILL of the server with resume and one more turn, and
// a suspension (the home without its launch-only entries copied to a new
// scope root) restored and continued. Every model request must reach the
// mock as POST /v1/chat/completions.
func TestR10_ScenarioSuiteAgainstRealOpenCode(t *testing.T) {
	bin := os.Getenv(envOpenCodeBin)
	if bin == "" {
		t.Skip(envOpenCodeBin + " is not set (make test-providers sets it)")
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("test-providers: opencode %s (%s)", strings.TrimSpace(string(out)), bin)
	mock, err := mockmodel.Start("")
	require.NoError(t, err)
	defer mock.Close()
	mock.SlowChunkDelay = 400 * time.Millisecond

	b := setup(t)
	tmpl := filepath.Join(t.TempDir(), "template")
	require.NoError(t, os.MkdirAll(tmpl, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(tmpl, "opencode.json"), []byte(`{
  "$schema": "https://opencode.ai/config.json",
  "provider": { "mock": {
    "npm": "@ai-sdk/openai-compatible",
    "name": "Mock (loopback)",
    "options": { "baseURL": "`+mock.BaseURL()+`", "apiKey": "{env:MOCK_API_KEY}" },
    "models": { "mock-model": { "name": "Mock Model", "tool_call": true, "limit": { "context": 100000, "output": 4096 } } } } }
}`), 0o600))
	// Under strace every server start writes its connect() calls to a
	// trace (the driver's process group holds strace and the server).
	var traces []string
	command, args := bin, []string(nil)
	if p, err := exec.LookPath("strace"); err == nil && os.Getenv(envStrace) != "0" {
		trace := filepath.Join(t.TempDir(), "connect.strace")
		traces = append(traces, trace)
		command, args = p, []string{"-f", "-qq", "-ff", "-e", "trace=connect", "-o", trace, "--", bin}
	}
	cfg := provider.Config{
		Kind: "opencode", Command: command, Args: args,
		Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.stateDir, "MOCK_API_KEY=mock-key", "TETHER_WORKSPACE_CWD=" + b.workspace},
		Dir: b.workspace, StateDir: b.stateDir, HomeTemplate: tmpl, Model: "mock/mock-model", PermissionMode: "ask",
		StartupTimeout: 5 * time.Minute, RequestTimeout: 2 * time.Minute,
	}
	ctx := context.Background()
	step := func(name string) { t.Logf("test-providers: opencode: %s", name) }
	turn := func(s *Session, text string) provider.TurnResult {
		t.Helper()
		_, err := s.StartTurn(ctx, text)
		require.NoError(t, err)
		select {
		case r := <-s.TurnDone():
			return r
		case <-time.After(3 * time.Minute):
			t.Fatalf("no result for %q", text)
		}
		return provider.TurnResult{}
	}
	dumpLog := func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(b.stateDir, HomeDir, "serve.log"))
			t.Logf("serve.log:\n%s", b)
		}
	}
	defer dumpLog()

	s, rec := start(t, cfg)
	sid, _, err := s.OpenThread(ctx, "")
	require.NoError(t, err)

	step("three warm turns with history")
	for _, p := range []string{"remember alpha", "remember beta", "what did I say?"} {
		res := turn(s, p)
		require.Equal(t, "completed", res.Status, "%s: %s", p, res.ErrorMessage)
		require.Equal(t, "ECHO: "+p, res.FinalMessage)
		assert.Positive(t, res.Usage.OutputTokens)
	}
	reqs := mock.Requests()
	last := reqs[len(reqs)-1]
	require.Equal(t, "what did I say?", last.LastUserText)
	assert.Contains(t, strings.Join(last.InputTexts, "\n"), "user: remember alpha", "history is resent")
	assert.Contains(t, strings.Join(last.InputTexts, "\n"), "assistant: ECHO: remember beta")

	step("interrupt")
	id, err := s.StartTurn(ctx, "[slow] a long answer")
	require.NoError(t, err)
	rec.await(t, "item.delta", func(e provider.Event) bool { return e.TurnID == id })
	require.NoError(t, s.Interrupt(ctx, id))
	res := <-s.TurnDone()
	require.Equal(t, "interrupted", res.Status, res.ErrorMessage)
	res = turn(s, "after the interrupt")
	require.Equal(t, "ECHO: after the interrupt", res.FinalMessage)

	step("permission accepted")
	id, err = s.StartTurn(ctx, "[bash] echo permitted > perm.txt && echo done-bash")
	require.NoError(t, err)
	created := rec.await(t, "runtime_request.created", func(e provider.Event) bool { return e.TurnID == id })
	require.Equal(t, "command_approval", created.Payload["kind"])
	_, err = s.ResolveRequest(ctx, created.Payload["requestId"].(string), resolution(map[string]any{"decision": "accept"}))
	require.NoError(t, err)
	res = <-s.TurnDone()
	require.Equal(t, "completed", res.Status, res.ErrorMessage)
	assert.Contains(t, res.FinalMessage, "TOOL RESULT: done-bash")
	got, err := os.ReadFile(filepath.Join(b.workspace, "perm.txt"))
	require.NoError(t, err)
	assert.Equal(t, "permitted\n", string(got))

	step("permission declined")
	id, err = s.StartTurn(ctx, "[bash] echo declined > no.txt")
	require.NoError(t, err)
	created = rec.await(t, "runtime_request.created", func(e provider.Event) bool { return e.TurnID == id })
	_, err = s.ResolveRequest(ctx, created.Payload["requestId"].(string), resolution(map[string]any{"decision": "decline"}))
	require.NoError(t, err)
	res = <-s.TurnDone()
	require.Equal(t, "completed", res.Status, res.ErrorMessage)
	assert.Contains(t, res.FinalMessage, "TOOL RESULT:")
	assert.NoFileExists(t, filepath.Join(b.workspace, "no.txt"))

	step("SIGKILL of the server, resume, one more turn")
	require.NoError(t, syscall.Kill(-s.Process().PGID, syscall.SIGKILL))
	<-s.Exited()
	t.Logf("test-providers: opencode: exit: %v", s.ExitErr())
	s2, _ := start(t, cfg)
	_, resumed, err := s2.OpenThread(ctx, sid)
	require.NoError(t, err)
	require.True(t, resumed)
	res = turn(s2, "after the kill")
	require.Equal(t, "ECHO: after the kill", res.FinalMessage)
	reqs = mock.Requests()
	assert.Contains(t, strings.Join(reqs[len(reqs)-1].InputTexts, "\n"), "user: remember alpha", "the resumed session has its history")

	step("suspension and restore")
	require.NoError(t, s2.Close(ctx, 10*time.Second))
	restored := filepath.Join(t.TempDir(), "restored")
	copyTree(t, filepath.Join(b.stateDir, HomeDir), filepath.Join(restored, HomeDir))
	cfg.StateDir = restored
	s3, _ := start(t, cfg)
	_, resumed, err = s3.OpenThread(ctx, sid)
	require.NoError(t, err)
	require.True(t, resumed)
	res = turn(s3, "after the restore")
	require.Equal(t, "ECHO: after the restore", res.FinalMessage)
	reqs = mock.Requests()
	assert.Contains(t, strings.Join(reqs[len(reqs)-1].InputTexts, "\n"), "user: after the kill", "the restored session has its history")

	step("egress")
	for _, r := range mock.Requests() {
		require.Equal(t, "POST /v1/chat/completions", r.Method+" "+r.Path)
	}
	t.Logf("test-providers: opencode: %d model requests, unexpected: %v", len(mock.Requests()), mock.Unexpected())
	if len(traces) == 0 {
		t.Logf("test-providers: opencode: strace not used (not installed or %s=0); egress checked by the mock only", envStrace)
		return
	}
	var files []string
	for _, tr := range traces {
		m, _ := filepath.Glob(tr + "*")
		files = append(files, m...)
	}
	connects, bad, err := mockmodel.AuditConnects(files)
	require.NoError(t, err)
	assert.Empty(t, bad, "non-loopback connect() attempts")
	t.Logf("test-providers: opencode: strace: %d connect() calls in %d traced processes, %d to non-loopback addresses", connects, len(files), len(bad))
}

// copyTree copies a provider home without its launch-only entries (what a
// checkpoint holds).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	skip := map[string]bool{}
	for _, e := range BackupExclusions {
		skip[filepath.Join(src, e)] = true
	}
	require.NoError(t, filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if skip[p] || info.Name() == "auth.json" {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case info.IsDir():
			return os.MkdirAll(target, 0o700)
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o600)
		}
		return nil
	}))
}
