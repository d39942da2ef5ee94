package opencode

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnerd/internal/opencode/opencodewire"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// Permission requests (OpenCode permission.asked) are runtime requests
// (SPEC E8): runtime_request.created with the payload of the codex driver's
// approvals (kind command_approval for bash, file_change_approval for
// edit/write/patch, permission_approval otherwise), answered through
// ResolveRequest:
//
//	accept            → reply "once"
//	acceptForSession  → reply "always"
//	decline           → reply "reject" with a message: the tool call fails, the turn goes on
//	cancel            → reply "reject", then the turn is aborted
//
// The request id is OpenCode's permission id ("per_…"); a request still
// open after a runnerd restart (which expired the one announced before) is
// announced afresh under "<permission id>@<driver instance>".

// RuntimeRequestSchema is the normalized request's schema.
const RuntimeRequestSchema = prp.RuntimeRequestSchema

// DeclineMessage is what the model is told when a request is declined.
const DeclineMessage = "The operator declined this tool call. Do not retry it; continue without it."

type permRequest struct {
	id, ocID, kind, turnID, itemID string
	request                        *prpv1.RuntimeRequest
}

func (r *permRequest) basePayload() *prpv1.RuntimeRequestEvent {
	return provider.RequestBase(r.id, provider.RequestTypeApproval, r.kind, r.turnID, r.itemID)
}

func permissionKind(p string) string {
	switch p {
	case "bash":
		return provider.KindCommandApproval
	case "edit", "write", "patch", "multiedit":
		return provider.KindFileChangeApproval
	}
	return provider.KindPermission
}

// onPermissionAsked announces a permission request (emitMu held);
// reannounce names it with the driver instance.
func (s *Session) onPermissionAsked(p opencodewire.PermissionRequest, reannounce bool) {
	ocID := p.ID
	id := ocID
	if reannounce {
		id = ocID + "@" + s.instance
	}
	s.mu.Lock()
	if ocID == "" || s.permByOC(ocID) != nil {
		s.mu.Unlock()
		return
	}
	turnID := ""
	if s.turn != nil {
		turnID = s.turn.id
	}
	itemID := ""
	if p.Tool != nil {
		itemID = p.Tool.CallID
	}
	r := &permRequest{id: id, ocID: ocID, kind: permissionKind(p.Permission), turnID: turnID, itemID: itemID}
	s.perms[id] = r
	sid := s.sesID
	s.mu.Unlock()
	var meta struct {
		Command string `json:"command"`
	}
	_ = json.Unmarshal(p.Metadata, &meta)
	command := meta.Command
	prompt := "Allow " + p.Permission
	if command != "" {
		prompt = command
	}
	r.request = &prpv1.RuntimeRequest{Schema: RuntimeRequestSchema, RequestKind: provider.RequestKindRuntime, RequestId: id,
		Type: provider.RequestTypeApproval, Status: provider.StatusPending, Prompt: prompt,
		TurnId: proto.String(turnID), ItemId: proto.String(r.itemID)}
	payload := r.basePayload()
	payload.Method = "permission.asked"
	payload.ThreadId = proto.String(sid)
	payload.Permission = proto.String(p.Permission)
	payload.Command = command
	payload.Patterns = p.Patterns
	payload.Cwd = s.cfg.Dir
	payload.AvailableDecisions = provider.ApprovalDecisions
	payload.Request = r.request
	s.emitBody("runtime_request.created", turnID, r.itemID, provider.P0, payload)
}

// permByOC finds an open request by its OpenCode permission id (mu held).
func (s *Session) permByOC(ocID string) *permRequest {
	for _, r := range s.perms {
		if r.ocID == ocID {
			return r
		}
	}
	return nil
}

