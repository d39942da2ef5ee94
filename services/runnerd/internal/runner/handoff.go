package runner

import (
	"maps"
	"slices"
	"strings"

	"github.com/tether-run/tether/pkg/runnerstate"
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

// requestFields are the announcement fields an expiry repeats.
var requestFields = []string{"requestId", "requestKind", "requestType", "kind", "method", "threadId", "turnId", "itemId", "request"}

// trackRequest keeps OpenRequests in step with an event being journaled,
// labelled with run runID. It reports whether the set changed.
func (r *Runner) trackRequest(e pendingEvent, runID string) bool {
	var key string
	switch e.typ {
	case "runtime_request.created", "runtime_request.resolved", "runtime_request.expired", "runtime_request.cancelled":
		id, _ := e.payload["requestId"].(string)
		key = "request:" + id
	case "semantic_tool.input", "semantic_tool.result", "tool.execution.completed":
		id, _ := e.payload["callId"].(string)
		key = "tool:" + id
	default:
		return false
	}
	switch e.typ {
	case "runtime_request.created", "semantic_tool.input":
		if r.st.OpenRequests == nil {
			r.st.OpenRequests = map[string]*runnerstate.OpenRequest{}
		}
		fields := map[string]any{}
		for _, f := range append(requestFields, "callId", "tool") {
			if v, ok := e.payload[f]; ok {
				fields[f] = v
			}
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
	for _, k := range keys {
		o := r.st.OpenRequests[k]
		if o == nil {
			continue
		}
		if strings.HasPrefix(k, "tool:") {
			evs = append(evs, pendingEvent{prio: P1, typ: "tool.execution.completed", turnID: o.TurnID, itemID: o.ItemID, runID: o.RunID,
				payload: map[string]any{"callId": o.Fields["callId"], "tool": o.Fields["tool"], "success": false, "code": reason}})
			continue
		}
		payload := map[string]any{"reason": reason, "replayAllowed": false}
		for _, f := range requestFields {
			if v, ok := o.Fields[f]; ok {
				payload[f] = v
			}
		}
		if req, ok := o.Fields["request"].(map[string]any); ok {
			c := maps.Clone(req)
			c["status"] = "expired"
			payload["request"] = c
		}
		evs = append(evs, pendingEvent{prio: P0, typ: "runtime_request.expired", turnID: o.TurnID, itemID: o.ItemID, runID: o.RunID, payload: payload})
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
