package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// SPEC E13, X2: an executor stopped (SIGSTOP) after it recorded its run's
// end, before it detached, leaves its attachment open on the gateway. The
// scope's next run — claimed by another replica once the database shows
// the first run ended — takes the scope over from that stale attachment
// (the newer run wins; the stale stream is refused from then on). Without
// that proof (the first run still running in the records) the scope stays
// busy for the second run.
func TestE13_GatewayLetsTheNextRunTakeTheScopeFromAStaleAttachmentOfAnEndedRun(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	first := testInput("stale", "acme", "first")
	sc := scope.OfRun("run-1", first)

	// run-1 runs to its end on a stream its controller never closes.
	stale, opened, err := rl.attach(ctx, "run-1", nil, first)
	require.NoError(t, err)
	require.NotNil(t, opened)
	raw, err := protojson.Marshal(first)
	require.NoError(t, err)
	var inMap map[string]any
	require.NoError(t, json.Unmarshal(raw, &inMap))
	for _, c := range []*prpv1.Command{
		command(t, "run-1", 1, "run.attach", map[string]any{"input": inMap}),
		command(t, "run-1", 1, "turn.start", map[string]any{"text": "first"}),
	} {
		require.NoError(t, stale.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: c}}))
	}
	var events []*prpv1.Event
	for ended := false; !ended; {
		m, err := stale.Recv()
		require.NoError(t, err)
		for _, ev := range m.GetEvents().GetEvents() {
			events = append(events, ev)
			ended = ended || ev.GetEventType() == "run.terminal"
		}
		if n := len(events); n > 0 {
			require.NoError(t, stale.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Ack{Ack: &gatewayv1.Ack{
				SourceInstanceId: events[0].GetSourceInstanceId(), PersistedThroughSeq: contiguous(events)}}}))
		}
	}
	requireSucceeded(t, events)
	require.Equal(t, "run-1", rl.runner(sc).GetAttachedRunId(), "the stopped controller is still attached")

	// The records do not show run-1 ended: the scope is busy.
	second := testInput("stale", "acme", "second")
	_, err = rl.openPrior(ctx, "run-2", second, &gatewayv1.PriorRun{RunId: "run-1", Status: "running", Input: first})
	require.EqualValues(t, failure.NativeSessionSupervisorBusy, failure.CodeOf(err), "%v", err)
	require.Equal(t, "run-1", rl.runner(sc).GetAttachedRunId())

	// They do: run-2 takes the scope over and runs on the same runner.
	rl.prior = []*gatewayv1.PriorRun{terminalRun("run-1", first)}
	op2, evs := rl.turn(ctx, "run-2", nil, second, nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.Equal(t, opened.GetRunnerInstanceId(), op2.GetRunnerInstanceId(), "the same live runner")
	require.Equal(t, "run-1", op2.GetPreviousRunId())

	// The stale stream was ended as superseded; nothing it sends reaches
	// the runner.
	for {
		_, err := stale.Recv()
		if err != nil {
			require.EqualValues(t, failure.RunnerAttachmentSuperseded, failure.CodeOf(err), "%v", err)
			break
		}
	}
	require.Equal(t, 2, countCalls(t, rl.callLog, "turn/start"), "one turn/start per run")
}
