package authz

import (
	"context"
	"sync"
)

// companyCacheSize bounds the companies of runs and interactions an
// Authorizer remembers.
const companyCacheSize = 1 << 16

// companies remembers the company of stored runs and interactions: it
// never changes once stored (rows are never deleted nor moved to another
// company), so the lookup before a call on a known run costs no database
// round trip. Unknown ids are not remembered (they may be stored later).
type companies struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *companies) get(ctx context.Context, key string, lookup func(context.Context) (string, error)) (string, error) {
	c.mu.Lock()
	company, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return company, nil
	}
	company, err := lookup(ctx)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= companyCacheSize {
		c.m = map[string]string{}
	}
	c.m[key] = company
	return company, nil
}
