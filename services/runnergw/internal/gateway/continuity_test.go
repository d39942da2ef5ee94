package gateway

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// openRaw sends open as the stream's Open; the answer is Opened or the
// refusal. The stream is closed again.
func (rl *relay) openRaw(ctx context.Context, open *gatewayv1.Open) (*gatewayv1.Opened, error) {
	s, err := rl.client.Attach(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil {
		return nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, err
	}
	_ = s.CloseSend()
	return m.GetOpened(), nil
}

func TestF3_GatewayFailsClosedOnALostScopeAndAReplacementStartsAFreshRootOnce(t *testing.T) {
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("f3", "acme", "hello")
	sc := scope.OfRun("run-1", in)
	root := filepath.Join(rl.cfg.StateRoot, sc)
	first, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	prior := []*gatewayv1.PriorRun{terminalRun("run-1", in)}

	// A decision pending: the live runner is closed, its root moved aside,
	// and the run starts a fresh runner on a fresh root.
	open := &gatewayv1.Open{RunId: "run-2", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in,
		PriorRuns: prior, ReplacementId: "repl-1"}
	opened, err := rl.openRaw(ctx, open)
	require.NoError(t, err)
	require.NotEqual(t, first.GetRunnerInstanceId(), opened.GetRunnerInstanceId())
	require.Equal(t, "fresh", opened.GetDurableSource())
	breaks, err := filepath.Glob(filepath.Join(rl.cfg.StateRoot, ContinuityBreaksDir, sc+".*.repl-1"))
	require.NoError(t, err)
	require.Len(t, breaks, 1)
	require.DirExists(t, filepath.Join(breaks[0], "control-plane"), "the old root, whole")
	rl.waitDetached(sc)

	// A later attempt of the same run finds the scope already its own.
	open.Fence.Attempt = 2
	again, err := rl.openRaw(ctx, open)
	require.NoError(t, err)
	require.Equal(t, opened.GetRunnerInstanceId(), again.GetRunnerInstanceId())
	breaks, err = filepath.Glob(filepath.Join(rl.cfg.StateRoot, ContinuityBreaksDir, "*"))
	require.NoError(t, err)
	require.Len(t, breaks, 1, "nothing moved again")
	rl.waitDetached(sc)

	// The scope's state is lost with no checkpoint: a run that must
	// continue it fails closed and creates nothing.
	_, err = rl.client.CloseRunner(ctx, &gatewayv1.CloseRunnerRequest{Input: in, RunId: "run-2", Reason: "test"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rl.runner(sc).GetLifecycle() == LifecycleExited }, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, os.RemoveAll(root))
	_, err = rl.openRaw(ctx, &gatewayv1.Open{RunId: "run-3", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in,
		PriorRuns: append(prior, terminalRun("run-2", in)), ContinuityRequired: true})
	require.EqualValues(t, failure.RunnerHarnessStateMismatch, failure.CodeOf(err), "%v", err)
	require.NoDirExists(t, root)
}
