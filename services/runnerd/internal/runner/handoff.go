package runner

import (
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// Runtime requests across a runnerd crash (SPEC R8). The runtime requests
// and tool calls runnerd announced and that are not settled yet are kept in
// the state (OpenRequests). A runnerd that restarts cannot answer them: the
// dead runnerd's driver held them, and a provider host answers the ones its
// dead client left open with an error. So the restarted runnerd announces
// each as runtime_request.expired (replayAllowed false; reason
// durable_handoff when the provider survived under its host,
// provider_process_lost when it did not) — which feeds the executor's
// durable question fallback (E5) — and each tool call as
// tool.execution.completed with success false.

// trackRequest keeps OpenRequests in step with an event being journaled,
// labelled with run runID. It reports whether the set changed. An open
// request keeps the announcement fields its expiry repeats (its identity,
// method, thread and normalized request; a tool call's id and tool).
func (r *Runner) trackRequest(e pendingEvent, runID string) bool {
	var key string
	var kept proto.Message
	switch b := e.body.(type) {
	case *prpv1.RuntimeRequestEvent:
		key = "request:" + b.GetRequestId()
		k := provider.BaseOf(b)
		k.Method, k.ThreadId, k.Request = b.GetMethod(), b.ThreadId, b.GetRequest()
		kept = k
	case *prpv1.ToolCallEvent:
		if e.typ == prp.EventToolExecutionStarted {
			return false
		}
		key = "tool:" + b.GetCallId()
		kept = &prpv1.ToolCallEvent{CallId: b.GetCallId(), Tool: b.GetTool()}
	default:
		return false
	}
	switch e.typ {
	case prp.EventRuntimeRequestCreated, prp.EventToolInput:
		fields, err := protojson.Marshal(kept)
		if err != nil {
			return false
		}
		if r.st.OpenRequests == nil {
			r.st.OpenRequests = map[string]*runnerstate.OpenRequest{}
		}
		r.st.OpenRequests[key] = &runnerstate.OpenRequest{RunID: runID, TurnID: e.turnID, ItemID: e.itemID, Fields: fields}
		return true
	}
	if _, ok := r.st.OpenRequests[key]; !ok {
		return false
	}
	delete(r.st.OpenRequests, key)
	return true
}

// openRequestKeys are the keys of the requests open now.
func (r *Runner) openRequestKeys() []string {
	return slices.Sorted(maps.Keys(r.st.OpenRequests))
}

// expireRequests announces the given open requests expired with reason
// (one journaled batch) and forgets them.
func (r *Runner) expireRequests(keys []string, reason string) {
	var evs []pendingEvent
	decode := protojson.UnmarshalOptions{DiscardUnknown: true}
	for _, k := range keys {
		o := r.st.OpenRequests[k]
		if o == nil {
			continue
		}
		if strings.HasPrefix(k, "tool:") {
			var call prpv1.ToolCallEvent
			_ = decode.Unmarshal(o.Fields, &call) // what does not decode stays empty
			evs = append(evs, pendingEvent{prio: P1, typ: prp.EventToolExecutionCompleted, turnID: o.TurnID, itemID: o.ItemID, runID: o.RunID,
				body: &prpv1.ToolCallEvent{CallId: call.GetCallId(), Tool: call.GetTool(), Success: proto.Bool(false), Code: reason}})
			continue
		}
		var req prpv1.RuntimeRequestEvent
		_ = decode.Unmarshal(o.Fields, &req)
		exp := provider.ExpiredRequest(&req, req.GetRequest(), reason)
		evs = append(evs, pendingEvent{prio: P0, typ: prp.EventRuntimeRequestExpired, turnID: o.TurnID, itemID: o.ItemID, runID: o.RunID, body: exp})
	}
	if len(evs) == 0 {
		return
	}
	r.log.Warn("runtime requests open at the runnerd restart expire", "requests", len(evs), "reason", reason)
	r.emitAll(evs)
	for _, k := range keys {
		delete(r.st.OpenRequests, k) // a tool call's completion alone may not close it
	}
	r.mustSave()
}
