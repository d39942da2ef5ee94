package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// TestF7_ReplaceSessionWaitsOutTheClaimOfARunWaitingForItsGateway: the run
// of a session whose gateway is lost waits, claimed now and then and
// handed straight back (SPEC F7). An operator's ReplaceSession that
// arrives while a claim holds it (the run shows in flight for those
// milliseconds) waits the claim out instead of answering
// native_session_supervisor_busy; a run that stays in flight still
// refuses.
func TestF7_ReplaceSessionWaitsOutTheClaimOfARunWaitingForItsGateway(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	_, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "w1", Input: validInput()})
	require.NoError(t, err)
	ctl := store.Controller{Addr: "127.0.0.1:1"}
	c, err := e.store.ClaimRun(ctx, "w1", "owner-1", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(300 * time.Millisecond) // the claim sees the gateway lost and hands the run back
		_ = e.store.DeferRun(ctx, c.Fence, failure.WaitingForGateway, "its gateway is lost", time.Minute)
	}()
	res, err := e.client.ReplaceSession(ctx, &executorv1.ReplaceSessionRequest{CompanyId: "acme", NormalizedSessionId: "s1", RequestedBy: "alice", Reason: "host gone"})
	require.NoError(t, err, "the claim was waited out")
	require.Len(t, res.GetReplacements(), 1)
	<-released

	// A run that stays in flight: refused after the wait.
	in := validInput()
	in.Session.NormalizedSessionId = "s2"
	_, err = e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "w2", Input: in})
	require.NoError(t, err)
	_, err = e.store.ClaimRun(ctx, "w2", "owner-1", time.Minute, ctl, nil, nil)
	require.NoError(t, err)
	_, err = e.client.ReplaceSession(ctx, &executorv1.ReplaceSessionRequest{CompanyId: "acme", NormalizedSessionId: "s2", RequestedBy: "alice", Reason: "host gone"})
	require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err), "%v", err)
}
