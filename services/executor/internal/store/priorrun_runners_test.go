package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// TestF8_AReturningRootsRunIsKnownToTheOpenHoweverManyRunsCameSince: a
// gateway's host died after a run of the scope, its runner's root naming
// that run; more runs of the scope than an Open carries prior runs (16)
// ended meanwhile without a runner (they waited for the host, or failed
// before any attach). When the host returns, the next run's Open must let
// the gateway verify the root (SPEC E13): the run it names is terminal, of
// the same scope, its runner suspended. Before, the Open carried only the
// 16 newest runs, the root's run read as unknown ("prior run … is
// unknown"), the root was quarantined and the fail-back failed (TestX2's
// flake). The Open also carries the newest run each of the scope's runners
// served.
func TestF8_AReturningRootsRunIsKnownToTheOpenHoweverManyRunsCameSince(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-back", "session-back")
	const served = "back-served"
	_, _, err := s.SubmitRun(ctx, served, in)
	require.NoError(t, err)
	c, err := s.ClaimRun(ctx, served, "owner-a", time.Minute, ctl, in.GetBinding(), nil)
	require.NoError(t, err)
	id := e13Identity(served, "session-back")
	require.NoError(t, s.RecordRunner(ctx, c.Fence, id.RunnerInstanceID, nil, nil))
	res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(served, id.RunnerInstanceID, 1, store.EventTerminal,
		map[string]any{"turnTerminalState": "completed", "runTerminalState": store.StateSucceeded})})
	require.NoError(t, err)
	require.True(t, res.Terminal)
	for i := range 20 {
		e13Run(t, s, fmt.Sprintf("back-%02d", i), in, store.StateFailed)
	}
	const cur = "back-next"
	_, _, err = s.SubmitRun(ctx, cur, in)
	require.NoError(t, err)
	cc, err := s.ClaimRun(ctx, cur, "owner-b", time.Minute, ctl, in.GetBinding(), nil)
	require.NoError(t, err)

	f, err := s.AttachFacts(ctx, cur, cc.Scope(), in, 16)
	require.NoError(t, err)
	require.Equal(t, "back-19", f.PriorRuns[0].RunID, "newest first")
	require.Equal(t, served, f.PriorRuns[len(f.PriorRuns)-1].RunID, "the runner's newest run, after the 16 newest")
	require.Len(t, f.PriorRuns, 17)
	require.Equal(t, id.RunnerInstanceID, f.PriorRuns[16].RunnerInstanceID)

	// The returning host's root, as the gateway verifies it with the Open's
	// records.
	base := t.TempDir()
	root := e13Root(base, cur, in)
	e13Seed(t, root, id, "suspended")
	p, err := durable.Prepare(ctx, durable.Request{Base: base, Scope: scope.ParamsOf(cur, in).Key(), RunID: cur,
		PriorRuns: store.PriorRunLookupOf(f.PriorRuns)})
	require.NoError(t, err)
	require.Equal(t, durable.SourcePriorRun, p.Source)
	e13NoQuarantine(t, base)

	// PriorRuns reads the same records.
	recs, err := s.PriorRuns(ctx, cur, 16)
	require.NoError(t, err)
	require.Equal(t, f.PriorRuns, recs)
}
