package acp

import "github.com/tether-run/tether/pkg/provenv"

// Permission modes (SPEC E12, R11) and how each is carried out: the agent
// is switched to a mode that asks the client before anything risky (so no
// decision is left to the agent's own automatic review, which is another
// model call), and every session/request_permission is answered by the kind
// of option the mode calls for.
const (
	ApproveAll   = "approve-all"
	ApproveReads = "approve-reads"
	DenyAll      = "deny-all"
)

// Agents the driver knows (SPEC E12: pi is refused before launch).
const (
	AgentCodex  = provenv.AgentCodex
	AgentClaude = "claude"
)

// AgentMode is the agent session mode a permission mode runs in, "" when
// the agent's default is kept.
//
//	codex-acp:        approve-all → workspace-write (sandboxed commands run,
//	                  escalations ask and are approved); approve-reads and
//	                  deny-all → read-only (writes fail in the sandbox,
//	                  escalations ask). The default mode `agent` would send
//	                  escalations to an automatic review model call instead.
//	claude-agent-acp: every mode → default ("Manual": every tool asks;
//	                  the answer carries the permission mode). Its default
//	                  `auto` decides by a classifier, and acceptEdits was
//	                  seen to run file-system commands (mkdir) unasked.
func AgentMode(agent, permissionMode string) string {
	switch agent {
	case AgentCodex:
		if permissionMode == ApproveAll {
			return "workspace-write"
		}
		return "read-only"
	case AgentClaude:
		return "default"
	}
	return ""
}

// Option is one choice of a session/request_permission.
type Option struct {
	OptionID string `json:"optionId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"` // allow_once | allow_always | reject_once | reject_always
}

// Decision is the answer to one permission request: the option selected,
// or none (OptionID "": the request is answered cancelled).
type Decision struct {
	Allow      bool
	OptionID   string
	OptionKind string
}

// readKinds are the ACP tool kinds approve-reads allows.
var readKinds = map[string]bool{"read": true, "search": true}

// Decide answers a permission request for a tool call of toolKind under
// permissionMode, by option kind, never by option id (ids differ between
// agents: codex "allow_once"/"cancel", claude "allow-once"/"reject"). A
// one-time option is preferred to a standing one, so a decision never
// outlives the request. An allow with no allow option, or a reject with no
// reject option, is answered cancelled (nothing selected). An unknown mode
// rejects.
func Decide(permissionMode, toolKind string, options []Option) Decision {
	allow := permissionMode == ApproveAll || (permissionMode == ApproveReads && readKinds[toolKind])
	prefs := []string{"reject_once", "reject_always"}
	if allow {
		prefs = []string{"allow_once", "allow_always"}
	}
	for _, kind := range prefs {
		for _, o := range options {
			if o.Kind == kind {
				return Decision{Allow: allow, OptionID: o.OptionID, OptionKind: o.Kind}
			}
		}
	}
	return Decision{}
}
