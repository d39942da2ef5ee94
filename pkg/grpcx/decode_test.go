package grpcx

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// rawCodec sends a rawMsg's bytes as they are (a Go client cannot marshal
// invalid UTF-8) and decodes responses with the proto codec.
type rawCodec struct{ encoding.CodecV2 }

type rawMsg []byte

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawMsg); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return c.CodecV2.Marshal(v)
}

func (rawCodec) Name() string { return "proto" }

func rawCall() grpc.CallOption {
	return grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)})
}

// stringField is one length-delimited field holding b as it is.
func stringField(num protowire.Number, b []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
}

func wantInvalidRequest(t *testing.T, err error, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || failure.CodeOf(err) != failure.InvalidRequest {
		t.Fatalf("got %v (%s), want InvalidArgument %s", st.Code(), st.Message(), failure.InvalidRequest)
	}
	if !strings.Contains(st.Message(), field) {
		t.Fatalf("message %q does not name %s", st.Message(), field)
	}
	if len(st.Message()) > 1024 {
		t.Fatalf("message of %d bytes", len(st.Message()))
	}
}

func TestT6_InvalidUTF8IsInvalidArgumentNamingTheField(t *testing.T) {
	t.Parallel()
	h := startServer(t, nil)
	client := executorv1.NewExecutorServiceClient(h.conn)
	bad := []byte("run-\xff\xfe")
	var resp executorv1.GetRunResponse
	err := h.conn.Invoke(ctxT(t), "/tether.executor.v1.ExecutorService/GetRun", rawMsg(stringField(1, bad)), &resp, rawCall())
	wantInvalidRequest(t, err, "run_id")

	// A stream's request: WatchRun.
	stream, err := h.conn.NewStream(ctxT(t), &executorv1.ExecutorService_ServiceDesc.Streams[0],
		"/tether.executor.v1.ExecutorService/WatchRun", rawCall())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(rawMsg(stringField(1, bad))); err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var w executorv1.WatchRunResponse
	wantInvalidRequest(t, stream.RecvMsg(&w), "run_id")

	// Nested: SubmitRun{input{task{prompt}}}.
	task := stringField(1, []byte("hello \xc3"))
	input := stringField(3, task)
	err = h.conn.Invoke(ctxT(t), "/tether.executor.v1.ExecutorService/SubmitRun", rawMsg(stringField(2, input)), &executorv1.SubmitRunResponse{}, rawCall())
	wantInvalidRequest(t, err, "input.task.prompt")

	// A valid request still gets through.
	if _, err := client.GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "run-1"}); err != nil {
		t.Fatal(err)
	}
}

// deepStruct is a JSON-schema-like Struct nested depth levels.
func deepStruct(depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("object")}}
	for range depth {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"properties": structpb.NewStructValue(s)}}
	}
	return s
}

func TestT6_NestingDeeperThanTheDecoderIsInvalidArgumentNotInternal(t *testing.T) {
	t.Parallel()
	h := startServer(t, nil)
	req := &executorv1.SubmitRunRequest{RunId: "deep", Input: &prpv1.ExecutionInput{
		DynamicTools: []*prpv1.DynamicTool{{Name: "t", InputSchema: deepStruct(20000)}},
	}}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	// A generous bound: 40,000 nested messages are slow to send under -race.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = h.conn.Invoke(ctx, "/tether.executor.v1.ExecutorService/SubmitRun", rawMsg(b), &executorv1.SubmitRunResponse{}, rawCall())
	wantInvalidRequest(t, err, "input.dynamic_tools.input_schema")
	if !strings.Contains(status.Convert(err).Message(), "nested deeper") {
		t.Fatalf("message %q", status.Convert(err).Message())
	}
}

func TestT6_AHugeRunIDIsRefusedAndLogsNoHugeLine(t *testing.T) {
	t.Parallel()
	h := startServer(t, nil)
	client := executorv1.NewExecutorServiceClient(h.conn)
	huge := strings.Repeat("r", 10<<20)
	// A generous bound, as above: 10 MiB under -race on a loaded box took
	// more than ctxT's 10 s once (a fresh clone's make test beside a chaos run).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: huge})
	wantInvalidRequest(t, err, "run_id")
	h.stop(t)
	logs := h.logs.String()
	if !strings.Contains(logs, "invalid_request") {
		t.Fatalf("the refused call was not logged:\n%s", CapLogValue(logs, 4096))
	}
	for line := range bytes.Lines([]byte(logs)) {
		if len(line) > 2*MaxLogValueBytes {
			t.Fatalf("a log line of %d bytes", len(line))
		}
	}
}

func TestT6_CapLogValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc...(+3 bytes)"},
		{"bad\xffx", 10, "bad\uFFFDx"},
		{"ééé", 3, "é...(+4 bytes)"},
	} {
		if got := CapLogValue(tc.in, tc.n); got != tc.want {
			t.Errorf("CapLogValue(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
