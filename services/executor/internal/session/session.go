// Package session holds the executor's warm-session supervision decisions
// (SPEC E10): whether a run reuses the live provider session of its scope,
// rehydrates it under a fresh run authority, replaces it because its pinned
// configuration changed, or must wait because the scope is busy; and when an
// idle session is closed. Decisions are pure functions of their inputs
// (time is passed in); Registry applies them to an in-memory table and hands
// the sessions to close back to the caller, so nothing here blocks on I/O or
// runs timers.
//
// The registry key is the full session scope (scope.Key.RootName()), which
// includes the company, agent, workspace and provider: equal normalized
// session ids in different companies never share a session.
package session

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
)

// Close reasons, verbatim.
const (
	ReasonIdleTimeout      = "warm native session idle timeout"
	ReasonConfigChanged    = "warm native session configuration changed"
	ReasonAuthorityRotated = "warm native session authority epoch rotated"
	ReasonFailed           = "warm native session failed"
	// ReasonReplaced: an operator's ReplaceSession gave the provider thread
	// up; the run that applies it starts a fresh provider session (SPEC F3).
	ReasonReplaced = "warm native session replaced by operator"
	// ReasonCheckpoint: a warm session idle past the executor's
	// -checkpoint-after (shorter than its idle timeout) was suspended for
	// a verified checkpoint (SPEC F3).
	ReasonCheckpoint = "warm native session checkpoint after a settled run"
)

// EventContinuityBreak is the control event of the run that applied a
// ReplaceSession decision: a legitimate break of the scope's provider
// thread, not a violation (tetherctl audit lists it as such).
const EventContinuityBreak = prp.EventSessionContinuityBreak

// Entry is the registry's record of a scope's warm session.
type Entry struct {
	// Scope is the full session scope root name (the registry key).
	Scope        string
	CompanyID    string
	ConfigDigest string
	// RunID is the run that holds (busy) or last held the session.
	RunID string
	Busy  bool
	// IdleDeadline is when an idle session is closed; zero while busy.
	IdleDeadline time.Time
}

// Request is a run asking for its scope's warm session.
type Request struct {
	Scope        string
	CompanyID    string
	ConfigDigest string
	RunID        string
	// Runnerd is true when sessions run under runnerd: a live handle is then
	// never handed to another run; it is closed and the session is
	// rehydrated from its checkpoint under the new run's authority.
	Runnerd bool
	Now     time.Time
}

// RequestFor builds the request of a run from its scope parameters.
func RequestFor(p scope.Params, runnerd bool, now time.Time) Request {
	return Request{Scope: p.Key().RootName(), CompanyID: p.CompanyID, ConfigDigest: p.ConfigDigest(),
		RunID: p.RunID, Runnerd: runnerd, Now: now}
}

// Action is what the run does with its scope's session.
type Action string

const (
	// ActionStart: no live session of this scope; start one (from a
	// checkpoint of this config digest when there is one).
	ActionStart Action = "start"
	// ActionReuse: the idle live session is handed to this run.
	ActionReuse Action = "reuse"
	// ActionRehydrate: the live handle is closed (authority epoch rotated)
	// and the session is rehydrated from its checkpoint, re-bound to this run.
	ActionRehydrate Action = "rehydrate"
	// ActionReplace: the pinned configuration changed; the idle session is
	// closed and a new one started (a checkpoint of the old digest is
	// ignored).
	ActionReplace Action = "replace"
)

// Decision is the outcome of Decide.
type Decision struct {
	Action Action
	// CloseReason is the reason the existing session must be closed with
	// before the run proceeds; empty when it is kept (reuse) or there is none.
	CloseReason string
	// LoadCheckpoint says whether a persisted checkpoint may be loaded (it is
	// still filtered by config digest, see RehydrateCheckpoint).
	LoadCheckpoint bool
}

