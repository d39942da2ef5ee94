package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/audit"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// failNext claims the next run and fails it on record.
func failNext(t *testing.T, s *store.Store, want, code, message string) {
	t.Helper()
	ctx := context.Background()
	c, err := s.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)
	require.Equal(t, want, c.RunID)
	require.NoError(t, s.FailRun(ctx, c.Fence, code, message))
}

// SPEC X1 (issue #30) over real rows: AuditRows reads each run's scope,
// submission order and failure and the scopes' checkpoints, and the audit
// finds the session whose runs all failed after its checkpointed last turn
// — not the one whose thread is lost, nor the one that recovered.
func TestX1_AuditRowsFindAWedgedSessionInPostgreSQL(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	submit := func(runID, session string) {
		_, _, err := s.SubmitRun(ctx, runID, input(session, "x"))
		require.NoError(t, err)
	}
	checkpoint := func(runID, session string) {
		in := input(session, "x")
		sc := scope.OfRun(runID, in)
		id := "cp-" + runID
		_, err := s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: session, LastRunID: runID,
			GatewayScope: scope.Of(in), Stamp: &backupv1.Stamp{CheckpointId: id}, CheckpointID: id, ManifestDigest: "sha256:00",
			LeaseID: "local-x", RunnerInstanceID: "runner-1", Reason: "idle"})
		require.NoError(t, err)
	}
	// wedged: its last turn is checkpointed, the two runs after it failed.
	// lost: the same failures but no copy of its thread is known.
	// recovered: two failures, then a success.
	for _, sess := range []string{"wedged", "lost", "recovered"} {
		submit(sess+"-1", sess)
		finish(t, s, sess+"-1")
	}
	checkpoint("wedged-1", "wedged")
	checkpoint("recovered-1", "recovered")
	for _, sess := range []string{"wedged", "lost", "recovered"} {
		for _, n := range []string{"-2", "-3"} {
			submit(sess+n, sess)
			failNext(t, s, sess+n, "runner_harness_state_mismatch", "scope has no verified checkpoint")
		}
	}
	submit("recovered-4", "recovered")
	finish(t, s, "recovered-4")

	h, err := s.AuditRows(ctx, store.AuditFilter{})
	require.NoError(t, err)
	require.Len(t, h.Checkpoints, 2)
	byID := map[string]audit.Run{}
	for _, r := range h.Runs {
		byID[r.ID] = r
	}
	require.Equal(t, "runner_harness_state_mismatch", byID["wedged-2"].FailureCode)
	require.Equal(t, "scope has no verified checkpoint", byID["wedged-2"].FailureMessage)
	require.Less(t, byID["wedged-1"].Seq, byID["wedged-2"].Seq)
	require.Equal(t, scope.OfRun("wedged-1", input("wedged", "x")), byID["wedged-1"].Scope)

	rep := audit.Check(h)
	require.Equal(t, 1, rep.ByClass[audit.ClassSessionWedged], "%+v", rep.Violations)
	require.Len(t, rep.Violations, 1, "%+v", rep.Violations)
	v := rep.Violations[0]
	require.Equal(t, audit.ClassSessionWedged, v.Class)
	require.Equal(t, "wedged-3", v.RunID)
	require.Contains(t, v.Detail, "checkpoint cp-wedged-1")
}
