package placement

import "time"

// MaxDeferDelay caps how long a run that cannot be placed (no capacity, its
// gateway lost, its scope moving) waits between claims: a returning gateway
// or freed capacity is noticed within it.
const MaxDeferDelay = 5 * time.Second

// DeferDelay is how long a run handed back to the queue unplaced waits
// before its next claim, given how long it has been waiting for the same
// reason: the poll interval at first, then a quarter of the time waited so
// far, at most MaxDeferDelay (or the poll interval, when that is longer).
// A run waiting half an hour for a lost gateway (SPEC F7) is then claimed
// every few seconds, not every poll.
func DeferDelay(poll, waited time.Duration) time.Duration {
	d := max(waited/4, poll)
	return min(d, max(MaxDeferDelay, poll))
}
