package scenario

// The ACP scenario suite (SPEC R11): one sequence of provider behaviours
// driven through the ACP driver (internal/acp). `make test` runs it against
// the fake ACP agent; `make test-providers` against the real codex-acp and
// claude-agent-acp, offline, on the loopback mock model:
//
//   - three warm turns on one agent process, history reused;
//   - an interrupt (session/cancel) during a slow reply, then a turn;
//   - a permission request accepted (approve-all: the command runs) and one
//     declined (deny-all, another session: the command never runs);
//   - the agent's process group SIGKILLed mid-turn, the session loaded in a
//     new process, the lost turn reconciled (missing), one more turn;
//   - suspension (clean close) → restore (the acpx directory copied to a new
//     root) → one more turn on the loaded session.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/testing/testbin"
	"github.com/tether-run/tether/services/runnerd/internal/acp"
	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// acpTarget is one ACP agent under test.
type acpTarget struct {
	name, agent string
	// config returns the driver config of a new agent process whose acpx
	// directory (state and agent homes) is acpxDir.
	config func(t *testing.T, acpxDir, workspace, permissionMode string) acp.Config
	// shellPrompt makes the agent ask to run mockmodel.ShellCommand;
	// slowPrompt streams slowly; toolOutput is in the answer after the
	// command ran.
	shellPrompt, slowPrompt, toolOutput string
	// declineEndsTurn: a declined permission ends the turn (codex-acp).
	declineEndsTurn bool
	// historyReused checks that the agent's model saw the earlier prompts
	// when it answered final.
	historyReused func(t *testing.T, p *acpProc, final string, earlier []string)
	turnTimeout   time.Duration
	report        func(format string, args ...any)
}

type acpProc struct {
	s   *acp.Session
	rec *recorder
}

func startACP(t *testing.T, cfg acp.Config, threadID string) (*acpProc, string, bool) {
	t.Helper()
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := acp.Start(ctx, cfg, func(e acp.Event) {
		rec.emit(codex.Event{Type: e.Type, TurnID: e.TurnID, ItemID: e.ItemID, Priority: e.Priority, Payload: e.Payload})
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background(), 2*time.Second) })
	id, resumed, err := s.OpenThread(ctx, threadID)
	require.NoError(t, err, "open %q", threadID)
	return &acpProc{s: s, rec: rec}, id, resumed
}

func (p *acpProc) turn(t *testing.T, tg acpTarget, text string) (acp.TurnResult, []codex.Event) {
	t.Helper()
	mark := p.rec.len()
	id, err := p.s.StartTurn(context.Background(), text)
	require.NoError(t, err)
	return p.wait(t, tg, id), p.rec.since(mark)
}

func (p *acpProc) wait(t *testing.T, tg acpTarget, id string) acp.TurnResult {
	t.Helper()
	select {
	case r := <-p.s.TurnDone():
		require.Equal(t, id, r.TurnID)
		return r
	case <-time.After(tg.turnTimeout):
		t.Fatalf("turn %s did not end within %s; events %v", id, tg.turnTimeout, types(p.rec.since(0)))
	}
	return acp.TurnResult{}
}