// Decide is the warm-session decision for req given the scope's current
// entry (nil when there is none). A busy entry refuses with
// native_session_supervisor_busy, whatever the config digest. An entry of
// another scope or company is never shared or closed.
func Decide(existing *Entry, req Request) (Decision, error) {
	if existing == nil || existing.Scope != req.Scope || existing.CompanyID != req.CompanyID {
		return Decision{Action: ActionStart, LoadCheckpoint: true}, nil
	}
	if existing.Busy {
		return Decision{}, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
			"warm session of scope %s is busy with run %s", req.Scope, existing.RunID)
	}
	if IdleExpired(*existing, req.Now) {
		return Decision{Action: ActionStart, CloseReason: ReasonIdleTimeout, LoadCheckpoint: true}, nil
	}
	if existing.ConfigDigest != req.ConfigDigest {
		return Decision{Action: ActionReplace, CloseReason: ReasonConfigChanged, LoadCheckpoint: true}, nil
	}
	if req.Runnerd {
		return Decision{Action: ActionRehydrate, CloseReason: ReasonAuthorityRotated, LoadCheckpoint: true}, nil
	}
	return Decision{Action: ActionReuse}, nil
}

// IdleExpired reports whether an idle entry's deadline has passed at now.
func IdleExpired(e Entry, now time.Time) bool {
	return !e.Busy && !e.IdleDeadline.IsZero() && !now.Before(e.IdleDeadline)
}

// Released is the entry after its run ended at now: on success it becomes
// idle until now+idle (keep = true); on failure it is removed and its
// session closed with ReasonFailed.
func Released(e Entry, ok bool, now time.Time, idle time.Duration) (next Entry, keep bool, closeReason string) {
	if !ok {
		return Entry{}, false, ReasonFailed
	}
	if idle <= 0 {
		idle = scope.DefaultIdleTimeout
	}
	e.Busy = false
	e.IdleDeadline = now.Add(idle)
	return e, true, ""
}

// CheckpointIdentity is the run identity a checkpoint is bound to.
type CheckpointIdentity struct {
	RunID     string `json:"runId"`
	SessionID string `json:"sessionId"`
	CompanyID string `json:"companyId"`
	IssueID   string `json:"issueId"`
	AgentID   string `json:"agentId"`
}

// Checkpoint is a warm session's persisted snapshot (the part the decisions
// need).
type Checkpoint struct {
	ConfigDigest      string             `json:"configDigest"`
	Identity          CheckpointIdentity `json:"identity"`
	ProviderSessionID string             `json:"providerSessionId"`
	// Turn-scoped state, cleared when another run rehydrates the session.
	ActiveTurnID   string `json:"activeTurnId,omitempty"`
	SemanticResult string `json:"semanticResult,omitempty"`
	Terminal       bool   `json:"terminal,omitempty"`
}

// RehydrateCheckpoint returns the checkpoint re-bound to run: nil (start a
// fresh provider session) when there is none or it was taken under another
// config digest; native_session_supervisor_checkpoint_mismatch when it
// belongs to another session, company or agent; otherwise a copy carrying
// run's run and issue ids with turn-scoped state cleared.
func RehydrateCheckpoint(cp *Checkpoint, configDigest string, run CheckpointIdentity) (*Checkpoint, error) {
	if cp == nil || cp.ConfigDigest != configDigest {
		return nil, nil
	}
	if cp.Identity.SessionID != run.SessionID || cp.Identity.CompanyID != run.CompanyID || cp.Identity.AgentID != run.AgentID {
		return nil, failure.New(codes.FailedPrecondition, failure.NativeSessionSupervisorCheckpointMismatch,
			"warm checkpoint belongs to session %q of company %q agent %q", cp.Identity.SessionID, cp.Identity.CompanyID, cp.Identity.AgentID)
	}
	out := *cp
	out.Identity.RunID, out.Identity.IssueID = run.RunID, run.IssueID
	out.ActiveTurnID, out.SemanticResult, out.Terminal = "", "", false
	return &out, nil
}

// Closing is a session the caller must close with Reason.
type Closing[S any] struct {
	Session S
	Reason  string
}

// Acquired is the outcome of Registry.Acquire.
type Acquired[S any] struct {
	Decision
	// Session is the reused session (ActionReuse only).
	Session S
	// Closing lists sessions to close, in order, before proceeding.
	Closing []Closing[S]
}

