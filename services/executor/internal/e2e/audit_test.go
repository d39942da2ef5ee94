package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/audit"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// auditStack runs the tetherctl binary's audit against the stack's
// database (only its URL) and returns the JSON report and the exit status.
func auditStack(t *testing.T, dsn string, args ...string) (audit.Report, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "tetherctl"), append([]string{"audit", "-json", "-database-url", dsn}, args...)...)
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	var rep audit.Report
	require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
	return rep, code
}

type eventRow struct {
	Type   string
	Writer int64
}

func (h *harness) eventRows(ctx context.Context, runID string) []eventRow {
	h.t.Helper()
	rows, err := h.store().Pool().Query(ctx, `SELECT event_type, writer_attempt FROM executor.events WHERE run_id = $1 ORDER BY seq`, runID)
	require.NoError(h.t, err)
	defer rows.Close()
	var out []eventRow
	for rows.Next() {
		var r eventRow
		require.NoError(h.t, rows.Scan(&r.Type, &r.Writer))
		out = append(out, r)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// The defect through real processes: the provider of a warm
// session dies after its run ended; runnerd's harness.exited reaches the
// executor only with the session's next run, and is filed under that run,
// written by its attempt — never after the ended run's run.terminal.
func TestR9_AHarnessExitAfterARunEndedIsFiledUnderTheNextRunOfTheScope(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("exit-1", "exit", "first")
	first := h.waitState(ctx, h.client, "exit-1", executorv1.RunState_RUN_STATE_SUCCEEDED)
	pid := int(first.GetProviderProcess().GetPid())
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	for syscall.Kill(pid, 0) == nil {
		select {
		case <-ctx.Done():
			t.Fatal("the provider did not die")
		case <-time.After(10 * time.Millisecond):
		}
	}

	h.submit("exit-2", "exit", "second")
	second := h.waitTerminal(ctx, "exit-2")
	rows := h.eventRows(ctx, "exit-1")
	require.Equal(t, "run.terminal", rows[len(rows)-1].Type, "nothing after exit-1's run.terminal")
	next := h.eventRows(ctx, "exit-2")
	exited := 0
	for _, r := range next {
		// Under one of exit-2's attempts (the audit below checks that
		// they never decrease and that the terminal is the final one's).
		require.True(t, r.Writer >= 1 && r.Writer <= int64(second.GetAttempt()), "%s written under an exit-2 fence: %+v", r.Type, r)
		if r.Type == "harness.exited" {
			exited++
		}
	}
	require.Equal(t, 1, exited, "the provider's exit is filed under the session's next run: %v", next)
	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
}

// waitTerminal waits until the run has its outcome, whatever it is.
func (h *harness) waitTerminal(ctx context.Context, runID string) *executorv1.Run {
	h.t.Helper()
	for {
		run := h.get(runID)
		switch run.GetState() {
		case executorv1.RunState_RUN_STATE_SUCCEEDED, executorv1.RunState_RUN_STATE_FAILED, executorv1.RunState_RUN_STATE_CANCELLED:
			return run
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s did not end: %s", runID, run.GetState())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tetherctl audit over a history a real stack wrote is clean; the same
// history corrupted around the database's own fence (its trigger and
// terminal index dropped for the corruption) shows each violation class.
func TestX1_TetherctlAuditIsCleanOnAStackHistoryAndFindsEachCorruption(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{FakeArgs: []string{"--delta-delay-ms", "40"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range []string{"a-1", "a-2", "a-3"} {
		h.submit(id, "audited", "turn "+id)
		h.waitState(ctx, h.client, id, executorv1.RunState_RUN_STATE_SUCCEEDED)
	}
	h.submit("a-4", "audited", slowTurn)
	h.waitForDelta(ctx, h.client, "a-4")
	_, err := h.client.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "a-4", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "audit"})
	require.NoError(t, err)
	h.waitTerminal(ctx, "a-4")

	rep, code := auditStack(t, h.dsn)
	require.Zero(t, code, "%+v", rep.Violations)
	require.True(t, rep.Clean())
	require.Equal(t, 4, rep.Runs)
	require.Greater(t, rep.Events, 20)
	one, code := auditStack(t, h.dsn, "-run", "a-2")
	require.Zero(t, code)
	require.Equal(t, 1, one.Runs)
	recent, code := auditStack(t, h.dsn, "-since", "1h")
	require.Zero(t, code)
	require.Equal(t, 4, recent.Runs)

	db := h.store().Pool()
	for _, q := range []string{
		`ALTER TABLE executor.events DISABLE TRIGGER events_within_fence`,
		`DROP INDEX executor.events_one_terminal_idx`,
		// a-1: a late harness.exited after run.terminal, by no lease.
		`INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
		 SELECT 'a-1', 0, event_count + 1, 'forged', 1, 'forged-1', 'harness.exited', '\x00', '\x00' FROM executor.runs WHERE run_id = 'a-1'`,
		`UPDATE executor.runs SET event_count = event_count + 1 WHERE run_id = 'a-1'`,
		// a-2: a second run.terminal, and a gap in its seqs.
		`INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
		 SELECT 'a-2', 1, event_count + 2, 'forged', 2, 'forged-2', 'run.terminal', '\x00', '\x00' FROM executor.runs WHERE run_id = 'a-2'`,
		// a-3: its run.terminal written by no lease after attempt 1's rows;
		// its turn command executed a second time (filed under a-2).
		`UPDATE executor.events SET writer_attempt = 0 WHERE run_id = 'a-3' AND event_type = 'run.terminal'`,
		`INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
		 SELECT 'a-2', 1, 0, 'forged', 3, 'forged-3', event_type, payload_sha256, event FROM executor.events
		  WHERE run_id = 'a-3' AND event_type = 'command.executed'`,
		// a-1: its turn's end reported a second time (a copy of its
		// turn.completed, after it: the same provider turn, no turn.started
		// between).
		`INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
		 SELECT 'a-1', 1, (SELECT event_count + 1 FROM executor.runs WHERE run_id = 'a-1'), 'forged', 4, 'forged-4', event_type, payload_sha256, event
		  FROM executor.events WHERE run_id = 'a-1' AND event_type = 'turn.completed'`,
		// a-2: a turn of a-1 that a-1's runner began after a-1's
		// run.terminal (an injected turn, SPEC T4).
		`INSERT INTO executor.events (run_id, writer_attempt, seq, source_instance_id, source_seq, source_event_id, event_type, payload_sha256, event)
		 SELECT 'a-2', 1, (SELECT event_count + 3 FROM executor.runs WHERE run_id = 'a-2'), t.source_instance_id, t.source_seq + 1000, 'forged-5',
		        s.event_type, s.payload_sha256, s.event
		   FROM executor.events t, executor.events s
		  WHERE t.run_id = 'a-1' AND t.event_type = 'run.terminal' AND s.run_id = 'a-1' AND s.event_type = 'turn.started'`,
		// a-4: its cancellation audited twice.
		`INSERT INTO executor.activities (activity_id, actor, action, company_id, issue_id, run_id, details, created_at)
		 SELECT activity_id || '-again', actor, action, company_id, issue_id, run_id, details, created_at FROM executor.activities
		  WHERE run_id = 'a-4' AND action = 'native.cancellation_intent_recorded'`,
		// The session: a-2's idle period checkpointed, a-3 and a-4 failed
		// after it — wedged (filed under a-4).
		`INSERT INTO executor.session_checkpoints (checkpoint_id, session_scope, company_id, normalized_session_id, last_run_id,
		        gateway_scope, manifest_digest, stamp, lease_id, runner_instance_id, reason)
		 SELECT 'forged-cp', session_scope, company_id, normalized_session_id, run_id, session_scope, 'sha256:00', '\x00', 'local-x', 'forged', 'idle'
		   FROM executor.runs WHERE run_id = 'a-2'`,
		`UPDATE executor.runs SET state = 'failed', failure_code = 'runner_harness_state_mismatch', failure_message = 'forged'
		  WHERE run_id IN ('a-3', 'a-4')`,
	} {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	rep, code = auditStack(t, h.dsn)
	require.Equal(t, 1, code, "exit status 1 on any violation")
	found := map[string]map[string]bool{}
	for _, v := range rep.Violations {
		if found[v.Class] == nil {
			found[v.Class] = map[string]bool{}
		}
		found[v.Class][v.RunID] = true
	}
	require.True(t, found[audit.ClassAfterTerminal]["a-1"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassWriterAttempt]["a-1"], "written by no lease after attempt 1: %+v", rep.Violations)
	require.True(t, found[audit.ClassTerminal]["a-2"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassSeqGap]["a-2"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassWriterAttempt]["a-3"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassTerminalAttempt]["a-3"], "%+v", rep.Violations)
	require.Len(t, found[audit.ClassTurnTwice], 1, "%+v", rep.Violations)
	require.True(t, found[audit.ClassTurnEventTwice]["a-1"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassCancellationTwice]["a-4"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassForeignRunEvent]["a-2"], "%+v", rep.Violations)
	require.True(t, found[audit.ClassSessionWedged]["a-4"], "%+v", rep.Violations)
	for _, c := range audit.Classes {
		require.NotZero(t, rep.ByClass[c], "class %s found", c)
	}
}
