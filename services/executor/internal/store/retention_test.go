package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/services/executor/internal/retention"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// endRun submits run id of company in session and persists its terminal.
func endedRun(t *testing.T, s *store.Store, company, id, session string) *prpv1.ExecutionInput {
	t.Helper()
	in := input(session, "x")
	in.Binding.CompanyId = company
	_, _, err := s.SubmitRun(context.Background(), id, in)
	require.NoError(t, err)
	finish(t, s, id)
	return in
}

// age moves every ended run's end back by d.
func age(t *testing.T, s *store.Store, d time.Duration) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `UPDATE executor.runs SET ended_at = ended_at - make_interval(secs => $1) WHERE ended_at IS NOT NULL`, d.Seconds())
	require.NoError(t, err)
}

func countRows(t *testing.T, s *store.Store, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestL1_RetentionDeletesExpiredRunsButKeepsEachSessionsNewestRunAndCheckpointedRuns(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	endedRun(t, s, "acme", "a1", "sa")
	in := endedRun(t, s, "acme", "a2", "sa")
	endedRun(t, s, "acme", "a3", "sa")
	// a2's idle period was checkpointed: the run stays with its checkpoint.
	sc := scope.OfRun("a2", in)
	_, err := s.RecordCheckpoint(ctx, store.CheckpointRecord{Scope: sc, CompanyID: "acme", SessionID: "sa", LastRunID: "a2",
		GatewayScope: sc, Stamp: &backupv1.Stamp{CheckpointId: "cp-a2"}, CheckpointID: "cp-a2", ManifestDigest: "sha256:00",
		LeaseID: "l", RunnerInstanceID: "runner-1", Reason: "idle"})
	require.NoError(t, err)
	endedRun(t, s, "globex", "b1", "sb")
	endedRun(t, s, "globex", "b2", "sb")
	endedRun(t, s, "acme", "c1", "sc")
	_, _, err = s.SubmitRun(ctx, "c2", input("sc", "queued")) // not ended
	require.NoError(t, err)

	// Nothing is deleted by default (the '*' policy keeps runs for good).
	age(t, s, 48*time.Hour)
	ids, err := s.ExpiredRuns(ctx, 100, 1000)
	require.NoError(t, err)
	require.Empty(t, ids)

	require.Error(t, s.SetRetention(ctx, store.RetentionPolicy{Company: "*", RunRetention: time.Minute}, "test"), "shorter than an hour")
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: "*", RunRetention: 24 * time.Hour}, "op"))
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: "globex"}, "op")) // globex keeps its runs
	ids, err = s.ExpiredRuns(ctx, 100, 1000)
	require.NoError(t, err)
	// a2: named by a checkpoint; a3, c2: their session's newest; c2 not
	// ended; globex: kept for good.
	require.ElementsMatch(t, []string{"a1", "c1"}, ids)

	c, err := s.PurgeRuns(ctx, append(ids, "c2"))
	require.NoError(t, err)
	require.EqualValues(t, 2, c.Runs)
	require.EqualValues(t, 2, c.Events)
	require.Zero(t, countRows(t, s, `SELECT count(*) FROM executor.events WHERE run_id = ANY($1)`, ids))
	require.Zero(t, countRows(t, s, `SELECT count(*) FROM executor.coordinators WHERE run_id = ANY($1)`, ids))
	require.Equal(t, 1, countRows(t, s, `SELECT count(*) FROM executor.runs WHERE run_id = 'c2'`), "a queued run is never purged")
	_, err = s.GetRun(ctx, "a1")
	require.Equal(t, failure.RunNotFound, string(failure.CodeOf(err)))

	// Younger than its company's retention: kept.
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: "globex", RunRetention: 72 * time.Hour}, "op"))
	ids, err = s.ExpiredRuns(ctx, 100, 1000)
	require.NoError(t, err)
	require.Empty(t, ids)
	require.NoError(t, s.ResetRetention(ctx, "globex", "op"))
	ids, err = s.ExpiredRuns(ctx, 100, 1000)
	require.NoError(t, err)
	require.Equal(t, []string{"b1"}, ids)

	actions, err := s.OperatorActions(ctx, "")
	require.NoError(t, err)
	require.Len(t, actions, 4, "every policy change is audited")
	require.Equal(t, "retention.reset", actions[3].Action)
}

func TestL1_ThePurgeRunsOnOneReplicaAtATimeInBoundedBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i := 1; i <= 6; i++ {
		endedRun(t, s, "acme", fmt.Sprintf("r%d", i), "s")
	}
	age(t, s, 48*time.Hour)
	require.NoError(t, s.SetRetention(ctx, store.RetentionPolicy{Company: "*", RunRetention: time.Hour}, "op"))

	held, err := s.TakeJobLease(ctx, retention.Job, "other", time.Minute)
	require.NoError(t, err)
	require.True(t, held)
	var batches []int64
	p := &retention.Purger{Store: s, Owner: "me", BatchRuns: 2, Duty: 1, Batched: func(c store.PurgeCounts) { batches = append(batches, c.Runs) }}
	held, err = s.TakeJobLease(ctx, retention.Job, "me", time.Minute)
	require.NoError(t, err)
	require.False(t, held, "another replica holds the purge")
	// A pass that finds its lease taken stops after the batch in hand.
	_, err = p.Pass(ctx)
	require.ErrorContains(t, err, "taken over")
	require.Equal(t, []int64{2}, batches)

	require.NoError(t, s.ReleaseJobLease(ctx, retention.Job, "other"))
	held, err = s.TakeJobLease(ctx, retention.Job, "me", time.Minute)
	require.NoError(t, err)
	require.True(t, held)
	batches = nil
	total, err := p.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{2, 1, 0}, batches, "bounded batches; r6, the session's newest run, stays")
	require.EqualValues(t, 3, total.Runs)
	require.Equal(t, 1, countRows(t, s, `SELECT count(*) FROM executor.runs`))
	require.Equal(t, 1, countRows(t, s, `SELECT count(*) FROM executor.runs WHERE run_id = 'r6'`))

	// A batch holds at most BatchEvents events (a bigger run alone).
	for i := 7; i <= 9; i++ {
		endedRun(t, s, "acme", fmt.Sprintf("r%d", i), "s")
	}
	age(t, s, 48*time.Hour)
	ids, err := s.ExpiredRuns(ctx, 10, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"r6"}, ids)
}
