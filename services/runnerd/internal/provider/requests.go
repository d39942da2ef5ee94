package provider

// ExpiredRequest is the payload of runtime_request.expired for a request
// whose event payload base (requestId, kinds, turn and item ids) and
// normalized request object are given: the reason, replayAllowed false and
// a copy of the request with status "expired" (SPEC R8, E5).
func ExpiredRequest(base, request map[string]any, reason string) map[string]any {
	base["reason"] = reason
	base["replayAllowed"] = false
	req := make(map[string]any, len(request)+1)
	for k, v := range request {
		req[k] = v
	}
	req["status"] = "expired"
	base["request"] = req
	return base
}
