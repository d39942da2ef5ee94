// Package backoff is the one exponential backoff of tether's retry loops:
// a delay that doubles from Min up to Max, optionally spread by jitter, and
// a sleep that ends early when its context does.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff. The zero value is not useful; set Min
// and Max. It is not safe for concurrent use.
type Backoff struct {
	// Min is the first delay and the delay after Reset.
	Min time.Duration
	// Max bounds the delay.
	Max time.Duration
	// Jitter spreads each delay uniformly over [d/2, d], so that many
	// clients retrying together do not stay in step.
	Jitter bool

	cur time.Duration
}

// Next returns the delay to wait now and doubles the following one (up to
// Max).
func (b *Backoff) Next() time.Duration {
	d := b.Peek()
	b.cur = min(d*2, b.Max)
	if b.Jitter {
		return Jittered(d)
	}
	return d
}

// Peek returns the delay Next would be based on, without advancing.
func (b *Backoff) Peek() time.Duration {
	if b.cur <= 0 {
		return b.Min
	}
	return b.cur
}

// Reset returns the delay to Min (after a success).
func (b *Backoff) Reset() { b.cur = b.Min }

// Jittered is a uniformly random delay in [d/2, d].
func Jittered(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d or until ctx ends; it reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