func runACPSuite(t *testing.T, tg acpTarget, root string) {
	workspace := filepath.Join(root, "workspace")
	acpxDir := filepath.Join(root, "scope", "acpx")
	require.NoError(t, os.MkdirAll(workspace, 0o755))
	// 1. Three warm turns on one process.
	p, recordID, resumed := startACP(t, tg.config(t, acpxDir, workspace, acp.ApproveAll), "")
	require.False(t, resumed)
	pid := p.s.Process().PID
	prompts := []string{"alpha one", "beta two", "gamma three"}
	for i, text := range prompts {
		res, evs := p.turn(t, tg, text)
		require.Equal(t, provider.TurnCompleted, res.Status, "%+v", res)
		assert.Equal(t, "ECHO: "+text, res.FinalMessage)
		assert.NotEmpty(t, filter(evs, ofType("item.delta")))
		if i == 2 {
			tg.historyReused(t, p, res.FinalMessage, prompts[:2])
		}
	}
	assert.Equal(t, pid, p.s.Process().PID)
	tg.report("%s: three warm turns on agent process %d (session %s)", tg.name, pid, p.s.State().Identity.AgentSessionID)

	// 2. Interrupt a slow reply; the session goes on.
	mark := p.rec.len()
	slow, err := p.s.StartTurn(context.Background(), tg.slowPrompt)
	require.NoError(t, err)
	_, ok := p.rec.waitFor(mark, tg.turnTimeout, ofType("item.delta"))
	require.True(t, ok, "no delta of the slow turn")
	require.NoError(t, p.s.Interrupt(context.Background(), slow))
	assert.Equal(t, provider.TurnInterrupted, p.wait(t, tg, slow).Status)
	res, _ := p.turn(t, tg, "after the interrupt")
	assert.Equal(t, "ECHO: after the interrupt", res.FinalMessage)
	tg.report("%s: interrupt → cancelled, next turn completed", tg.name)

	// 3a. Permission accepted under approve-all: the command runs.
	res, evs := p.turn(t, tg, tg.shellPrompt)
	decided := filter(evs, ofType("permission.decided"))
	require.NotEmpty(t, decided, "no permission request; events %v", types(evs))
	assert.Equal(t, "allow", decided[0].Payload["decision"])
	assert.Equal(t, provider.TurnCompleted, res.Status)
	assert.Contains(t, res.FinalMessage, tg.toolOutput)
	receipts := filter(evs, ofType("tool.receipt"))
	require.NotEmpty(t, receipts)
	assert.Equal(t, true, receipts[len(receipts)-1].Payload["success"])
	tg.report("%s: permission accepted (option %v), command ran: %q", tg.name, decided[0].Payload["optionId"], res.FinalMessage)

	// 3b. Declined under deny-all (its own session: the permission mode
	// is part of the identity); the command never runs.
	denyWS := filepath.Join(root, "deny-workspace")
	require.NoError(t, os.MkdirAll(denyWS, 0o755))
	d, _, _ := startACP(t, tg.config(t, filepath.Join(root, "deny-scope", "acpx"), denyWS, acp.DenyAll), "")
	res, evs = d.turn(t, tg, tg.shellPrompt)
	decided = filter(evs, ofType("permission.decided"))
	require.NotEmpty(t, decided, "no permission request; events %v", types(evs))
	assert.Equal(t, "reject", decided[0].Payload["decision"])
	if tg.declineEndsTurn {
		assert.Equal(t, provider.TurnInterrupted, res.Status)
	} else {
		assert.Equal(t, provider.TurnCompleted, res.Status)
	}
	assert.NoDirExists(t, filepath.Join(denyWS, "approved-dir"), "the declined command did not run")
	tg.report("%s: permission declined (option %v), turn %s", tg.name, decided[0].Payload["optionId"], res.Status)
	require.NoError(t, d.s.Close(context.Background(), 2*time.Second))

	// 4. Kill the agent's group mid-turn; load the session in a new
	// process; the lost turn is missing; one more turn with the history.
	mark = p.rec.len()
	lost, err := p.s.StartTurn(context.Background(), tg.slowPrompt)
	require.NoError(t, err)
	_, ok = p.rec.waitFor(mark, tg.turnTimeout, ofType("item.delta"))
	require.True(t, ok)
	require.NoError(t, syscall.Kill(-p.s.Process().PGID, syscall.SIGKILL))
	select {
	case <-p.s.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the driver did not notice the kill")
	}
	exitErr := p.s.ExitErr()
	assert.Contains(t, exitErr.Error(), "SIGKILL")
	p2, id, resumed := startACP(t, tg.config(t, acpxDir, workspace, acp.ApproveAll), recordID)
	require.True(t, resumed)
	require.Equal(t, recordID, id)
	outcome, _, err := p2.s.ReconcileTurn(context.Background(), lost)
	assert.Equal(t, acp.ReconcileMissing, outcome)
	assert.ErrorContains(t, err, failure.ProviderTurnMissing)
	res, _ = p2.turn(t, tg, "after the kill")
	require.Equal(t, provider.TurnCompleted, res.Status, "%+v", res)
	assert.Equal(t, "ECHO: after the kill", res.FinalMessage)
	tg.historyReused(t, p2, res.FinalMessage, prompts)
	tg.report("%s: killed (%v), session/load in process %d, lost turn %s, next turn completed with the history", tg.name, exitErr, p2.s.Process().PID, outcome)

	// 5. Suspension → restore → continue.
	require.NoError(t, p2.s.Close(context.Background(), 5*time.Second))
	restored := filepath.Join(root, "restored", "acpx")
	require.NoError(t, os.MkdirAll(filepath.Dir(restored), 0o700))
	out, err := exec.Command("cp", "-a", acpxDir, restored).CombinedOutput()
	require.NoError(t, err, "%s", out)
	p3, id, resumed := startACP(t, tg.config(t, restored, workspace, acp.ApproveAll), recordID)
	require.True(t, resumed)
	require.Equal(t, recordID, id)
	res, _ = p3.turn(t, tg, "after the restore")
	require.Equal(t, provider.TurnCompleted, res.Status, "%+v", res)
	assert.Equal(t, "ECHO: after the restore", res.FinalMessage)
	tg.historyReused(t, p3, res.FinalMessage, prompts)
	tg.report("%s: suspended, restored into %s, session loaded, next turn completed with the history", tg.name, restored)
	require.NoError(t, p3.s.Close(context.Background(), 5*time.Second))
}

