package authz

import (
	"context"
	"sync"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// companyCacheSize bounds the companies of runs and interactions an
// Authorizer remembers.
const companyCacheSize = 1 << 16

// companies remembers the company (and a run's key) of stored runs and
// interactions: it never changes once stored (rows are never deleted nor
// moved to another company, and a company's run id names one run), so the
// lookup before a call on a known run costs no database round trip.
// Unknown ids are not remembered (they may be stored later).
type companies struct {
	mu sync.Mutex
	m  map[string]store.ResolvedRun
}

func (c *companies) get(ctx context.Context, key string, lookup func(context.Context) (store.ResolvedRun, error)) (store.ResolvedRun, error) {
	c.mu.Lock()
	company, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return company, nil
	}
	company, err := lookup(ctx)
	if err != nil {
		return store.ResolvedRun{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= companyCacheSize {
		c.m = map[string]store.ResolvedRun{}
	}
	c.m[key] = company
	return company, nil
}
