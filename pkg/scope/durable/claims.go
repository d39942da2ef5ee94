package durable

import (
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// Claims is the in-process registry of per-scope supervisor claims. A claim
// is taken before the durable root is prepared and before the backend is
// constructed, and held until the run releases it, so a second run of the
// same scope — even one arriving while the first is still constructing its
// backend — is refused with native_session_supervisor_busy. The zero value is
// ready to use; it is safe for concurrent use.
type Claims struct {
	mu   sync.Mutex
	held map[string]string // scope root name -> run id
}

// Acquire claims scope for runID. The returned release is idempotent and
// frees the claim only if it is still this claim.
func (c *Claims) Acquire(scopeRoot, runID string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if holder, ok := c.held[scopeRoot]; ok {
		return nil, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
			"session scope %s is claimed by run %s; run %s must wait", scopeRoot, holder, runID)
	}
	if c.held == nil {
		c.held = map[string]string{}
	}
	c.held[scopeRoot] = runID
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.held[scopeRoot] == runID {
				delete(c.held, scopeRoot)
			}
		})
	}, nil
}

// Holder returns the run holding scope's claim, if any.
func (c *Claims) Holder(scopeRoot string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.held[scopeRoot]
	return r, ok
}

// ToolBinding is what a tool call executes under: the run that owns the
// scope's current tool authority epoch.
type ToolBinding struct {
	CompanyID           string
	IssueID             string
	RunID               string
	AgentID             string
	NormalizedSessionID string
}

// Epochs keeps one tool authority epoch per scope. Beginning a new epoch (a
// new backend for the scope, e.g. a continuation run) revokes the previous
// one. The zero value is ready to use; it is safe for concurrent use.
type Epochs struct {
	mu      sync.Mutex
	current map[string]*ToolAuthority
	next    map[string]uint64
}

// ToolAuthority is one epoch's tool authority.
type ToolAuthority struct {
	epochs  *Epochs
	scope   string
	epoch   uint64
	binding ToolBinding
}

// Begin starts a new epoch for scope bound to b, revoking the previous one.
func (e *Epochs) Begin(scopeRoot string, b ToolBinding) *ToolAuthority {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current == nil {
		e.current, e.next = map[string]*ToolAuthority{}, map[string]uint64{}
	}
	e.next[scopeRoot]++
	t := &ToolAuthority{epochs: e, scope: scopeRoot, epoch: e.next[scopeRoot], binding: b}
	e.current[scopeRoot] = t
	return t
}

// Epoch is this authority's epoch number (1, 2, … per scope).
func (t *ToolAuthority) Epoch() uint64 { return t.epoch }

// Binding returns the run binding a tool call executes under, or
// native_tool_authority_epoch_revoked when a later epoch took the scope or
// this one was revoked.
func (t *ToolAuthority) Binding() (ToolBinding, error) {
	t.epochs.mu.Lock()
	cur := t.epochs.current[t.scope]
	t.epochs.mu.Unlock()
	if cur != t {
		return ToolBinding{}, failure.New(codes.FailedPrecondition, failure.NativeToolAuthorityEpochRevoked,
			"tool authority epoch %d of run %s for session scope %s was revoked", t.epoch, t.binding.RunID, t.scope)
	}
	return t.binding, nil
}

// Revoke ends this epoch if it is still current (e.g. when tool definitions
// failed to load or the backend could not be built).
func (t *ToolAuthority) Revoke() {
	t.epochs.mu.Lock()
	defer t.epochs.mu.Unlock()
	if t.epochs.current[t.scope] == t {
		delete(t.epochs.current, t.scope)
	}
}