// TestR11_ScenarioSuiteAgainstFakeACP runs the ACP suite against the fake
// agent, in both flavours.
func TestR11_ScenarioSuiteAgainstFakeACP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the fake ACP agent")
	}
	bin, err := testbin.Path("github.com/tether-run/tether/services/runnerd/tools/fake-acp-agent")
	require.NoError(t, err)
	for _, agent := range []string{acp.AgentCodex, acp.AgentClaude} {
		t.Run(agent, func(t *testing.T) {
			t.Parallel()
			tg := acpTarget{
				name: "fake-" + agent, agent: agent,
				config: func(t *testing.T, acpxDir, workspace, mode string) acp.Config {
					home := filepath.Join(acpxDir, "home")
					require.NoError(t, os.MkdirAll(home, 0o700))
					return acp.Config{Command: bin, Args: []string{"-flavor", agent, "-slow-delta-delay-ms", "100"},
						Env: []string{"HOME=" + home, "PATH=/usr/bin:/bin"}, Dir: workspace, StateDir: acpxDir,
						Agent: agent, PermissionMode: mode, RequestTimeout: 30 * time.Second}
				},
				shellPrompt: "run it [shell]", slowPrompt: "take your time [slow]", toolOutput: "TOOL RESULT:",
				declineEndsTurn: agent == acp.AgentCodex,
				historyReused: func(t *testing.T, p *acpProc, _ string, earlier []string) {
					res, _ := p.turn(t, acpTarget{turnTimeout: 30 * time.Second}, "[history]")
					for _, e := range earlier {
						assert.Contains(t, res.FinalMessage, e)
					}
				},
				turnTimeout: 30 * time.Second,
				report:      func(format string, args ...any) { t.Logf(format, args...) },
			}
			runACPSuite(t, tg, t.TempDir())
		})
	}
}

// fmtReport prints a test-providers line.
func fmtReport(t *testing.T) func(string, ...any) {
	return func(format string, args ...any) {
		t.Logf(format, args...)
		fmt.Printf("test-providers: "+format+"\n", args...)
	}
}
