package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// TestE13_AToolResultWhoseRunEndsBeforeItsCommandResultStillCompletes: the
// provider finished at once on the answer, so the run's terminal ended the
// stream ahead of the tool.result command's result; the runner's
// semantic_tool.result for the call (from the controller) came before it and
// completes CompleteToolCall, which waited for its deadline before.
func TestE13_AToolResultWhoseRunEndsBeforeItsCommandResultStillCompletes(t *testing.T) {
	t.Parallel()
	sent := make(chan *prpv1.Command, 1)
	l := newLiveSession(&store.Claim{Fence: store.Fence{RunID: "run-1", Owner: "x", Attempt: 1}},
		func(r *gatewayv1.AttachRequest) error { sent <- r.GetCommand(); return nil }, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		id  string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		id, err := l.CompleteToolCall(ctx, "call_1", true, "42")
		done <- answer{id, err}
	}()
	cmd := <-sent
	require.Equal(t, "tool.result", cmd.GetType())
	event := func(source string) *prpv1.Event {
		p, err := structpb.NewStruct(map[string]any{"callId": "call_1", "source": source, "success": true})
		require.NoError(t, err)
		return &prpv1.Event{EventType: "semantic_tool.result", Payload: p}
	}
	l.observe(event("driver")) // a timeout's answer settles nothing of ours
	select {
	case a := <-done:
		t.Fatalf("completed by the driver's result: %+v", a)
	default:
	}
	l.observe(event("controller"))
	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, cmd.GetCommandId(), a.id)
}
