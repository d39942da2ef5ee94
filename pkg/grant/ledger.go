package grant

import (
	"sync"
	"time"
)

// Ledger makes grants usable once (SPEC T4): a gateway spends every grant
// it accepts and refuses one it has spent before, for as long as the grant
// could still be valid (its expiry). A grant without an id cannot be told
// apart from its copies and is refused.
type Ledger struct {
	clock func() time.Time

	mu    sync.Mutex
	spent map[string]int64 // grant id -> its expiry (Unix ms)
	prune int              // size at which expired ids are dropped next
}

// NewLedger returns an empty Ledger reading clock (time.Now when nil).
func NewLedger(clock func() time.Time) *Ledger {
	if clock == nil {
		clock = time.Now
	}
	return &Ledger{clock: clock, spent: map[string]int64{}, prune: 1024}
}

// Spend records c's grant as used, or refuses it (gateway_grant_invalid)
// when it was used before or has no id.
func (l *Ledger) Spend(c *Claims) error {
	if c.ID == "" {
		return invalid("the grant has no id: a grant is usable once, and this one cannot be told from its copies")
	}
	now := l.clock().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	if exp, ok := l.spent[c.ID]; ok && exp > now {
		return invalid("the grant was already used: a grant authorizes one call")
	}
	if len(l.spent) >= l.prune {
		for id, exp := range l.spent {
			if exp <= now {
				delete(l.spent, id)
			}
		}
		l.prune = max(1024, 2*len(l.spent))
	}
	l.spent[c.ID] = c.ExpiresAt
	return nil
}
