package plan

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// FuzzStoredEvents feeds arbitrary runner payloads (JSON objects, as the
// runner WebSocket carries them) of plan updates and terminals to
// StoredEvents and TerminalResult. They must never panic, never keep a plan
// over the bound, and the stored form must be a fixed point. The committed
// corpus lives in testdata/fuzz/FuzzStoredEvents.
func FuzzStoredEvents(f *testing.F) {
	f.Add(true, []byte(`{"source":"turn_plan","explanation":"Fix it.","steps":[{"step":"Read","status":"inProgress"}]}`))
	f.Add(true, []byte(`{"source":"plan_item","markdown":"# Plan\n\n1. a"}`))
	f.Add(false, []byte(`{"finalMessage":"Plan: 1) a; 2) b.","artifacts":[{"kind":"native_provider_plan","ref":"opaque"}]}`))
	f.Add(false, []byte(`{"artifacts":[{"kind":"native_provider_plan","ref":"native-provider-plan:x-v1#1-a"},"x",{"kind":1}]}`))
	f.Fuzz(func(t *testing.T, update bool, payload []byte) {
		s := &structpb.Struct{}
		if protojson.Unmarshal(payload, s) != nil {
			return
		}
		typ := EventTerminal
		if update {
			typ = EventPlanUpdated
		}
		ev := &prpv1.Event{RunId: "r", SourceInstanceId: "i", SourceSeq: 1, EventType: typ, Payload: s}
		orig := proto.Clone(ev)
		out := StoredEvents([]*prpv1.Event{ev})
		if !proto.Equal(orig, ev) {
			t.Fatal("the input was changed")
		}
		again := StoredEvents(out)
		if !proto.Equal(again[0], out[0]) {
			t.Fatalf("not a fixed point: %v then %v", out[0], again[0])
		}
		if md, ok := UpdateMarkdown(out[0]); ok && len(md) > MaxRefBytes {
			t.Fatalf("a plan of %d bytes was kept", len(md))
		}
		arts, md := TerminalResult(out[0])
		for _, a := range arts {
			if len(a.Ref) > MaxRefBytes {
				t.Fatalf("an artifact ref of %d bytes was kept", len(a.Ref))
			}
		}
		if md != "" && len(md) > 4*MaxRefBytes {
			t.Fatalf("a result plan of %d bytes", len(md))
		}
	})
}
