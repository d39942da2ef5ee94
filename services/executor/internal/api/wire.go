package api

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// A run's watch feed encodes each event's WatchRunResponse once and every
// watcher of the run sends those bytes: with 1,000 watchers an event is
// marshalled once, not 1,000 times (it was half of the executor's CPU per
// delivered event).

// encodedResponse is a WatchRunResponse already in its wire form.
type encodedResponse struct{ b []byte }

// EncodeWatchEvent is the watch hub's encoder (watch.WithEncoder). The
// terminal event is left to each watcher: its response carries the run's
// result, read when it is sent.
func EncodeWatchEvent(e store.StoredEvent) (any, error) {
	if e.Event.GetEventType() == store.EventTerminal {
		return nil, nil
	}
	b, err := proto.Marshal(&executorv1.WatchRunResponse{Seq: e.Seq, Event: e.Event})
	if err != nil {
		return nil, err
	}
	return &encodedResponse{b: b}, nil
}

// WatchCodec is the server option an executor serving a hub with
// EncodeWatchEvent needs: grpcx's request-checking proto codec, which also sends an encoded
// response as it is.
func WatchCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(wireCodec{grpcx.Codec()})
}

type wireCodec struct{ encoding.CodecV2 }

// Marshal sends encoded bytes as they are (shared, read only: a SliceBuffer's
// Free does nothing) and everything else through the proto codec.
func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedResponse); ok {
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.CodecV2.Marshal(v)
}
