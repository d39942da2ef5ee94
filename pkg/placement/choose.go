package placement

// This file is the placement decision (SPEC F2): among the active gateways
// whose labels satisfy the run's placement labels and that have room, the
// least loaded relative to its capacity. It is pure; the executor's store
// applies it in the transaction that records the placement.

// Candidate is an active gateway that may take a new placement.
type Candidate struct {
	ID       string
	Labels   map[string]string
	Capacity int
	// Load is what the gateway holds now: the sessions it announced in its
	// last heartbeat plus the scopes placed on it since (a burst of
	// placements between two heartbeats counts at once).
	Load int
}

// Outcome is a placement decision.
type Outcome struct {
	// GatewayID is the chosen gateway; empty when none fits.
	GatewayID string
	// Matching counts the candidates whose labels satisfy the wanted ones
	// (all full when GatewayID is empty and Matching > 0).
	Matching int
}

// Choose picks, among the candidates whose labels satisfy want and whose
// load is below their capacity, the one with the lowest load relative to
// capacity; ties go to the one with more free sessions, then to the lower
// id (so every replica decides alike).
func Choose(cs []Candidate, want map[string]string) Outcome {
	var out Outcome
	var best *Candidate
	for i := range cs {
		c := &cs[i]
		if !Satisfies(c.Labels, want) {
			continue
		}
		out.Matching++
		if c.Capacity <= 0 || c.Load >= c.Capacity {
			continue
		}
		if best == nil || better(c, best) {
			best = c
		}
	}
	if best != nil {
		out.GatewayID = best.ID
	}
	return out
}

// better orders a before b: a lower load ratio (compared without division),
// more free sessions, a lower id.
func better(a, b *Candidate) bool {
	ra, rb := int64(max(a.Load, 0))*int64(b.Capacity), int64(max(b.Load, 0))*int64(a.Capacity)
	if ra != rb {
		return ra < rb
	}
	if fa, fb := a.Capacity-a.Load, b.Capacity-b.Load; fa != fb {
		return fa > fb
	}
	return a.ID < b.ID
}
