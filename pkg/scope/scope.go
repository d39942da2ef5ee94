// Package scope derives a session's scope key: the digest that names a
// runner's durable state root and the warm-session registry entry. Two runs
// share a scope only when company, agent, workspace identity, provider and
// normalized session id all match; run and issue ids are never part of it.
package scope

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Schema versions the key's layout.
const Schema = "tether.session-scope.v1"

// Key is the canonical scope of a session.
type Key struct {
	Schema              string   `json:"schema"`
	CompanyID           string   `json:"companyId"`
	AgentID             string   `json:"agentId"`
	Workspace           string   `json:"workspace"`
	Provider            Provider `json:"provider"`
	NormalizedSessionID string   `json:"normalizedSessionId"`
}

// Provider is the provider part of the scope.
type Provider struct {
	Kind  string `json:"kind"`
	Agent string `json:"agent"`
}

// FromInput builds the key of an execution input. A run without an execution
// workspace id is scoped to its working directory (transient workspace).
func FromInput(in *prpv1.ExecutionInput) Key {
	ws := in.GetBinding().GetExecutionWorkspaceId()
	if ws == "" {
		ws = "transient:" + in.GetWorkspace().GetCwd()
	} else {
		ws = "managed:" + ws
	}
	return Key{
		Schema:              Schema,
		CompanyID:           in.GetBinding().GetCompanyId(),
		AgentID:             in.GetBinding().GetAgentId(),
		Workspace:           ws,
		Provider:            Provider{Kind: in.GetProvider().GetKind(), Agent: in.GetProvider().GetAgent()},
		NormalizedSessionID: in.GetSession().GetNormalizedSessionId(),
	}
}

// Digest is the lowercase hex sha256 of the key's canonical JSON (struct
// fields in fixed order, no whitespace).
func (k Key) Digest() string {
	b, err := json.Marshal(k)
	if err != nil {
		panic(err) // only strings: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Of is FromInput(in).Digest().
func Of(in *prpv1.ExecutionInput) string { return FromInput(in).Digest() }
