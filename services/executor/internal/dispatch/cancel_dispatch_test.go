package dispatch

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// sendCounter is an Attach stream that counts the commands sent on it.
type sendCounter struct {
	grpc.BidiStreamingClient[gatewayv1.AttachRequest, gatewayv1.AttachResponse]
	mu   sync.Mutex
	cmds []string
}

func (s *sendCounter) Send(req *gatewayv1.AttachRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmds = append(s.cmds, req.GetCommand().GetCommandId())
	return nil
}

// E6/D3: a cancellation is dispatched once per stream, however many kicks
// follow — also a kick that read the record as still pending after the
// runner answered the dispatch but before the stream's acknowledgement
// committed (the answer took the dispatch off those awaiting an answer,
// and the previous code sent it again and counted a second dispatch).
func TestE6_ACancellationAnsweredOnAStreamIsNotDispatchedAgainByALateKick(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	_, _, err := s.SubmitRun(ctx, "r", input("s-r"))
	require.NoError(t, err)
	c, err := s.ClaimRun(ctx, "r", "me", time.Minute, store.Controller{}, nil, nil)
	require.NoError(t, err)
	_, err = s.RecordCancellation(ctx, store.CancelRequest{RunID: "r", Scope: "run", Reason: "stop", RequestID: "q1", Actor: "test"})
	require.NoError(t, err)
	stale, err := s.Cancellation(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "pending", stale.GetDispatchState())

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := New(s, Config{Owner: "me", LeaseTTL: time.Minute, Logger: quiet, Metrics: prometheus.NewRegistry(), NoSameHostTakeover: true})
	stream := &sendCounter{}
	a := &attachment{d: d, c: c, stream: stream, log: quiet, ctx: ctx}
	a.live = newLiveSession(c, a.send, 0)
	a.resetCancels()

	require.NoError(t, a.dispatchCancel(stale))
	require.NoError(t, a.dispatchCancel(stale), "the notification's kick after the local one")
	require.Len(t, stream.cmds, 1)
	// The runner answers; the acknowledgement is written beside the pump.
	_, _, err = a.onResult(&prpv1.CommandResult{CommandId: stream.cmds[0], Status: "completed"})
	require.NoError(t, err)
	// A kick that read the record before the acknowledgement committed.
	require.NoError(t, a.dispatchCancel(stale))
	a.acking.Wait()

	require.Len(t, stream.cmds, 1, "dispatched once on this stream: %v", stream.cmds)
	require.Equal(t, 1.0, testutil.ToFloat64(d.metrics.cancellations.WithLabelValues(cancelDispatched)))
	require.Equal(t, 1.0, testutil.ToFloat64(d.metrics.cancellations.WithLabelValues(cancelAcknowledged)))
	rec, err := s.Cancellation(ctx, "r")
	require.NoError(t, err)
	require.NotEqual(t, "pending", rec.GetDispatchState())
}
