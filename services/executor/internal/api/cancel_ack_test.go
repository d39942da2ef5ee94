package api_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// recordReads counts the statements that read a run's cancellation record
// alone, outside a lock (store.Cancellation: CancelRun's read back).
type recordReads struct {
	mu sync.Mutex
	n  int
}

func (r *recordReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), "SELECT result_metadata -> 'nativeCancellation'") && !strings.Contains(d.SQL, "FOR UPDATE") {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
	}
	return ctx
}

func (r *recordReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recordReads) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// TestP2_CancelRunAnswersFromTheRecordTheTerminalsCommitAcknowledged: the
// local driver persists the run's run.terminal and acknowledges the
// cancellation in that commit (store.AppendEventsAcking); CancelRun is
// woken with the record as that commit left it and answers from it,
// without reading it back (one round trip less on every cancellation's
// path, SPEC P2). A wake-up without the record reads it once, as before.
func TestP2_CancelRunAnswersFromTheRecordTheTerminalsCommitAcknowledged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reads := &recordReads{}
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	st, err := store.Open(ctx, dsn, runrules.New(), func(c *pgxpool.Config) { c.ConnConfig.Tracer = reads })
	require.NoError(t, err)
	t.Cleanup(st.Close)

	for _, withRecord := range []bool{true, false} {
		runID := map[bool]string{true: "with-record", false: "without"}[withRecord]
		_, _, err := st.SubmitRun(ctx, runID, validInput())
		require.NoError(t, err)
		c, err := st.ClaimNext(ctx, "owner", time.Minute, store.Controller{})
		require.NoError(t, err)
		require.Equal(t, runID, c.RunID)

		waiter := make(chan *executorv1.Cancellation, 1)
		done := make(chan error, 1)
		srv := &api.Server{
			Store: st,
			AwaitCancellationAck: func(string) (<-chan *executorv1.Cancellation, func()) {
				return waiter, func() {}
			},
			// The local driver: the turn's end, acknowledging the
			// cancellation it was handed in the terminal's commit (before
			// CancelRun waits, so that no poll of the record comes first).
			DispatchCancellation: func(_ string, rec *executorv1.Cancellation) {
				res, err := st.AppendEventsAcking(ctx, c.Fence, terminalOf(runID), []string{rec.GetIntentId()})
				if err == nil && withRecord {
					waiter <- res.AcknowledgedRecord
				} else {
					waiter <- nil
				}
				done <- err
			},
		}
		before := reads.count()
		out, err := srv.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: runID, Reason: "stop"})
		require.NoError(t, err)
		require.NoError(t, <-done)
		n := reads.count() - before
		stored, err := st.Cancellation(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, "acknowledged", out.GetCancellation().GetDispatchState())
		require.True(t, proto.Equal(stored, out.GetCancellation()), "answered %v, stored %v", out.GetCancellation(), stored)
		if withRecord {
			require.Zero(t, n, "CancelRun read the acknowledged record back")
		} else {
			require.Equal(t, 1, n, "a wake-up without the record reads it once")
		}
	}
}

// terminalOf is a cancelled turn's last batch.
func terminalOf(run string) []*prpv1.Event {
	evs := make([]*prpv1.Event, 2)
	for i, typ := range []string{"turn.interrupted", store.EventTerminal} {
		p, _ := structpb.NewStruct(map[string]any{"runTerminalState": "cancelled", "turnTerminalState": "interrupted"})
		evs[i] = &prpv1.Event{Schema: "tether.prp.event.v1", SourceInstanceId: "runner-1", SourceEventId: run + typ,
			SourceSeq: uint64(i + 1), SourceKind: "runner", SchemaVersion: 1, Priority: 0, RunId: run, EventType: typ, Payload: p}
	}
	return evs
}