// onPermissionReplied: a request answered by someone else (another client
// of the server) is withdrawn (emitMu held).
func (s *Session) onPermissionReplied(requestID string) {
	s.mu.Lock()
	r := s.permByOC(requestID)
	if r != nil {
		delete(s.perms, r.id)
	}
	s.mu.Unlock()
	if r == nil {
		return
	}
	payload := r.basePayload()
	payload.Reason = failure.ProviderResolved
	s.emitBody("runtime_request.cancelled", r.turnID, r.itemID, provider.P0, payload)
}

// announcePending announces afresh the server's open requests of the
// session (after a re-attach; emitMu held).
func (s *Session) announcePending(ctx context.Context) {
	var pending []opencodewire.PermissionRequest
	if err := s.call(ctx, http.MethodGet, "/permission", nil, &pending); err != nil {
		s.log.Warn("opencode: listing pending permissions", "err", err)
		return
	}
	for _, p := range pending {
		if p.SessionID == s.sesID {
			s.onPermissionAsked(p, true)
		}
	}
}

// expireRequests ends every open request (emitMu held).
func (s *Session) expireRequests(reason string) {
	s.mu.Lock()
	reqs := make([]*permRequest, 0, len(s.perms))
	for id, r := range s.perms {
		reqs = append(reqs, r)
		delete(s.perms, id)
	}
	s.mu.Unlock()
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].id < reqs[j].id })
	for _, r := range reqs {
		payload := provider.ExpiredRequest(r.basePayload(), r.request, reason)
		s.emitBody("runtime_request.expired", r.turnID, r.itemID, provider.P0, payload)
	}
}

// ResolveRequest answers a pending permission request.
func (s *Session) ResolveRequest(ctx context.Context, requestID string, resolution provider.Resolution) (*prpv1.RuntimeRequestEvent, error) {
	decision := resolution.Decision
	if resolution.Object {
		decision = ""
	}
	var body opencodewire.PermissionReply
	switch decision {
	case "accept":
		body.Reply = "once"
	case "acceptForSession":
		body.Reply = "always"
	case "decline":
		body.Reply, body.Message = "reject", DeclineMessage
	case "cancel":
		body.Reply = "reject"
	default:
		return nil, perr(failure.RuntimeRequestResolutionInvalid, "an OpenCode permission takes decision accept, acceptForSession, decline or cancel")
	}
	s.emitMu.Lock()
	s.mu.Lock()
	r := s.perms[requestID]
	delete(s.perms, requestID)
	sid := s.sesID
	s.mu.Unlock()
	if r == nil {
		s.emitMu.Unlock()
		return nil, perr(failure.RuntimeRequestNotPending, "runtime request %s is not pending", requestID)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if err := s.call(ctx, http.MethodPost, "/permission/"+r.ocID+"/reply", body, nil); err != nil {
		if isNotFound(err) {
			s.emitMu.Unlock()
			return nil, perr(failure.RuntimeRequestNotPending, "OpenCode no longer holds permission %s", requestID)
		}
		s.mu.Lock()
		s.perms[requestID] = r
		s.mu.Unlock()
		s.emitMu.Unlock()
		return nil, perr(failure.ProviderTransportFailed, "answering OpenCode permission %s: %v", requestID, err)
	}
	out := r.basePayload()
	out.Resolution = &prpv1.RuntimeResolution{Decision: decision}
	s.emitBody("runtime_request.resolved", r.turnID, r.itemID, provider.P0, out)
	s.emitMu.Unlock()
	if decision == "cancel" && r.turnID != "" {
		if err := s.Interrupt(ctx, r.turnID); err != nil {
			s.log.Warn("opencode: aborting after a cancelled request", "err", err)
		}
	}
	_ = sid
	return proto.Clone(out).(*prpv1.RuntimeRequestEvent), nil
}

// AnswerToolCall refuses: the OpenCode driver offers no dynamic tools.
func (s *Session) AnswerToolCall(_ context.Context, callID, _ string, _ bool, _ []*prpv1.ToolContentItem) (*prpv1.ToolCallEvent, error) {
	return nil, perr(failure.ToolCallNotPending, "tool call %s is not pending (the OpenCode driver has no dynamic tools)", callID)
}
