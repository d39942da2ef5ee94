package grpcx

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Unwrapped returns the call's own grpc-go stream, under the per-message
// wrappers of the server's stream interceptors, for a handler that sends
// many messages to many streams (WatchRun's fan-out): a message sent on it
// skips the message hooks (grpc_server_msg_sent_total, the logging
// interceptor's), which cost about a tenth of such a send. The call itself
// is still counted, logged, traced and recovered. Other streams (a server
// not built by New, a test's fake) come back as they are.
func Unwrapped(ss grpc.ServerStream) grpc.ServerStream {
	if f, _ := ss.Context().Value(callFieldsKey{}).(*callFields); f != nil && f.stream != nil {
		return f.stream
	}
	return ss
}

// payloadless passes every RPC event but the per-message payloads to the
// OpenTelemetry handler, which records nothing for those (message events
// are off) but looked its span up in the call's context for each message.
type payloadless struct{ stats.Handler }

func (h payloadless) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InPayload, *stats.OutPayload:
		return
	}
	h.Handler.HandleRPC(ctx, s)
}