type slot[S any] struct {
	Entry
	session    S
	hasSession bool
}

// Registry applies the decisions to the warm sessions of one executor. It is
// safe for concurrent use. A run's entry is reserved busy from Acquire until
// Release, so a concurrent run of the same scope is busy even before the
// first has a session.
type Registry[S any] struct {
	mu      sync.Mutex
	entries map[string]*slot[S]
}

// Acquire decides for req and applies the decision: the scope's entry is
// (re)reserved busy for req.RunID and any session to close is removed and
// returned.
func (r *Registry[S]) Acquire(req Request) (Acquired[S], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[string]*slot[S]{}
	}
	k := key(req.Scope, req.CompanyID)
	cur := r.entries[k]
	var existing *Entry
	if cur != nil {
		existing = &cur.Entry
	}
	d, err := Decide(existing, req)
	if err != nil {
		return Acquired[S]{}, err
	}
	out := Acquired[S]{Decision: d}
	if cur != nil && d.CloseReason != "" && cur.hasSession {
		out.Closing = append(out.Closing, Closing[S]{Session: cur.session, Reason: d.CloseReason})
	}
	next := &slot[S]{Entry: Entry{Scope: req.Scope, CompanyID: req.CompanyID, ConfigDigest: req.ConfigDigest,
		RunID: req.RunID, Busy: true}}
	if d.Action == ActionReuse {
		next.session, next.hasSession = cur.session, cur.hasSession
		out.Session = cur.session
	}
	r.entries[k] = next
	return out, nil
}

// key is the registry key: the scope root name already includes the company;
// keying by company as well keeps companies apart even for a caller that
// passes a weaker scope name.
func key(scopeRoot, companyID string) string { return companyID + "\x00" + scopeRoot }

// Attach records the session run req.RunID opened for its scope (onSession).
// It is ignored when the scope is no longer reserved for that run.
func (r *Registry[S]) Attach(req Request, s S) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.entries[key(req.Scope, req.CompanyID)]
	runID := req.RunID
	if cur == nil || cur.RunID != runID || !cur.Busy {
		return false
	}
	cur.session, cur.hasSession = s, true
	return true
}

// Release ends run req.RunID's use of its scope at now. On success the
// session stays idle until now+idle; on failure (or when the run never
// attached a session) the entry is removed and its session returned to close.
// A release by a run that no longer holds the scope changes nothing.
func (r *Registry[S]) Release(req Request, ok bool, now time.Time, idle time.Duration) []Closing[S] {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key(req.Scope, req.CompanyID)
	cur := r.entries[k]
	if cur == nil || cur.RunID != req.RunID || !cur.Busy {
		return nil
	}
	next, keep, reason := Released(cur.Entry, ok, now, idle)
	if keep && cur.hasSession {
		cur.Entry = next
		return nil
	}
	delete(r.entries, k)
	if cur.hasSession {
		return []Closing[S]{{Session: cur.session, Reason: reason}}
	}
	return nil
}

// Expire removes every idle session whose deadline passed at now and returns
// them to close with ReasonIdleTimeout.
func (r *Registry[S]) Expire(now time.Time) []Closing[S] {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Closing[S]
	for k, s := range r.entries {
		if IdleExpired(s.Entry, now) {
			delete(r.entries, k)
			if s.hasSession {
				out = append(out, Closing[S]{Session: s.session, Reason: ReasonIdleTimeout})
			}
		}
	}
	return out
}

// NextDeadline is the earliest idle deadline, for scheduling Expire.
func (r *Registry[S]) NextDeadline() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t time.Time
	for _, s := range r.entries {
		if !s.Busy && !s.IdleDeadline.IsZero() && (t.IsZero() || s.IdleDeadline.Before(t)) {
			t = s.IdleDeadline
		}
	}
	return t, !t.IsZero()
}

// Lookup returns the entry of a company's scope.
func (r *Registry[S]) Lookup(scopeRoot, companyID string) (Entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.entries[key(scopeRoot, companyID)]; s != nil {
		return s.Entry, true
	}
	return Entry{}, false
}
