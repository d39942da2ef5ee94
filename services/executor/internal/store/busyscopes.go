package store

import (
	"sync"
	"time"
)

// busyScopes are the session scopes whose latest submission through this
// store queued behind an unfinished run of the scope, and when (SPEC P1).
// SubmitClaim sends a first attach's reads only when the run may be
// claimed: a submission into a scope that was busy a moment ago will most
// likely queue too, and PostgreSQL's cost of the nine gated reads (a
// statement's bind, executor start and end, even when its one-time filter
// skips the read) was ≈ 40 % of its CPU per queued SubmitRun. The memory is
// only a guess: a run it wrongly keeps from its reads is claimed as usual
// and its driver reads them after the claim (one round trip more before
// its first attach); one it wrongly reads for costs what every submission
// cost before.
type busyScopes struct {
	mu sync.Mutex
	// at is when a submission last queued behind each scope's unfinished
	// run, for at most maxBusyScopes scopes.
	at map[string]time.Time
	// memory is how long a queued submission marks its scope busy
	// (busyScopeMemory when zero).
	memory time.Duration
}

// busyScopeMemory is how long a queued submission marks its scope busy: a
// burst of submissions into a busy session (a client sending turns while
// one runs) is remembered; a session whose queued turns ran since is read
// for again, at the latest this long after its last queued submission.
const busyScopeMemory = time.Second

// maxBusyScopes bounds the scopes remembered.
const maxBusyScopes = 8192

func (b *busyScopes) window() time.Duration {
	if b.memory > 0 {
		return b.memory
	}
	return busyScopeMemory
}

// busy tells whether a submission queued behind scope sc's unfinished run
// within the memory before now.
func (b *busyScopes) busy(sc string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.at[sc]
	return ok && now.Sub(at) < b.window()
}

// queued records that a submission queued behind scope sc's unfinished run
// at now.
func (b *busyScopes) queued(sc string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at == nil {
		b.at = make(map[string]time.Time)
	}
	if _, ok := b.at[sc]; !ok && len(b.at) >= maxBusyScopes {
		w := b.window()
		for k, at := range b.at {
			if now.Sub(at) >= w {
				delete(b.at, k)
			}
		}
		if len(b.at) >= maxBusyScopes {
			clear(b.at)
		}
	}
	b.at[sc] = now
}

// idle records that a submission into scope sc headed it (nothing of the
// scope was unfinished).
func (b *busyScopes) idle(sc string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.at, sc)
}
